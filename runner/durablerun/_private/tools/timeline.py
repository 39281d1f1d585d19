"""A run's steps over time, from its journal: ``durablerun timeline`` and ``kubectl durablerun timeline``.

Every record carries the attempt that wrote it (``w``) and when (``at``); a step's record its duration
(``dur``), attempts and cost. From those: each step's start, duration, attempt and cost; sleeps and waits
as gaps with their reason (and the cost their records carry: every record's cost is on some row, so the rows
add up to the run's); wherever the writer changes, a restart, a resume (after a wait or a sleep) or a rerun;
the slowest and the most expensive step marked. :func:`build` makes the data (``--output json`` prints it),
:func:`render` draws it.
"""

from __future__ import annotations

import bisect
import json
import sys
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from decimal import Decimal
from typing import IO, Any

from durablerun import api
from durablerun._private.records.layout import RunRef
from durablerun._private.records.model import (
    CompleteRecord,
    ContinueRecord,
    EngineConfig,
    EventRecord,
    Record,
    SleepRecord,
    StepRecord,
    WaitRecord,
)
from durablerun._private.storage.journal import RunStore
from durablerun._private.storage.stores import Store
from durablerun._private.tools import reruns
from durablerun.api import format_time, parse_time

BAR = 32  # columns of the time bar


@dataclass
class Entry:
    """One line of the timeline. ``start`` and ``end`` are Unix seconds."""

    #: step, sleep, wait, restart, resume, rerun (NEW_ATTEMPT_KINDS), continue, complete, cost (charged outside
    #: steps, on no other row)
    kind: str
    name: str
    start: float
    end: float
    position: str = ""
    #: 1 for the run's first attempt, counting every writer of the journal.
    attempt: int = 1
    retries: int = 0
    ok: bool = True
    usd: str = "0"
    tokens: int = 0
    #: Why the run stood still (sleeps, waits, restarts).
    reason: str = ""
    marks: list[str] = field(default_factory=list)
    #: A restart's causes (RestartReason values, in order), from the run's Events (:func:`restart_causes`).
    causes: list[str] = field(default_factory=list)
    #: The journal position of the record that ended this entry (-1: a wait still open). A page of a long
    #: journal keeps the entries its positions end.
    seq: int = -1

    @property
    def duration(self) -> float:
        return max(0.0, self.end - self.start)


@dataclass
class Timeline:
    run: str
    entries: list[Entry]
    attempts: list[str]
    usd: str
    tokens: int

    @property
    def start(self) -> float:
        return min((e.start for e in self.entries), default=0.0)

    @property
    def end(self) -> float:
        return max((e.end for e in self.entries), default=0.0)

    def to_json(self) -> dict[str, Any]:
        entries = []
        for e in self.entries:
            doc = asdict(e)
            doc["start"] = format_time(e.start, precise=True)
            doc["end"] = format_time(e.end, precise=True)
            doc["duration"] = round(e.duration, 6)
            entries.append(doc)
        return {"run": self.run, "traceID": api.trace_id(self.run),
                "start": format_time(self.start, precise=True) if self.entries else None,
                "end": format_time(self.end, precise=True) if self.entries else None,
                "attempts": self.attempts, "cost": {"usd": self.usd, "tokens": self.tokens}, "entries": entries}


