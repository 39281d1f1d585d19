"""Showing a run from its store: ``durablerun inspect``, ``durablerun list``'s outcomes and
``kubectl durablerun journal``."""

from __future__ import annotations

import json
import sys
from datetime import UTC, datetime
from typing import Any

from durablerun import relations
from durablerun._private.records import layout
from durablerun._private.records.model import (
    CompleteRecord,
    ContinueRecord,
    EventRecord,
    ResultRecord,
    StepRecord,
)
from durablerun._private.storage.owner import Holder, read_owner
from durablerun._private.storage.stores import RunInfo, Store
from durablerun._private.tools import reruns
from durablerun.api import Outcome


def last_outcome(info: RunInfo) -> tuple[str, str]:
    """The run's last recorded outcome: a short label and a sentence."""
    status = info.status or {}
    outcome = status.get("outcome")
    if not outcome:
        return ("-", "none recorded: an attempt is running now, or was killed before it ended "
                     "(resume it to carry on)")
    label = str(outcome)
    if status.get("abortReason"):
        label += f" ({status['abortReason']})"
    text = f"{label}: {status.get('message', '')}"
    recorded = status.get("journalRecords")
    if isinstance(recorded, int) and recorded < info.journal_records:
        return ("-", f"none recorded for the latest attempt (it journaled records {recorded}.."
                     f"{info.journal_records - 1}, so it is running now or was killed); the "
                     f"attempt before it ended {text}")
    return label, text


def _fmt_time(at: Any) -> str:
    if not at:
        return "-"
    return datetime.fromtimestamp(float(at), UTC).strftime("%H:%M:%S.%f")[:-3]


def print_result(store: Store, ref: layout.RunRef) -> int:
    rs = store.run_store(ref)
    try:
        records = rs.load().records
        done = records[-1] if records and isinstance(records[-1], CompleteRecord) else None
        if done is None:
            print(f"run {ref} has no result: it has not completed", file=sys.stderr)
            return 1
        body = rs.get_blob(done.ref) if done.ref is not None else done.inline_json()
    finally:
        rs.close()
    print(json.dumps(json.loads(body), indent=2, ensure_ascii=False))
    return 0


def _children(store: Store, ref: layout.RunRef, requests: dict[str, dict[str, Any]]) -> list[dict[str, Any]]:
    """The child runs a local run asked for (durablerun run kept its requests: durablerun._private.engine.family),
    each with its last outcome."""
    children = []
    for child, request in requests.items():
        run = layout.RunRef.local(relations.child_run_name(ref.name, child))
        status = store.run_store(run).read_status() or {}
        children.append({"name": child, "run": str(run), "workflow": request.get("workflow"),
                         "outcome": status.get("outcome"), "usd": (status.get("cost") or {}).get("usd")})
    return children


