"""Traces of runs through OpenTelemetry: one trace per run, a span per attempt, a child span per step.

A progress sink (:class:`TracingSink`), on when ``OTEL_EXPORTER_OTLP_TRACES_ENDPOINT`` or
``OTEL_EXPORTER_OTLP_ENDPOINT`` is set (read, with the other settings, by ``api.otlp_traces_endpoint``) and
the ``otel`` extra is installed; the other standard ``OTEL_*`` variables (service name, resource
attributes, sampler, headers, batch queue) are honoured.

Each span is built once, finished, as a tuple (``spanexport.Span``; a step's, nearly every span, as a flat
``spanexport.Step`` whose attributes the child names) and written to a pipe; a child process
(``spanexport``) runs OpenTelemetry's batch processor and OTLP exporter on it. The step's thread pays for a
tuple, a JSON encoding and a write per step, not for the SDK's tracer, context and sampler machinery, nor its
exporter's encoding (bench/RESULTS.md, section 5).

The trace id is a hash of the run's identity (``api.trace_id_of``: the operator computes it too), and an
attempt's span id a hash of the run and the attempt id, so every attempt of a run, in any pod or process,
adds to one trace, and the steps of an attempt killed before it could end its own span still hang under
it: the next attempt finds that attempt's records last in the journal with no outcome recorded, and ends a
span for it.

Exporting never slows or fails the run: a span the pipe cannot take at once is dropped and counted; at the
end of an attempt the child gets ``spanexport.flush_seconds`` to deliver what it holds, and the runner says
how many spans were not delivered. Spans carry names, positions, counts, sizes, times and cost, never a
payload, a result, an error message or a credential (docs/metrics.md, "Traces").
"""

from __future__ import annotations

import hashlib
import importlib.util
import logging
import os
import random
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from decimal import Decimal
from typing import TYPE_CHECKING, Any, Protocol

from durablerun import api
from durablerun._private.engine import replay
from durablerun._private.engine.sinks import ProgressSink
from durablerun._private.records.model import (
    AttemptResult,
    CompleteRecord,
    ContinueRecord,
    EventRecord,
    Record,
    RunStarted,
    SleepRecord,
    StepRecord,
    WaitRecord,
)
from durablerun._private.telemetry import spanexport

if TYPE_CHECKING:
    from opentelemetry.sdk.trace.export import SpanExporter

    from durablerun._private.records.layout import RunRef
    from durablerun._private.storage.stores import Store

log = logging.getLogger("durablerun")

#: Set by the sink of the attempt running in this process: model calls (durablerun.llm) report to it.
_ACTIVE: TracingSink | None = None


def attempt_span_id(run_key: str, attempt_id: str) -> int:
    """The span id of an attempt, so that a later attempt can end the span of one that was killed."""
    digest = hashlib.sha256(f"durablerun/attempt/{run_key}/{attempt_id}".encode()).digest()
    return int.from_bytes(digest[:8], "big") or 1


def sinks_for(store: Store, ref: RunRef, *, attributes: Mapping[str, Any] | None = None,
              env: Mapping[str, str] | None = None, exporter: SpanExporter | None = None) -> list[ProgressSink]:
    """The tracing sink for an attempt of run ``ref``, or none when tracing is off, cannot start, or the
    sampler leaves the run's trace out.

    ``attributes`` describe where the attempt runs (pod, node, epoch). A configuration error is logged
    here, once, and the run goes on without traces. Reads the run's status in ``store`` (one small
    object) to tell whether the attempt before ended with an outcome.
    """
    env = os.environ if env is None else env
    try:
        endpoint = api.otlp_traces_endpoint(env)
    except ValueError as error:
        log.warning("tracing is off for this attempt: %s", error)
        return []
    if endpoint is None and exporter is None:
        return []
    if importlib.util.find_spec("opentelemetry.exporter.otlp.proto.http") is None:
        log.warning("tracing is off for this attempt: an OTLP endpoint is set but OpenTelemetry is not installed; "
                    "install durable-run[otel] (the runner image has it)")
        return []
    if not _sampled(env, api.trace_id_of(ref.key)):
        return []
    rs = store.run_store(ref)
    try:
        status = rs.read_status() or {}
    except Exception as error:  # the run reads the store next and says what is wrong
        log.debug("tracing: could not read the run's status: %s", error)
        status = {}
    finally:
        rs.close()
    trace_id = api.trace_id_of(ref.key)
    try:
        export: Export = (spanexport.start(trace_id, env) if exporter is None
                          else spanexport.InProcess(trace_id, env, exporter))
    except OSError as error:
        log.warning("tracing is off for this attempt: the span exporter could not start: %s", error)
        return []
    return [TracingSink(export, ref.key, attributes=attributes or {},
                        last_finished=str(status.get("attempt") or ""))]