def build(run: str, records: Sequence[Record], *, now: float | None = None, first_attempt: int = 1,
          history: Sequence[dict[str, Any]] = ()) -> Timeline:
    """The timeline of ``records`` (a run's journal, in order). ``now`` ends a wait still open.
    ``first_attempt`` is the attempt that wrote ``records[0]`` (a page of a journal starts past the first).
    ``history``: the run's recorded facts (``reruns.read_history``): a rerun's next attempt is drawn as one."""
    entries: list[Entry] = []
    writers: list[str] = []
    waits: dict[str, WaitRecord] = {}
    last: Record | None = None
    for r in records:
        if r.w and (not writers or writers[-1] != r.w):
            if writers and last is not None:
                n = first_attempt + len(writers)
                kind, reason = _new_attempt(n, r, last, history)
                entries.append(Entry(kind, f"attempt {n}", last.at, r.at, attempt=n, reason=reason, seq=r.seq))
            writers.append(r.w)
        attempt = first_attempt - 1 + max(1, len(writers))
        usd, tokens = (str(r.cost.usd), r.cost.tokens) if r.cost else ("0", 0)
        if isinstance(r, StepRecord):
            error = (r.error or {}).get("type", "")
            entries.append(Entry("step", r.name, r.at - r.dur, r.at, r.pos, attempt, max(0, r.attempts - 1), r.ok,
                                 usd, tokens, reason="" if r.ok else f"failed: {error}", seq=r.seq))
        elif isinstance(r, SleepRecord):
            wake = parse_time(r.wake_at).timestamp()
            entries.append(Entry("sleep", "sleep", r.at, max(r.at, wake), r.pos, attempt, usd=usd, tokens=tokens,
                                 reason=f"sleeping until {r.wake_at}", seq=r.seq))
        elif isinstance(r, WaitRecord):
            waits[r.pos] = r
        elif isinstance(r, EventRecord):
            began = waits.pop(r.pos, None)
            reason = f"waited for event {r.name!r}" + ("" if r.ok else " (timed out)")
            usd, tokens = _plus(usd, tokens, began)
            entries.append(Entry("wait", r.name, began.at if began else r.at, r.at, r.pos, attempt, usd=usd,
                                 tokens=tokens, reason=reason, seq=r.seq))
        elif isinstance(r, ContinueRecord):
            entries.append(Entry("continue", "continue_as_new", r.at, r.at, r.pos, attempt, usd=usd, tokens=tokens,
                                 reason=f"generation {r.gen} starts", seq=r.seq))
        elif isinstance(r, CompleteRecord):
            entries.append(Entry("complete", "result", r.at, r.at, r.pos, attempt, usd=usd, tokens=tokens,
                                 seq=r.seq))
        elif r.cost is not None:  # a record drawn as no row (ctx.uuid, ctx.patched): its cost gets one
            entries.append(Entry("cost", "add_cost", r.at, r.at, r.pos, attempt, usd=usd, tokens=tokens,
                                 reason=OUTSIDE_STEPS, seq=r.seq))
        last = r
    for w in waits.values():
        until = f" (deadline {w.deadline})" if w.deadline else ""
        end = max(w.at, now if now is not None else w.at)
        usd, tokens = _plus("0", 0, w)
        entries.append(Entry("wait", w.name, w.at, end, w.pos, first_attempt - 1 + max(1, len(writers)),
                             usd=usd, tokens=tokens, reason=f"waiting for event {w.name!r}{until}"))
    entries.sort(key=lambda e: (e.start, e.end))
    _mark([e for e in entries if e.kind == "step"])
    totals = records[-1].totals if records else None
    return Timeline(run, entries, writers, str(totals.usd) if totals else "0", totals.tokens if totals else 0)


#: The kinds of row a new attempt makes: ``restart`` when the last one ended unplanned (a crash, a kill, a lost
#: lease, a disruption: red in the run browser), ``resume`` when it ended to wait or sleep without a pod (or a
#: person suspended it, as the run's Events say) and a new one picked the run up, ``rerun`` when someone cut
#: the journal back to a step (``durablerun rerun``) and a new attempt executes it again.
NEW_ATTEMPT_KINDS = ("restart", "resume", "rerun")
#: A sleep longer than this ends its attempt (EngineConfig.inline_sleep_max's default; a run that set it lower
#: shows a resume after a shorter sleep as a restart, unless the run's Events say otherwise).
INLINE_SLEEP_MAX = EngineConfig().inline_sleep_max.total_seconds()
#: The operator's Events that say a new attempt was planned (``restart_causes`` reads them).
PLANNED = (api.Phase.SUSPENDED.value, "Resumed", "EventReceived", "BudgetRaised", "Retrying")


