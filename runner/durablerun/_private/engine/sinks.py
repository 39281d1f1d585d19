"""Progress: where an attempt reports what it is doing.

One event type (:class:`ProgressEvent`: a kind and its fields) and one call,
``emit``. A sink subclasses :class:`ProgressSink` and overrides either
``emit`` (every event, one object) or the methods named after the event kinds
it cares about (the default ``emit`` calls them). Sinks run on the attempt's
event loop thread, synchronously: keep them fast (buffer and ship from a
thread of your own if a call can block, as a Kubernetes status sink must). An
exception in a sink is logged and otherwise ignored; it never changes the run.
"""

from __future__ import annotations

import enum
import json
import logging
import sys
import threading
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from decimal import Decimal
from typing import IO, Any

from durablerun._private.records.model import AttemptResult, Record, RunStarted
from durablerun.api import format_time

log = logging.getLogger("durablerun")


class EventKind(enum.StrEnum):
    """What happened; each kind's fields are the keyword arguments of its ProgressSink method."""

    #: ``info`` (RunStarted): the attempt loaded the journal and is about to run the workflow.
    RUN_STARTED = "run_started"
    #: ``position``, ``name``, ``attempt`` (counts retries from 1): a step is about to execute.
    STEP_STARTED = "step_started"
    #: ``position``, ``name``, ``seq``, ``ok``, ``duration``: a step's outcome is journaled at ``seq``.
    STEP_COMPLETED = "step_completed"
    #: ``position``, ``name``, ``attempt``, ``delay`` (seconds), ``error`` (one line): attempt ``attempt`` of a step
    #: raised; it runs again after ``delay``.
    STEP_RETRYING = "step_retrying"
    #: ``position``, ``name``, ``attempts``, ``traceback`` (the step function's own frames): a step failed for good
    #: (after its retries, or a NonRetryableError); its failure is journaled.
    STEP_FAILED = "step_failed"
    #: ``seq``, ``key``: a journal record (or a snapshot covering up to ``seq``) is durable at ``key``.
    CHECKPOINT_SAVED = "checkpoint_saved"
    #: ``record`` (model.Record): a journal record is durable (a step's outcome, a sleep, a wait, an event, ...).
    RECORD_JOURNALED = "record_journaled"
    #: ``usd``, ``tokens``, ``steps``: the run's journaled totals changed.
    COST_UPDATED = "cost_updated"
    #: ``generation``, ``seq``: ``ctx.continue_as_new`` journaled its record; ``generation`` starts.
    CONTINUED_AS_NEW = "continued_as_new"
    #: ``total``, ``steps``: the workflow declared its expected steps (``ctx.set_total_steps``).
    TOTAL_STEPS_UPDATED = "total_steps_updated"
    #: ``time``: the attempt is alive (every ``EngineConfig.heartbeat_interval``).
    HEARTBEAT = "heartbeat"
    #: ``message``: something the operator of the run should know; the run goes on.
    WARNING = "warning"
    #: ``result`` (AttemptResult): the attempt ended (completed, failed, aborted, waiting, ...).
    RUN_FINISHED = "run_finished"


@dataclass(frozen=True, slots=True)
class ProgressEvent:
    """One progress event: its kind and its fields (see :class:`EventKind`)."""

    kind: EventKind
    fields: dict[str, Any]

    def to_json(self) -> dict[str, Any]:
        """The event as :class:`JsonLinesSink` writes it (without the time stamp)."""
        f = self.fields
        if self.kind is EventKind.RUN_STARTED:
            info: RunStarted = f["info"]
            return {"event": "run_started", "run": info.run, "attempt": info.attempt_id,
                    "replayed": info.journal_records, "resumed": info.resumed,
                    "generation": info.generation}
        if self.kind is EventKind.RUN_FINISHED:
            result: AttemptResult = f["result"]
            return {"event": "run_finished", "outcome": result.outcome.value,
                    "message": result.message,
                    "abort_reason": result.abort_reason.value if result.abort_reason else None}
        if self.kind is EventKind.HEARTBEAT:
            return {"event": "heartbeat"}
        if self.kind is EventKind.TOTAL_STEPS_UPDATED:
            return {"event": "total_steps", **f}
        return {"event": self.kind.value, **f}


