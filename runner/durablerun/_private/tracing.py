"""Traces of runs through OpenTelemetry: one trace per run, a span per attempt, a child span per step.

It is one module of over 400 lines because it is one sink,
:class:`TracingSink`, and the span ids it puts on attempts must be the ones
:func:`attempt_span_id` beside it derives (the trace id is the contract's, ``api.trace_id_of``).

A progress sink (:class:`TracingSink`), on when ``OTEL_EXPORTER_OTLP_TRACES_ENDPOINT`` or
``OTEL_EXPORTER_OTLP_ENDPOINT`` is set and the ``otel`` extra is installed; the other standard
``OTEL_*`` variables (service name, resource attributes, sampler, headers, batch queue) are honoured.

The trace id is a hash of the run's identity (``api.trace_id_of``: the operator computes it too), and an
attempt's span id a hash of the run and the attempt id, so every attempt of a run, in any pod or process,
adds to one trace, and the steps of an attempt killed before it could end its own span still hang under
it: the next attempt finds that attempt's records last in the journal with no outcome recorded, and ends a
span for it.

Exporting never slows or fails the run: spans go through a bounded queue to a background thread; at the
end of an attempt it waits :data:`FLUSH_SECONDS` at most, and says how many spans were not delivered.
Spans carry names, positions, counts, sizes, times and cost, never a payload, a result, an error message
or a credential (docs/metrics.md, "Traces").
"""

from __future__ import annotations

import hashlib
import logging
import os
import random
import threading
from collections.abc import Mapping, Sequence
from decimal import Decimal
from typing import TYPE_CHECKING, Any, cast
from urllib.parse import urlsplit