def _sampled(env: Mapping[str, str], trace_id: int) -> bool:
    """The sampler's decision on the run's trace id: every attempt of a run decides alike. An attempt's span
    is a root, so a parent-based sampler decides as its root sampler does."""
    sampler = env.get("OTEL_TRACES_SAMPLER", "parentbased_always_on").strip().lower()
    if sampler.endswith("always_off"):
        return False
    if sampler.endswith("traceidratio"):
        from opentelemetry.sdk.trace.sampling import Decision, TraceIdRatioBased

        ratio = TraceIdRatioBased(float(env.get("OTEL_TRACES_SAMPLER_ARG", "1.0")))
        return ratio.should_sample(None, trace_id, "attempt").decision is Decision.RECORD_AND_SAMPLE
    return True


class Export(Protocol):
    """Where finished spans go: a pipe to the export child (spanexport.SpanPipe), or a processor in this
    process (spanexport.InProcess, tests)."""

    sent: int
    dropped: int

    def send(self, span: spanexport.Span | spanexport.Step) -> None: ...

    def close(self, seconds: float | None = None) -> int: ...


def _ns(seconds: float) -> int:
    return int(seconds * 1e9)


def _span_id() -> int:
    return random.getrandbits(64) or 1


@dataclass(slots=True)
class _Open:
    """A span begun and not yet ended: what it becomes once its end is known."""

    name: str
    span_id: int
    start: int  # ns since the epoch
    attributes: dict[str, Any]
    events: list[list[Any]] = field(default_factory=list)  # [name, time_ns, attributes]


@dataclass(slots=True)
class _Step:
    """A step begun and not yet journaled."""

    name: str
    span_id: int
    start: int  # ns since the epoch
    reexecuted: bool
    retries: tuple[tuple[int, int], ...] = ()  # (time_ns, attempt) each