def inspect_run(store: Store, ref: layout.RunRef, *, as_json: bool = False, show_all: bool = False,
                result: bool = False) -> int:
    """Print a run's journal (or with ``result``, its result) as `durablerun inspect` does (also
    `kubectl durablerun journal`)."""
    store.check()
    info = store.read_run(run=ref)
    if not info.exists:
        print(f"no run {ref} in {store.uri}", file=sys.stderr)
        return 1
    if result:
        return print_result(store, ref)
    rs = store.run_store(ref)
    try:
        loaded = rs.load()
        records = rs.read_all() if show_all else loaded.records
        history, archives = reruns.read_history(rs), reruns.read_archives(rs)
        children = _children(store, ref, rs.read_child_requests())
    finally:
        rs.close()
    cont = loaded.continuation
    generation = cont.gen if cont is not None else 0
    rows = []
    for r in records:
        step = r if isinstance(r, StepRecord) else None
        row: dict[str, Any] = {
            "seq": r.seq, "position": r.pos, "kind": r.kind, "name": r.name,
            "ok": r.ok if isinstance(r, StepRecord | EventRecord) else None,
            "attempts": step.attempts if step else None, "duration": step.dur if step else None,
            "at": r.at, "usd": str(r.cost.usd) if r.cost else None,
            "tokens": r.cost.tokens if r.cost else None,
            "ref": r.ref if isinstance(r, ResultRecord) else None,
            "error": (step.error or {}).get("message") if step else None}
        if isinstance(r, ContinueRecord):
            row["generation"] = r.gen
        rows.append(row)
    status = info.status or {}
    owner = read_owner(store.backend, ref)
    if as_json:
        print(json.dumps({
            "run": info.run, "store": store.describe(), "manifest": info.manifest,
            "totals": info.totals.to_json(), "journalRecords": info.journal_records,
            "snapshotSeq": info.snapshot_seq, "completed": info.completed,
            "generation": generation, "generationStart": loaded.base,
            "status": status, "events": info.events, "records": rows, "owner": owner,
            "history": history, "archives": [{"path": p, "objects": n} for p, n in archives.items()],
            "children": children,
        }, indent=2, default=str))
        return 0
    m = info.manifest
    print(f"run       {info.run}   ({store.uri})")
    print(f"workflow  {m.get('workflow')}   code {m.get('code_version')}   "
          f"started {m.get('created')}")
    print(f"outcome   {last_outcome(info)[1]}")
    if owner:
        who = Holder.from_json(owner.get("holder")).describe()
        print(f"owner     {'released by' if owner.get('released') else 'held by'} {who}, last renewed "
              f"{owner.get('renewTime')} (store lease {owner.get('durationSeconds')}s)")
    w = status.get("waitingFor")
    if status.get("outcome") == Outcome.WAITING and w:
        if w.get("event"):
            print(f"waiting   for event {w['event']!r} since {w.get('since')} "
                  f"(deadline {w.get('deadline') or 'none'})")
        else:
            print(f"waiting   until {w.get('wakeTime')}")
    t = info.totals
    total = status.get("totalSteps")
    steps = f"{t.steps}/{total}" if total else str(t.steps)
    print(f"totals    ${t.usd}   {t.tokens} tokens   {steps} steps   "
          f"{info.journal_records} journal records   snapshot at "
          f"{info.snapshot_seq if info.snapshot_seq is not None else '-'}")
    if generation:
        shown = ("all records below" if show_all else
                 f"records {loaded.base}.. below; --all shows the earlier ones")
        print(f"generation {generation} (ctx.continue_as_new {generation} time(s)); it starts "
              f"at record {loaded.base}: {shown}")
    if info.events:
        print(f"events    {', '.join(info.events)}")
    for child in children:
        cost = f", ${child['usd']}" if child["usd"] else ""
        print(f"child     {child['name']}: run {child['run']} ({child['workflow']}), "
              f"{child['outcome'] or 'not started'}{cost}")
    for fact in history:
        print(f"history   {reruns.describe_fact(fact)}")
    for path, count in archives.items():
        print(f"archive   {path} ({count} objects, under the run's root {ref.path}/)")
    print()
    names = []
    for row in rows:
        name = str(row["name"] or "")
        if row.get("generation"):
            name += f" -> generation {row['generation']}"
        if row["ref"]:
            name += f" [ref {row['ref']['size']:,}B]"
        names.append(name if len(name) <= 60 else name[:57] + "...")
    width = max([4, *map(len, names)])
    pos_width = max([3, *(len(str(row["position"])) for row in rows)])
    header = (f"{'seq':>5} {'pos':<{pos_width}} {'kind':<8} {'name':<{width}} {'ok':<4} "
              f"{'tries':>5} {'secs':>8} {'usd':>9} {'at (UTC)':<12}")
    print(header)
    print("-" * len(header))
    for row, name in zip(rows, names, strict=True):
        ok = {True: "yes", False: "NO", None: ""}[row["ok"]]
        dur = f"{row['duration']:.3f}" if isinstance(row["duration"], int | float) else ""
        print(f"{row['seq']:>5} {row['position']!s:<{pos_width}} {row['kind']!s:<8} "
              f"{name:<{width}} {ok:<4} {row['attempts'] or '':>5} {dur:>8} "
              f"{row['usd'] or '':>9} {_fmt_time(row['at']):<12}")
        if row["error"]:
            print(f"{'':>15}error: {row['error'][:100]}")
    gaps, gathers = _unrecorded_positions(rows)
    if gathers:
        print(f"\npositions {', '.join(gathers)}: ctx.gather of coroutines, which journals no "
              "record of its own; branch b's operations are numbered <gather>.b.n")
    if gaps:
        print(f"\npositions {', '.join(gaps)}: no record. A ctx.gather takes a position and "
              "journals nothing itself (the steps it gathers are numbered where they were "
              "called); an operation still running when the attempt ended has no record yet")
    return 0


def _unrecorded_positions(rows: list[dict[str, Any]]) -> tuple[list[str], list[str]]:
    """Positions that hold no record: gaps, and gathers whose branches hold records."""
    taken: dict[tuple[str, tuple[int, ...]], set[int]] = {}
    gathers: list[str] = []
    for row in rows:
        pos = str(row["position"])
        if row["kind"] in ("patch", "continue", "complete") or pos == "end":
            continue
        gen, _, local = pos.rpartition("/")
        try:
            t = tuple(int(p) for p in local.split("."))
        except ValueError:
            continue
        head = f"{gen}/" if gen else ""
        for j in range(0, len(t), 2):
            taken.setdefault((head, t[:j]), set()).add(t[j])
            if j + 1 < len(t):
                gather = head + ".".join(map(str, t[: j + 1]))
                if gather not in gathers:
                    gathers.append(gather)
    gaps = []
    for (head, scope), indices in taken.items():
        for i in range(max(indices) + 1):
            if i not in indices:
                gaps.append(head + ".".join(map(str, (*scope, i))))
    return gaps, gathers