from durablerun import api
from durablerun._private import replay
from durablerun._private.model import (
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
from durablerun._private.sinks import ProgressSink

if TYPE_CHECKING:
    from opentelemetry.sdk.trace import ReadableSpan, Span, TracerProvider
    from opentelemetry.sdk.trace.export import SpanExporter, SpanExportResult
    from opentelemetry.sdk.trace.id_generator import IdGenerator

    from durablerun._private.layout import RunRef
    from durablerun._private.stores import Store

log = logging.getLogger("durablerun")

#: The instrumentation scope of every span.
SCOPE = "durablerun"
#: At the end of an attempt, wait this long at most for queued spans to reach the collector.
FLUSH_SECONDS = 2.0
TRACES_ENDPOINT = "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"
ENDPOINT = "OTEL_EXPORTER_OTLP_ENDPOINT"
_SAMPLERS = ("always_on", "always_off", "parentbased_always_on", "parentbased_always_off", "traceidratio",
             "parentbased_traceidratio")
#: Set by the sink of the attempt running in this process: model calls (durablerun.llm) report to it.
_ACTIVE: TracingSink | None = None


def attempt_span_id(run_key: str, attempt_id: str) -> int:
    """The span id of an attempt, so that a later attempt can end the span of one that was killed."""
    digest = hashlib.sha256(f"durablerun/attempt/{run_key}/{attempt_id}".encode()).digest()
    return int.from_bytes(digest[:8], "big") or 1


class TracingConfigError(ValueError):
    """The OTEL_* environment asks for something the runner cannot do; the run goes on untraced."""


def endpoint_from_env(env: Mapping[str, str]) -> str | None:
    """The OTLP/HTTP traces endpoint configured, None when tracing is off; TracingConfigError when invalid."""
    if env.get("OTEL_SDK_DISABLED", "").strip().lower() == "true":
        return None
    exporter = env.get("OTEL_TRACES_EXPORTER", "otlp").strip().lower()
    if exporter == "none":
        return None
    var = TRACES_ENDPOINT if env.get(TRACES_ENDPOINT, "").strip() else ENDPOINT
    value = env.get(var, "").strip()
    if not value:
        return None
    if exporter != "otlp":
        raise TracingConfigError(f"OTEL_TRACES_EXPORTER={exporter!r}: the runner exports traces with otlp only "
                                 "(unset it, or set it to otlp)")
    try:
        parts = urlsplit(value)
        parts.port  # noqa: B018 - raises ValueError on a port that is not a number
    except ValueError:
        parts = None
    if parts is None or parts.scheme not in ("http", "https") or not parts.hostname:
        shown = "<a URL with credentials>" if "@" in value else value
        raise TracingConfigError(f"{var}={shown!r} is not an http(s) URL: set it to the collector's OTLP/HTTP "
                                 "address, e.g. http://otel-collector:4318")
    for pvar in ("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL", "OTEL_EXPORTER_OTLP_PROTOCOL"):
        protocol = env.get(pvar, "").strip()
        if protocol:
            if protocol != "http/protobuf":
                raise TracingConfigError(f"{pvar}={protocol!r}: the runner sends OTLP over HTTP only: set it to "
                                         "http/protobuf and the endpoint to the collector's HTTP port (4318)")
            break
    sampler = env.get("OTEL_TRACES_SAMPLER", "parentbased_always_on").strip().lower()
    if sampler not in _SAMPLERS:
        raise TracingConfigError(f"OTEL_TRACES_SAMPLER={sampler!r} is not a sampler the runner knows: use one "
                                 f"of {', '.join(_SAMPLERS)}")
    if "traceidratio" in sampler:
        arg = env.get("OTEL_TRACES_SAMPLER_ARG", "1.0")
        try:
            ratio = float(arg)
        except ValueError:
            ratio = -1.0
        if not 0.0 <= ratio <= 1.0:
            raise TracingConfigError(f"OTEL_TRACES_SAMPLER_ARG={arg!r} is not a ratio between 0 and 1")
    return value


def sinks_for(store: Store, ref: RunRef, *, attributes: Mapping[str, Any] | None = None,
              env: Mapping[str, str] | None = None, exporter: SpanExporter | None = None) -> list[ProgressSink]:
    """The tracing sink for an attempt of run ``ref``, or none when tracing is off or cannot start.

    ``attributes`` describe where the attempt runs (pod, node, epoch). A configuration error is logged
    here, once, and the run goes on without traces. Reads the run's status in ``store`` (one small
    object) to tell whether the attempt before ended with an outcome.
    """
    env = os.environ if env is None else env
    try:
        endpoint = endpoint_from_env(env)
    except TracingConfigError as error:
        log.warning("tracing is off for this attempt: %s", error)
        return []
    if endpoint is None and exporter is None:
        return []
    try:
        provider, counter = _provider(env, exporter)
    except ImportError:
        log.warning("tracing is off for this attempt: %s is set but OpenTelemetry is not installed; install "
                    "durable-run[otel] (the runner image has it)", TRACES_ENDPOINT if env.get(TRACES_ENDPOINT)
                    else ENDPOINT)
        return []
    rs = store.run_store(ref)
    try:
        status = rs.read_status() or {}
    except Exception as error:  # the run reads the store next and says what is wrong
        log.debug("tracing: could not read the run's status: %s", error)
        status = {}
    finally:
        rs.close()
    return [TracingSink(provider, counter, ref.key, attributes=attributes or {},
                        last_finished=str(status.get("attempt") or ""))]


def _provider(env: Mapping[str, str], exporter: SpanExporter | None) -> tuple[TracerProvider, _Counting]:
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor
    from opentelemetry.sdk.trace.sampling import _get_from_env_or_default

    if exporter is None:
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

        exporter = OTLPSpanExporter()
        # Its retries are warnings per batch; the sink reports what was not delivered, once, instead.
        logging.getLogger("opentelemetry.exporter.otlp").setLevel(logging.ERROR)
    named = env.get("OTEL_SERVICE_NAME") or "service.name=" in env.get("OTEL_RESOURCE_ATTRIBUTES", "")
    resource = Resource.create({} if named else {"service.name": "durablerun"})
    counting = _Counting(exporter)
    # The sampler decides on the trace id (parent-based, ratio): every attempt of a run decides alike.
    provider = TracerProvider(resource=resource, sampler=_get_from_env_or_default(),
                              id_generator=cast("IdGenerator", _Ids()), shutdown_on_exit=False)
    # A bounded queue (OTEL_BSP_MAX_QUEUE_SIZE, 2048) exported from a thread of its own.
    provider.add_span_processor(BatchSpanProcessor(cast("SpanExporter", counting)))
    return provider, counting


class _Counting:
    """A SpanExporter around the real one, counting the spans it delivered (OpenTelemetry's
    processors only call these three methods)."""

    def __init__(self, inner: SpanExporter) -> None:
        self.inner = inner
        self.delivered = 0
        self.lock = threading.Lock()

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        from opentelemetry.sdk.trace.export import SpanExportResult

        result = self.inner.export(spans)
        if result is SpanExportResult.SUCCESS:
            with self.lock:
                self.delivered += len(spans)
        return result

    def shutdown(self) -> None:
        self.inner.shutdown()

    def force_flush(self, timeout_millis: int = 30000) -> bool:
        return self.inner.force_flush(timeout_millis)


class _Ids:
    """An IdGenerator: the run's trace id, random span ids except the fixed one a thread asks for next
    (an attempt's)."""

    def __init__(self) -> None:
        self.trace_id = 0
        self.local = threading.local()

    def generate_span_id(self) -> int:
        fixed: int | None = getattr(self.local, "fixed", None)
        if fixed is not None:
            self.local.fixed = None
            return fixed
        return random.getrandbits(64) or 1

    def generate_trace_id(self) -> int:
        return self.trace_id or random.getrandbits(128) or 1

    def is_trace_id_random(self) -> bool:
        return False  # a hash of the run's identity (W3C trace-context level 2's "random" flag)


def _ns(seconds: float) -> int:
    return int(seconds * 1e9)


class TracingSink(ProgressSink):
    """Turns one attempt's progress events into spans of the run's trace."""

    def __init__(self, provider: TracerProvider, counter: _Counting, run_key: str, *,
                 attributes: Mapping[str, Any], last_finished: str) -> None:
        self.provider = provider
        self.counter = counter
        self.run_key = run_key
        self.tracer = provider.get_tracer(SCOPE)
        self.ids = cast(_Ids, provider.id_generator)
        self.ids.trace_id = api.trace_id_of(run_key)
        self.attributes = {k: v for k, v in attributes.items() if v is not None}
        self.last_finished = last_finished
        self.lock = threading.Lock()
        self.attempt: Span | None = None
        self.steps: dict[str, Span] = {}
        self.waits: dict[str, float] = {}
        self.ended = 0
        #: Steps started before this attempt's first journal write, after an attempt killed mid-way: run again.
        self.rerun_window = False

    # --- spans ------------------------------------------------------------------------
    def _start(self, name: str, *, parent: Span | None, start: float | None = None,
               attributes: Mapping[str, Any] | None = None, span_id: int | None = None) -> Span:
        from opentelemetry import context, trace

        ctx = trace.set_span_in_context(parent) if parent is not None else context.Context()
        if span_id is not None:
            self.ids.local.fixed = span_id
        try:
            span: Span = self.tracer.start_span(  # type: ignore[assignment]
                name, context=ctx, attributes=attributes, start_time=None if start is None else _ns(start))
        finally:
            self.ids.local.fixed = None
        return span

    def _end(self, span: Span, end: float | None = None) -> None:
        span.end(None if end is None else _ns(end))
        if span.get_span_context().trace_flags.sampled:
            with self.lock:
                self.ended += 1

    @staticmethod
    def _error(span: Span, description: str) -> None:
        from opentelemetry.trace import Status, StatusCode

        span.set_status(Status(StatusCode.ERROR, description))

    # --- the sink ------------------------------------------------------------------------
    def run_started(self, *, info: RunStarted) -> None:
        global _ACTIVE
        self._close_killed(info.journal)
        self.attempt = self._start("attempt", parent=None, span_id=attempt_span_id(self.run_key, info.attempt_id),
                                   attributes={**self.attributes, "durablerun.run": info.run,
                                               "durablerun.attempt.id": info.attempt_id,
                                               "durablerun.attempt.resumed": info.resumed,
                                               "durablerun.journal.replayed_records": info.journal_records,
                                               "durablerun.generation": info.generation,
                                               "durablerun.code_version": info.code_version})
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
        span = self._start("attempt", parent=None, start=began,
                           span_id=attempt_span_id(self.run_key, killed),
                           attributes={"durablerun.run": self.run_key, "durablerun.attempt.id": killed,
                                       "durablerun.attempt.outcome": "Crashed",
                                       "durablerun.attempt.reconstructed": True})
        self._error(span, "the attempt ended without recording an outcome (killed, out of memory, node lost); "
                          "this span ends at its last journal write")
        self._end(span, journal[-1].at)
        self.rerun_window = True

    def step_started(self, *, position: str, name: str, attempt: int) -> None:
        span = self.steps.get(position)
        if span is not None:
            span.add_event("retry", {"durablerun.step.attempt": attempt})
            return
        attributes: dict[str, Any] = {"durablerun.step.name": name, "durablerun.step.position": position}
        if self.rerun_window:
            attributes["durablerun.step.reexecuted"] = True
        self.steps[position] = self._start(f"step {name}", parent=self.attempt, attributes=attributes)

    def record_journaled(self, *, record: Record) -> None:
        attempt = self.attempt
        self.rerun_window = False
        cost = record.cost
        if isinstance(record, StepRecord):
            span = self.steps.pop(record.pos, None)
            if span is None:
                if attempt is not None and record.error and record.error.get("type") == replay.ABORT_MARK:
                    attempt.add_event("abort stopped an operation in a Saga", {
                        "durablerun.step.name": record.name, "durablerun.step.position": record.pos,
                        "durablerun.abort.reason": str(record.error.get("reason", ""))})
                return
            size = int(record.ref["size"]) if record.ref else len(record.encoded or b"")
            span.set_attributes({"durablerun.step.attempts": record.attempts,
                                 "durablerun.step.retries": record.attempts - 1,
                                 "durablerun.step.ok": record.ok, "durablerun.journal.seq": record.seq,
                                 "durablerun.step.result_bytes": size if record.ok else 0,
                                 "durablerun.cost.usd": float(cost.usd) if cost else 0.0,
                                 "durablerun.cost.tokens": cost.tokens if cost else 0})
            if not record.ok:
                error_type = str((record.error or {}).get("type", "Error"))
                span.set_attribute("error.type", error_type)
                self._error(span, error_type)
            self._end(span)
        elif attempt is None:
            return
        elif isinstance(record, SleepRecord):
            wake = api.parse_time(record.wake_at).timestamp()
            span = self._start("sleep", parent=attempt, start=record.at, attributes={
                "durablerun.position": record.pos, "durablerun.sleep.until": record.wake_at,
                "durablerun.sleep.seconds": round(wake - record.at, 3)})
            self._end(span, max(wake, record.at))
        elif isinstance(record, WaitRecord):
            self.waits[record.pos] = record.at
            attempt.add_event("wait for event", {"durablerun.event.name": record.name,
                                                 "durablerun.position": record.pos,
                                                 "durablerun.wait.deadline": record.deadline or ""})
        elif isinstance(record, EventRecord):
            began = self.waits.pop(record.pos, record.at)
            span = self._start(f"wait {record.name}", parent=attempt, start=began, attributes={
                "durablerun.event.name": record.name, "durablerun.position": record.pos,
                "durablerun.event.received": record.ok, "durablerun.event.timed_out": record.timeout,
                "durablerun.wait.seconds": round(record.at - began, 3)})
            self._end(span, record.at)
        elif isinstance(record, ContinueRecord):
            attempt.add_event("continue_as_new", {"durablerun.generation": record.gen})
        elif isinstance(record, CompleteRecord):
            attempt.add_event("workflow completed", {"durablerun.journal.seq": record.seq})

    def model_call(self, *, model: str, input_tokens: int, output_tokens: int, cached_tokens: int,
                   usd: Decimal) -> None:
        frame = replay.STEP.get()
        parent = (self.steps.get(frame.position) if frame is not None else None) or self.attempt
        system = _system_of(model)
        attributes: dict[str, Any] = {"gen_ai.operation.name": "chat", "gen_ai.request.model": model,
                                      "gen_ai.usage.input_tokens": input_tokens,
                                      "gen_ai.usage.output_tokens": output_tokens,
                                      "durablerun.cost.usd": float(usd)}
        if system:
            attributes["gen_ai.system"] = system
        if cached_tokens:
            attributes["gen_ai.usage.cache_read.input_tokens"] = cached_tokens
        self._end(self._start(f"chat {model}", parent=parent, attributes=attributes))

    def run_finished(self, *, result: AttemptResult) -> None:
        global _ACTIVE
        if _ACTIVE is self:
            _ACTIVE = None
        for step in self.steps.values():
            step.set_attribute("durablerun.step.interrupted", True)
            self._error(step, f"the attempt ended ({result.outcome.value}) before this step was journaled; "
                              "it runs again in the next attempt")
            self._end(step)
        self.steps.clear()
        span = self.attempt
        self.attempt = None
        if span is not None:
            span.set_attributes({"durablerun.attempt.outcome": result.outcome.value,
                                 "durablerun.cost.usd": float(result.totals.usd),
                                 "durablerun.cost.tokens": result.totals.tokens,
                                 "durablerun.steps": result.totals.steps,
                                 "durablerun.journal.records": result.journal_records})
            if result.abort_reason is not None:
                span.set_attribute("durablerun.abort.reason", result.abort_reason.value)
                span.add_event("aborted", {"durablerun.abort.reason": result.abort_reason.value})
            if result.overshoot:
                span.add_event("budget overshot", {"durablerun.budget.overshoot": result.overshoot})
            if result.waiting is not None:
                until = result.waiting.deadline or result.waiting.wake_time
                span.set_attributes({"durablerun.waiting.event": result.waiting.event or "",
                                     "durablerun.waiting.until": api.format_time(until, precise=True) if until
                                     else ""})
            if result.error_type:
                span.set_attribute("error.type", result.error_type)
            if result.outcome in (api.Outcome.FAILED, api.Outcome.USAGE_ERROR):
                self._error(span, result.error_type or result.outcome.value)
            self._end(span)
        self.flush()

    def flush(self, seconds: float = FLUSH_SECONDS) -> None:
        """Wait ``seconds`` at most for queued spans to be delivered; say how many were not."""
        flusher = threading.Thread(target=self.provider.force_flush, name="durablerun-trace-flush", daemon=True)
        flusher.start()
        flusher.join(seconds)
        with self.lock:
            ended = self.ended
        missing = ended - self.counter.delivered
        if missing > 0:
            log.warning("tracing: %d of %d spans of run %s were not delivered to the OTLP collector (unreachable "
                        "or slow); the run is not affected", missing, ended, self.run_key)

    @property
    def undelivered(self) -> int:
        """Spans ended but not (yet) delivered to the collector."""
        with self.lock:
            return self.ended - int(self.counter.delivered)


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