def _new_attempt(n: int, first: Record, last: Record, history: Sequence[dict[str, Any]]) -> tuple[str, str]:
    """The kind and reason of the row where attempt ``n`` wrote ``first``, the record after ``last``."""
    who = f"attempt {n} ({first.w})"
    cut = next((f for f in history if f.get("action") == "rerun" and f.get("fromSeq") == first.seq), None)
    if cut is not None:
        return "rerun", (f"{who} reran the run from step {cut.get('fromStep')!r}, cut back by {cut.get('by', '?')} "
                         f"at {cut.get('time', '?')}")
    if isinstance(last, WaitRecord) and isinstance(first, EventRecord) and first.pos == last.pos:
        # The attempt ended waiting, and the next one began by taking the event in (or the wait's timeout).
        return "resume", f"{who} resumed the run after its wait for event {last.name!r}"
    if isinstance(last, SleepRecord) and parse_time(last.wake_at).timestamp() - last.at > INLINE_SLEEP_MAX:
        # Too long to sleep in process: the attempt ended with it, and the next one began after the wake time.
        return "resume", f"{who} resumed the run after its sleep until {last.wake_at}"
    return "restart", f"{who} resumed the run"


#: Why a row that is no step carries a cost: ``ctx.add_cost`` outside a step is journaled with the record that
#: follows it (a resume replays the call, so it is counted once), whatever that record is.
OUTSIDE_STEPS = "cost charged outside a step since the record before"


def _plus(usd: str, tokens: int, record: Record | None) -> tuple[str, int]:
    """``usd`` and ``tokens`` plus ``record``'s cost (a wait's row carries its wait record's and its event's)."""
    if record is None or record.cost is None:
        return usd, tokens
    return str(Decimal(usd) + record.cost.usd), tokens + record.cost.tokens


#: Seconds an Event's time may fall outside the gap between two attempts' records and still be that restart's:
#: Events carry whole seconds, and the operator posts one a moment after it saw the pod end.
EVENT_SLACK = 2.0


def restart_causes(entries: Sequence[Entry], events: Sequence[tuple[float, str, str]]) -> None:
    """Name each new attempt's cause on its row from the run's Events (``(time, reason, message)``) posted
    between the last record of one attempt and the first of the next: the operator's ``Restarting`` Events
    (message ``<RestartReason>: <why>``) make it a restart, all of them named (a crash, then a lease lapse before
    anything was journaled); a restart the journal could not tell apart is a resume when the Events say it was
    planned (a suspension lifted, a retry) and none says it restarted.

    Each Event is one attempt's: the nearest's. Two attempts can be within the slack of one Event (a crash, and
    a wait the restarted attempt reached a second later), and a crash drawn on both would make the resume after
    the wait a second crash."""
    attempts = [entry for entry in entries if entry.kind in NEW_ATTEMPT_KINDS]
    within: list[list[tuple[float, str, str]]] = [[] for _ in attempts]
    for event in sorted(events):
        near = [(max(entry.start - event[0], event[0] - entry.end, 0.0), i) for i, entry in enumerate(attempts)]
        distance, nearest = min(near, default=(EVENT_SLACK + 1, -1))
        if distance <= EVENT_SLACK:
            within[nearest].append(event)
    for entry, mine in zip(attempts, within, strict=True):
        found = [(at, message) for at, reason, message in mine if reason == api.EVENT_RESTARTING]
        planned = [message for _, reason, message in mine if reason in PLANNED]
        if found:
            entry.kind = "restart" if entry.kind == "resume" else entry.kind  # it crashed on its way to the wait
            entry.causes = [message.split(":", 1)[0] for _, message in found]
            entry.reason = "; then ".join(message for _, message in found) + f"; {entry.reason}"
        elif entry.kind == "restart" and planned:
            entry.kind = "resume"
            entry.reason = "; then ".join(planned) + f"; {entry.reason}"