_WARNING = EventKind.WARNING  # looked up once: emit runs several times per step


class ProgressSink:
    """Receives progress events. Override :meth:`emit`, or the methods named after event kinds."""

    def emit(self, event: ProgressEvent) -> None:
        """Receive one event; by default, call the method named after its kind with its fields."""
        getattr(self, event.kind.value)(**event.fields)

    def run_started(self, *, info: RunStarted) -> None:
        """The attempt loaded the journal and is about to run the workflow."""

    def step_started(self, *, position: str, name: str, attempt: int) -> None:
        """A step is about to execute (``attempt`` counts retries from 1)."""

    def step_completed(
        self, *, position: str, name: str, seq: int, ok: bool, duration: float
    ) -> None:
        """A step's outcome was journaled at sequence ``seq`` (``ok`` False: it failed)."""

    def step_retrying(self, *, position: str, name: str, attempt: int, delay: float, error: str) -> None:
        """Attempt ``attempt`` of a step raised ``error``; the step runs again in ``delay`` seconds."""

    def step_failed(self, *, position: str, name: str, attempts: int, traceback: str) -> None:
        """A step failed for good after ``attempts`` attempts; ``traceback`` is the step function's own."""

    def checkpoint_saved(self, *, seq: int, key: str) -> None:
        """A journal record (or a snapshot covering up to ``seq``) is durable at ``key``."""

    def record_journaled(self, *, record: Record) -> None:
        """A journal record is durable: what the attempt did, as a resume will read it."""

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


class SinkSet:
    """The attempt's sinks: one ``emit`` fans an event out, shielding the run from their errors.

    Who receives a kind is decided once, here: a sink overriding ``emit`` gets every event, as one
    :class:`ProgressEvent`; any other sink only the kinds whose methods it overrides, called directly. A kind
    nobody receives costs one lookup: a step emits five events, and most sinks want one or two of them.
    """

    def __init__(self, sinks: list[ProgressSink]) -> None:
        self.sinks = list(sinks)
        self._receivers: dict[EventKind, list[tuple[ProgressSink, Callable[..., None] | None]]] = {
            kind: [(sink, None if _overrides(sink, "emit") else getattr(sink, kind.value)) for sink in self.sinks
                   if _overrides(sink, "emit") or _overrides(sink, kind.value)]
            for kind in EventKind}

    def emit(self, kind: EventKind, **fields: Any) -> None:
        if kind is _WARNING:
            log.warning("%s", fields["message"])
        receivers = self._receivers[kind]
        if not receivers:
            return
        event: ProgressEvent | None = None
        for sink, method in receivers:
            try:
                if method is not None:
                    method(**fields)
                else:
                    if event is None:
                        event = ProgressEvent(kind, fields)
                    sink.emit(event)
            except Exception:
                log.exception("progress sink %r failed in %s", sink, kind.value)


def _overrides(sink: ProgressSink, method: str) -> bool:
    return getattr(type(sink), method) is not getattr(ProgressSink, method)


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

    def emit(self, event: ProgressEvent) -> None:
        if event.kind is EventKind.RECORD_JOURNALED or (
                event.kind is EventKind.CHECKPOINT_SAVED and not self._checkpoints):
            return  # a record's durability is the checkpoint_saved line
        line = {"time": format_time(datetime.now(UTC), precise=True), **event.to_json()}
        text = json.dumps(line, default=str, separators=(",", ":"))
        with self._lock:
            self._stream.write(text + "\n")
            self._stream.flush()

    def close(self) -> None:
        if self._own:
            self._stream.close()
