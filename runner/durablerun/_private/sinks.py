"""Progress sinks: where an attempt reports what it is doing.

A sink subclasses :class:`ProgressSink` and overrides the callbacks it cares
about. Callbacks run on the attempt's event loop thread, synchronously: keep
them fast (buffer and ship from a thread of your own if a call can block,
as a Kubernetes status sink must). An exception in a sink is logged and
otherwise ignored; it never changes the run.
"""

from __future__ import annotations

import json
import logging
import sys
import threading
from datetime import UTC, datetime
from decimal import Decimal
from typing import IO, Any

from durablerun._private.model import AttemptResult, RunStarted
from durablerun.api import format_time

log = logging.getLogger("durablerun")


class ProgressSink:
    """Base class with a no-op for every progress event."""

    def run_started(self, *, info: RunStarted) -> None:
        """The attempt loaded the journal and is about to run the workflow."""

    def step_started(self, *, position: str, name: str, attempt: int) -> None:
        """A step is about to execute (``attempt`` counts retries from 1)."""

    def step_completed(
        self, *, position: str, name: str, seq: int, ok: bool, duration: float
    ) -> None:
        """A step's outcome was journaled at sequence ``seq`` (``ok`` False: it failed)."""

    def checkpoint_saved(self, *, seq: int, key: str) -> None:
        """A journal record (or a snapshot covering up to ``seq``) is durable at ``key``."""

    def cost_updated(self, *, usd: Decimal, tokens: int, steps: int) -> None:
        """The run's journaled totals changed."""

    def continued_as_new(self, *, generation: int, seq: int) -> None:
        """``ctx.continue_as_new`` journaled its record at ``seq``; ``generation`` starts."""

    def total_steps_updated(self, *, total: int | None, steps: int) -> None:
        """The workflow declared the run's expected steps (``ctx.set_total_steps``); ``steps``
        are journaled so far."""

    def heartbeat(self, *, time: datetime) -> None:
        """The attempt is alive (every ``EngineConfig.heartbeat_interval``)."""

    def warning(self, message: str) -> None:
        """Something the operator of the run should know; the run goes on."""

    def run_finished(self, *, result: AttemptResult) -> None:
        """The attempt ended with ``result.outcome`` (completed, failed, aborted, ...)."""


class SinkSet(ProgressSink):
    """Fans every callback out to several sinks, shielding the run from their errors."""

    def __init__(self, sinks: list[ProgressSink]) -> None:
        self.sinks = list(sinks)

    def _each(self, method: str, *args: Any, **kwargs: Any) -> None:
        if not self.sinks:
            return
        for sink in self.sinks:
            try:
                getattr(sink, method)(*args, **kwargs)
            except Exception:
                log.exception("progress sink %r failed in %s", sink, method)

    def run_started(self, *, info: RunStarted) -> None:
        self._each("run_started", info=info)

    def step_started(self, *, position: str, name: str, attempt: int) -> None:
        self._each("step_started", position=position, name=name, attempt=attempt)

    def step_completed(
        self, *, position: str, name: str, seq: int, ok: bool, duration: float
    ) -> None:
        self._each("step_completed", position=position, name=name, seq=seq, ok=ok,
                   duration=duration)

    def checkpoint_saved(self, *, seq: int, key: str) -> None:
        self._each("checkpoint_saved", seq=seq, key=key)

    def cost_updated(self, *, usd: Decimal, tokens: int, steps: int) -> None:
        self._each("cost_updated", usd=usd, tokens=tokens, steps=steps)

    def continued_as_new(self, *, generation: int, seq: int) -> None:
        self._each("continued_as_new", generation=generation, seq=seq)

    def total_steps_updated(self, *, total: int | None, steps: int) -> None:
        self._each("total_steps_updated", total=total, steps=steps)

    def heartbeat(self, *, time: datetime) -> None:
        self._each("heartbeat", time=time)

    def warning(self, message: str) -> None:
        log.warning("%s", message)
        self._each("warning", message)

    def run_finished(self, *, result: AttemptResult) -> None:
        self._each("run_finished", result=result)


class JsonLinesSink(ProgressSink):
    """Writes one JSON object per progress event to a stream or file.

    Each line has ``time`` (ISO 8601, UTC) and ``event`` plus the event's
    fields, e.g. ``{"time": "...", "event": "step_completed", "position": "3",
    "name": "plan", "seq": 5, "ok": true, "duration": 0.41}``.
    """

    def __init__(self, target: IO[str] | str | None = None, *, checkpoints: bool = False) -> None:
        self._own = isinstance(target, str)
        self._stream: IO[str] = (
            open(target, "a", encoding="utf-8")  # noqa: SIM115 - closed in close()
            if isinstance(target, str)
            else (target or sys.stderr)
        )
        self._checkpoints = checkpoints
        self._lock = threading.Lock()

    def _emit(self, event: str, **fields: Any) -> None:
        line = {"time": format_time(datetime.now(UTC), precise=True), "event": event}
        line.update(fields)
        text = json.dumps(line, default=str, separators=(",", ":"))
        with self._lock:
            self._stream.write(text + "\n")
            self._stream.flush()

    def run_started(self, *, info: RunStarted) -> None:
        self._emit("run_started", run=info.run, attempt=info.attempt_id,
                   replayed=info.journal_records, resumed=info.resumed,
                   generation=info.generation)

    def step_started(self, *, position: str, name: str, attempt: int) -> None:
        self._emit("step_started", position=position, name=name, attempt=attempt)

    def step_completed(
        self, *, position: str, name: str, seq: int, ok: bool, duration: float
    ) -> None:
        self._emit("step_completed", position=position, name=name, seq=seq, ok=ok,
                   duration=duration)

    def checkpoint_saved(self, *, seq: int, key: str) -> None:
        if self._checkpoints:
            self._emit("checkpoint_saved", seq=seq, key=key)

    def cost_updated(self, *, usd: Decimal, tokens: int, steps: int) -> None:
        self._emit("cost_updated", usd=str(usd), tokens=tokens, steps=steps)

    def continued_as_new(self, *, generation: int, seq: int) -> None:
        self._emit("continued_as_new", generation=generation, seq=seq)

    def total_steps_updated(self, *, total: int | None, steps: int) -> None:
        self._emit("total_steps", total=total, steps=steps)

    def heartbeat(self, *, time: datetime) -> None:
        self._emit("heartbeat")

    def warning(self, message: str) -> None:
        self._emit("warning", message=message)

    def run_finished(self, *, result: AttemptResult) -> None:
        self._emit("run_finished", outcome=result.outcome.value, message=result.message,
                   abort_reason=result.abort_reason.value if result.abort_reason else None)

    def close(self) -> None:
        if self._own:
            self._stream.close()