def kubernetes_events(items: Sequence[dict[str, Any]]) -> list[tuple[float, str, str]]:
    """``(time, reason, message)`` of Kubernetes Events (core/v1 ``items``), for :func:`restart_causes`."""
    out = []
    for item in items:
        when = item.get("lastTimestamp") or item.get("eventTime") or item.get("firstTimestamp")
        if when:
            out.append((parse_time(when).timestamp(), str(item.get("reason") or ""), str(item.get("message") or "")))
    return out


#: Records read before a page, to find where a wait that ends on the page began (a wait ended further on
#: than this from its start shows from its end only) and the attempt before the page's first record.
LOOKBACK = 64


class Attempts:
    """Which attempt wrote a journal position, without reading the journal whole.

    Each attempt's records are one contiguous block (a new attempt fences the old one out), so the
    attempts before a position are the changes of writer before it, found by bisecting between
    positions whose writers differ: O(restarts x log(records)) reads of one record each, remembered.
    """

    def __init__(self, rs: RunStore) -> None:
        self.rs = rs
        self.writers: dict[int, str] = {}
        self.known = [0]  # positions whose attempt is known (sorted), and those attempts
        self.ordinals = {0: 1}

    def note(self, records: Sequence[Record]) -> None:
        for r in records:
            self.writers[r.seq] = r.w

    def _writer(self, seq: int) -> str:
        if seq not in self.writers:
            self.note(self.rs.read_range(seq, seq + 1))
        return self.writers.get(seq, "")

    def _changes(self, low: int, high: int) -> int:
        if high <= low or self._writer(low) == self._writer(high):
            return 0
        if high == low + 1:
            return 1
        middle = (low + high) // 2
        return self._changes(low, middle) + self._changes(middle, high)

    def ordinal(self, seq: int) -> int:
        """The attempt (from 1) that wrote record ``seq``: counted on from the nearest position known before it."""
        if seq not in self.ordinals:
            before = self.known[bisect.bisect_right(self.known, seq) - 1]
            self.ordinals[seq] = self.ordinals[before] + self._changes(before, seq)
            bisect.insort(self.known, seq)
        return self.ordinals[seq]


def page(rs: RunStore, run: str, offset: int, size: int, *, now: float,
         attempts: Attempts | None = None, count_attempts: bool = True,
         history: Sequence[dict[str, Any]] = ()) -> tuple[Timeline, dict[str, Any]]:
    """The entries that records ``offset`` to ``offset + size`` of the journal end, and the whole run's
    facts (``total`` records, ``start``, ``end``, ``attempts``: with ``count_attempts``, else 0 (a
    DurableRun's status counts them)): O(size) records read, never the journal.

    The bars place each entry within the whole run. A wait still open shows on the last page; the
    slowest and most expensive marks are the page's own.
    """
    attempts = attempts or Attempts(rs)
    total = rs.count()
    end = min(total, offset + size)
    first = max(0, offset - LOOKBACK)
    records = rs.read_range(first, end) if offset < total else []
    attempts.note(records)
    built = build(run, records, now=now, first_attempt=attempts.ordinal(first) if records else 1, history=history)
    last_page = end >= total
    entries = [e for e in built.entries if offset <= e.seq < end or (e.seq < 0 and last_page)]
    steps = [e for e in entries if e.kind == "step"]
    for e in entries:
        e.marks.clear()
    _mark(steps)
    whole: dict[str, Any] = {"total": total, "start": None, "end": None, "attempts": 0, "usd": "0", "tokens": 0}
    if total:
        head = records[:1] if first == 0 and records else rs.read_range(0, 1)
        tail = records[-1:] if last_page and records else rs.read_range(total - 1, total)
        attempts.note(tail)
        open_waits = [e.end for e in entries if e.seq < 0]
        whole.update(start=build(run, head).start, end=max([build(run, tail, now=now).end, *open_waits]),
                     attempts=attempts.ordinal(total - 1) if count_attempts else 0,
                     usd=str(tail[-1].totals.usd), tokens=tail[-1].totals.tokens)
    return Timeline(run, entries, built.attempts, whole["usd"], whole["tokens"]), whole