class TracingSink(ProgressSink):
    """Turns one attempt's progress events into spans of the run's trace.

    A span is built once, finished, when its end is known (a step's when its record is journaled), as a
    tuple for the export child: no tracer, context or sampler call per span, which cost a trivial step most
    of its time (bench/RESULTS.md). The sampler decided once, on the run's trace id (:func:`sinks_for`).
    """

    def __init__(self, export: Export, run_key: str, *, attributes: Mapping[str, Any],
                 last_finished: str) -> None:
        self.export = export
        self.run_key = run_key
        self.attributes = {k: v for k, v in attributes.items() if v is not None}
        self.last_finished = last_finished
        self.attempt: _Open | None = None
        self.steps: dict[str, _Step] = {}
        self.waits: dict[str, float] = {}
        self.delivered: int | None = None  # once the attempt ended
        #: Steps started before this attempt's first journal write, after an attempt killed mid-way: run again.
        self.rerun_window = False

    # --- spans ------------------------------------------------------------------------
    def _export(self, name: str, span_id: int, *, start: int, end: int, attributes: Mapping[str, Any],
                parent: int | None, events: Sequence[Sequence[Any]] = (), error: str | None = None) -> None:
        """One finished span, to the export child."""
        self.export.send((name, span_id, parent or 0, start, max(start, end), attributes, events, error))

    def _end(self, span: _Open, parent: int | None, *, end: int | None = None, error: str | None = None) -> None:
        self._export(span.name, span.span_id, start=span.start, end=time.time_ns() if end is None else end,
                     attributes=span.attributes, parent=parent, events=span.events, error=error)

    def _event(self, name: str, attributes: Mapping[str, Any]) -> None:
        """An event on the attempt's span."""
        if self.attempt is not None:
            self.attempt.events.append([name, time.time_ns(), attributes])

    @property
    def _attempt_id(self) -> int | None:
        return None if self.attempt is None else self.attempt.span_id

    # --- the sink ------------------------------------------------------------------------
    def run_started(self, *, info: RunStarted) -> None:
        global _ACTIVE
        self._close_killed(info.journal)
        self.attempt = _Open("attempt", attempt_span_id(self.run_key, info.attempt_id), time.time_ns(), {
            **self.attributes, "durablerun.run": info.run, "durablerun.attempt.id": info.attempt_id,
            "durablerun.attempt.resumed": info.resumed, "durablerun.journal.replayed_records": info.journal_records,
            "durablerun.generation": info.generation, "durablerun.code_version": info.code_version})
        _ACTIVE = self

    def _close_killed(self, journal: Sequence[Record]) -> None:
        """End the span of the attempt before this one if it wrote the journal last and never ended."""
        for record in journal:
            if isinstance(record, WaitRecord):
                self.waits[record.pos] = record.at
            elif isinstance(record, EventRecord):
                self.waits.pop(record.pos, None)
        if not journal:
            return
        killed = journal[-1].w
        if not killed or killed == self.last_finished:
            return
        first = len(journal) - 1
        while first > 0 and journal[first - 1].w == killed:
            first -= 1
        began = min(r.at - (r.dur if isinstance(r, StepRecord) else 0.0) for r in journal[first:])
        self._export("attempt", attempt_span_id(self.run_key, killed), start=_ns(began), end=_ns(journal[-1].at),
                     parent=None, attributes={"durablerun.run": self.run_key, "durablerun.attempt.id": killed,
                                              "durablerun.attempt.outcome": "Crashed",
                                              "durablerun.attempt.reconstructed": True},
                     error="the attempt ended without recording an outcome (killed, out of memory, node lost); "
                           "this span ends at its last journal write")
        self.rerun_window = True

    def step_started(self, *, position: str, name: str, attempt: int) -> None:
        step = self.steps.get(position)
        if step is not None:
            step.retries += ((time.time_ns(), attempt),)
            return
        self.steps[position] = _Step(name, _span_id(), time.time_ns(), self.rerun_window)

    def record_journaled(self, *, record: Record) -> None:
        attempt = self._attempt_id
        self.rerun_window = False
        if isinstance(record, StepRecord):
            step = self.steps.pop(record.pos, None)
            if step is None:
                if record.error and record.error.get("type") == replay.ABORT_MARK:
                    self._event("abort stopped an operation in a Saga", {
                        "durablerun.step.name": record.name, "durablerun.step.position": record.pos,
                        "durablerun.abort.reason": str(record.error.get("reason", ""))})
                return
            ok, cost = record.ok, record.cost
            self.export.send((
                step.span_id, attempt or 0, step.start, time.time_ns(), step.name, record.pos, record.attempts, ok,
                record.seq, (int(record.ref["size"]) if record.ref else len(record.encoded or b"")) if ok else 0,
                float(cost.usd) if cost else None, cost.tokens if cost else 0,
                None if ok else str((record.error or {}).get("type", "Error")), step.reexecuted, step.retries))
        elif attempt is None:
            return
        elif isinstance(record, SleepRecord):
            wake = api.parse_time(record.wake_at).timestamp()
            self._export("sleep", _span_id(), start=_ns(record.at), end=_ns(wake), parent=attempt, attributes={
                "durablerun.position": record.pos, "durablerun.sleep.until": record.wake_at,
                "durablerun.sleep.seconds": round(wake - record.at, 3)})
        elif isinstance(record, WaitRecord):
            self.waits[record.pos] = record.at
            self._event("wait for event", {"durablerun.event.name": record.name, "durablerun.position": record.pos,
                                           "durablerun.wait.deadline": record.deadline or ""})
        elif isinstance(record, EventRecord):
            began = self.waits.pop(record.pos, record.at)
            self._export(f"wait {record.name}", _span_id(), start=_ns(began), end=_ns(record.at), parent=attempt,
                         attributes={"durablerun.event.name": record.name, "durablerun.position": record.pos,
                                     "durablerun.event.received": record.ok,
                                     "durablerun.event.timed_out": record.timeout,
                                     "durablerun.wait.seconds": round(record.at - began, 3)})
        elif isinstance(record, ContinueRecord):
            self._event("continue_as_new", {"durablerun.generation": record.gen})
        elif isinstance(record, CompleteRecord):
            self._event("workflow completed", {"durablerun.journal.seq": record.seq})

    def model_call(self, *, model: str, input_tokens: int, output_tokens: int, cached_tokens: int,
                   usd: Decimal) -> None:
        frame = replay.STEP.get()
        step = self.steps.get(frame.position) if frame is not None else None
        parent = step.span_id if step is not None else self._attempt_id
        system = _system_of(model)
        attributes: dict[str, Any] = {"gen_ai.operation.name": "chat", "gen_ai.request.model": model,
                                      "gen_ai.usage.input_tokens": input_tokens,
                                      "gen_ai.usage.output_tokens": output_tokens,
                                      "durablerun.cost.usd": float(usd)}
        if system:
            attributes["gen_ai.system"] = system
        if cached_tokens:
            attributes["gen_ai.usage.cache_read.input_tokens"] = cached_tokens
        now = time.time_ns()
        self._export(f"chat {model}", _span_id(), start=now, end=now, parent=parent, attributes=attributes)

    def run_finished(self, *, result: AttemptResult) -> None:
        global _ACTIVE
        if _ACTIVE is self:
            _ACTIVE = None
        attempt = self._attempt_id
        for position, step in self.steps.items():
            attributes: dict[str, Any] = {"durablerun.step.name": step.name, "durablerun.step.position": position,
                                          "durablerun.step.interrupted": True}
            if step.reexecuted:
                attributes["durablerun.step.reexecuted"] = True
            self._export(f"step {step.name}", step.span_id, start=step.start, end=time.time_ns(),
                         attributes=attributes, parent=attempt,
                         events=[["retry", at, {"durablerun.step.attempt": n}] for at, n in step.retries],
                         error=f"the attempt ended ({result.outcome.value}) before this step was journaled; it "
                               "runs again in the next attempt")
        self.steps.clear()
        span = self.attempt
        if span is not None:
            a = span.attributes
            a.update({"durablerun.attempt.outcome": result.outcome.value,
                      "durablerun.cost.usd": float(result.totals.usd), "durablerun.cost.tokens": result.totals.tokens,
                      "durablerun.steps": result.totals.steps, "durablerun.journal.records": result.journal_records})
            if result.abort_reason is not None:
                a["durablerun.abort.reason"] = result.abort_reason.value
                self._event("aborted", {"durablerun.abort.reason": result.abort_reason.value})
            if result.overshoot:
                self._event("budget overshot", {"durablerun.budget.overshoot": result.overshoot})
            if result.waiting is not None:
                until = result.waiting.deadline or result.waiting.wake_time
                a["durablerun.waiting.event"] = result.waiting.event or ""
                a["durablerun.waiting.until"] = api.format_time(until, precise=True) if until else ""
            if result.error_type:
                a["error.type"] = result.error_type
            failed = result.outcome in (api.Outcome.FAILED, api.Outcome.USAGE_ERROR)
            self._end(span, None, error=(result.error_type or result.outcome.value) if failed else None)
        self.attempt = None
        self.flush()

    def flush(self) -> None:
        """End the export: the child delivers what it holds (spanexport.flush_seconds at most); say how many
        spans were not delivered."""
        self.delivered = self.export.close()
        missing = self.undelivered
        if missing > 0:
            log.warning("tracing: %d of %d spans of run %s were not delivered to the OTLP collector (unreachable "
                        "or slow); the run is not affected", missing, self.export.sent, self.run_key)

    @property
    def undelivered(self) -> int:
        """Spans ended but not delivered to the collector (all of them until the attempt has ended)."""
        return self.export.sent - (self.delivered or 0)


def _system_of(model: str) -> str | None:
    m = model.lower()
    if m.startswith("claude"):
        return "anthropic"
    if m.startswith(("gpt", "o1", "o3", "o4", "chatgpt", "text-embedding")):
        return "openai"
    return None


def model_call(*, model: str, input_tokens: int, output_tokens: int, cached_tokens: int = 0,
               usd: Decimal) -> None:
    """A model call was charged (durablerun.llm.charge): a ``chat`` span under the step that made it."""
    sink = _ACTIVE
    if sink is not None:
        try:
            sink.model_call(model=model, input_tokens=input_tokens, output_tokens=output_tokens,
                            cached_tokens=cached_tokens, usd=usd)
        except Exception:  # tracing never changes the run
            log.exception("tracing: could not record a model call")
