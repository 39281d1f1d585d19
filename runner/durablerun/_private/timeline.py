"""A run's steps over time, from its journal: ``durablerun timeline`` and ``kubectl durablerun timeline``.

Every record carries the attempt that wrote it (``w``) and when (``at``); a step's record its duration
(``dur``), attempts and cost. From those: each step's start, duration, attempt and cost; sleeps and waits
as gaps with their reason; a restart wherever the writer changes; the slowest and the most expensive step
marked. :func:`build` makes the data (``--output json`` prints it), :func:`render` draws it.
"""

from __future__ import annotations

import json
import sys
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from decimal import Decimal
from typing import IO, Any

from durablerun import api
from durablerun._private.layout import RunRef
from durablerun._private.model import (
    CompleteRecord,
    ContinueRecord,
    EventRecord,
    Record,
    SleepRecord,
    StepRecord,
    WaitRecord,
)
from durablerun._private.stores import Store
from durablerun.api import format_time, parse_time

BAR = 32  # columns of the time bar


@dataclass
class Entry:
    """One line of the timeline. ``start`` and ``end`` are Unix seconds."""

    kind: str  # step, sleep, wait, restart, continue, complete
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


def build(run: str, records: Sequence[Record], *, now: float | None = None) -> Timeline:
    """The timeline of ``records`` (a run's journal, in order). ``now`` ends a wait still open."""
    entries: list[Entry] = []
    writers: list[str] = []
    waits: dict[str, WaitRecord] = {}
    last_at: float | None = None
    for r in records:
        if r.w and (not writers or writers[-1] != r.w):
            if writers and last_at is not None:
                entries.append(Entry("restart", f"attempt {len(writers) + 1}", last_at, r.at,
                                     attempt=len(writers) + 1,
                                     reason=f"attempt {len(writers) + 1} ({r.w}) resumed the run"))
            writers.append(r.w)
        attempt = max(1, len(writers))
        usd, tokens = (str(r.cost.usd), r.cost.tokens) if r.cost else ("0", 0)
        if isinstance(r, StepRecord):
            error = (r.error or {}).get("type", "")
            entries.append(Entry("step", r.name, r.at - r.dur, r.at, r.pos, attempt, max(0, r.attempts - 1), r.ok,
                                 usd, tokens, reason="" if r.ok else f"failed: {error}"))
        elif isinstance(r, SleepRecord):
            wake = parse_time(r.wake_at).timestamp()
            entries.append(Entry("sleep", "sleep", r.at, max(r.at, wake), r.pos, attempt,
                                 reason=f"sleeping until {r.wake_at}"))
        elif isinstance(r, WaitRecord):
            waits[r.pos] = r
        elif isinstance(r, EventRecord):
            began = waits.pop(r.pos, None)
            reason = f"waited for event {r.name!r}" + ("" if r.ok else " (timed out)")
            entries.append(Entry("wait", r.name, began.at if began else r.at, r.at, r.pos, attempt, reason=reason))
        elif isinstance(r, ContinueRecord):
            entries.append(Entry("continue", "continue_as_new", r.at, r.at, r.pos, attempt,
                                 reason=f"generation {r.gen} starts"))
        elif isinstance(r, CompleteRecord):
            entries.append(Entry("complete", "result", r.at, r.at, r.pos, attempt, usd=usd, tokens=tokens))
        last_at = r.at
    for w in waits.values():
        until = f" (deadline {w.deadline})" if w.deadline else ""
        end = max(w.at, now if now is not None else w.at)
        entries.append(Entry("wait", w.name, w.at, end, w.pos, max(1, len(writers)),
                             reason=f"waiting for event {w.name!r}{until}"))
    entries.sort(key=lambda e: (e.start, e.end))
    steps = [e for e in entries if e.kind == "step"]
    if steps:
        max(steps, key=lambda e: e.duration).marks.append("slowest")
        costly = max(steps, key=lambda e: (Decimal(e.usd), e.tokens))
        if Decimal(costly.usd) > 0 or costly.tokens > 0:
            costly.marks.append("most expensive")
    totals = records[-1].totals if records else None
    return Timeline(run, entries, writers, str(totals.usd) if totals else "0", totals.tokens if totals else 0)


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
    glyph = {"step": "█", "sleep": "·", "wait": "░", "restart": "x", "continue": "│", "complete": "│"}
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


def show(store: Store, ref: RunRef, *, as_json: bool = False, out: IO[str] | None = None) -> int:
    """Print run ``ref``'s timeline from ``store``; 1 when there is no such run."""
    out = out or sys.stdout
    store.check()
    if not store.read_run(run=ref).exists:
        print(f"no run {ref} in {store.uri}", file=sys.stderr)
        return 1
    rs = store.run_store(ref)
    try:
        records = rs.load().records
    finally:
        rs.close()
    timeline = build(ref.key, records, now=time.time())
    if as_json:
        print(json.dumps(timeline.to_json(), indent=2), file=out)
    else:
        render(timeline, out)
    return 0