def _seconds(s: float) -> str:
    if s < 1:
        return f"{s * 1000:.0f}ms"
    if s < 120:
        return f"{s:.1f}s"
    if s < 7200:
        return f"{s / 60:.1f}m"
    if s < 172800:
        return f"{s / 3600:.1f}h"
    return f"{s / 86400:.1f}d"


def _mark(steps: list[Entry]) -> None:
    """Mark the slowest and the most expensive step, where one stands out: a mark on one of several steps
    that took the same time (as shown, to the tenth of a second) or cost the same would point at nothing."""
    def alone(key: Any) -> Entry | None:
        ranked = sorted(steps, key=key, reverse=True)
        if len(ranked) < 2 or key(ranked[0]) == key(ranked[1]):
            return None
        return ranked[0]

    slowest = alone(lambda e: round(e.duration, 1))
    if slowest is not None:
        slowest.marks.append("slowest")
    costly = alone(lambda e: (Decimal(e.usd), e.tokens))
    if costly is not None and (Decimal(costly.usd) > 0 or costly.tokens > 0):
        costly.marks.append("most expensive")


def render(t: Timeline, out: IO[str] | None = None) -> None:
    """Draw the timeline: one line per entry, a bar placing it within the run's span."""
    out = out or sys.stdout
    if not t.entries:
        print(f"run {t.run}: nothing journaled yet", file=out)
        return
    span = max(t.end - t.start, 1e-6)
    print(f"run {t.run}: {format_time(t.start)} .. {format_time(t.end)} ({_seconds(t.end - t.start)}), "
          f"{len(t.attempts)} attempt(s), ${t.usd}, {t.tokens} tokens; trace {api.trace_id(t.run)}", file=out)
    print(f"{'start':>8} {'took':>7}  {'':{BAR}}  {'att':>3} {'what':<28} {'cost':>9} {'tokens':>7}", file=out)
    glyph = {"step": "█", "sleep": "·", "wait": "░", "restart": "x", "resume": ">", "rerun": "<", "continue": "│",
             "complete": "│", "cost": "$"}
    for e in t.entries:
        first = int((e.start - t.start) / span * (BAR - 1))
        width = max(1, round(e.duration / span * BAR))
        bar = (" " * first + glyph.get(e.kind, "█") * width)[:BAR]
        what = e.name if e.kind == "step" else f"<{e.kind}> {e.name}"
        if e.retries:
            what += f" ({e.retries} retries)"
        cost = f"${Decimal(e.usd):.4f}" if e.usd != "0" else ""
        tokens = str(e.tokens) if e.tokens else ""
        tail = "  ".join(x for x in (e.reason, *(f"<- {m}" for m in e.marks)) if x)
        print(f"+{_seconds(e.start - t.start):>7} {_seconds(e.duration):>7}  {bar:<{BAR}}  {e.attempt:>3} "
              f"{what[:28]:<28} {cost:>9} {tokens:>7}  {tail}".rstrip(), file=out)


def show(store: Store, ref: RunRef, *, as_json: bool = False, out: IO[str] | None = None,
         events: Sequence[tuple[float, str, str]] = ()) -> int:
    """Print run ``ref``'s timeline from ``store``, its restarts' causes from ``events`` (a DurableRun's);
    1 when there is no such run."""
    out = out or sys.stdout
    store.check()
    if not store.read_run(run=ref).exists:
        print(f"no run {ref} in {store.uri}", file=sys.stderr)
        return 1
    rs = store.run_store(ref)
    try:
        records = rs.load().records
        history = reruns.read_history(rs)
    finally:
        rs.close()
    timeline = build(ref.key, records, now=time.time(), history=history)
    restart_causes(timeline.entries, events)
    if as_json:
        print(json.dumps(timeline.to_json(), indent=2), file=out)
    else:
        render(timeline, out)
    return 0
