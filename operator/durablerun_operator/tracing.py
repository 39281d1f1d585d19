"""The operator's decisions as spans in each run's trace (OpenTelemetry; docs/metrics.md, "Traces").

The reconciler hands :meth:`DecisionTracer.record` every plan it carries out, as it hands them to
``metrics``; ``decide`` stays untraced and pure. Each Event of the plan (Restarting, LeaseExpired, Aborted,
Waiting, EventReceived, Resumed...) becomes one span named ``operator <reason>`` in the trace whose id
``durablerun.api`` derives from the run's identity, beside the runner's attempt and step spans.

A span carries reasons and names (the Event's reason, the restart's, the step in flight, the event waited
for), never an Event's message: a Failed run's message is the workflow's exception text, which may hold
anything the workflow had, and a trace backend is read by more people than the run.

Off unless ``OTEL_EXPORTER_OTLP_TRACES_ENDPOINT`` or ``OTEL_EXPORTER_OTLP_ENDPOINT`` is set (the chart's
``tracing.endpoint``). Spans go through a bounded queue to a thread of their own: a collector that is down
costs the operator its spans, never a decision or a delay.
"""

from __future__ import annotations

import logging
import random
import threading
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, cast

from durablerun import api
from durablerun_operator import decide

if TYPE_CHECKING:
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SpanExporter
    from opentelemetry.sdk.trace.id_generator import IdGenerator

log = logging.getLogger("durablerun.operator")

SCOPE = "durablerun.operator"
SERVICE_NAME = "durablerun-operator"
#: At shutdown, wait this long at most for queued spans to reach the collector.
FLUSH_SECONDS = 2.0


def endpoint(env: Mapping[str, str]) -> str | None:
    """The OTLP/HTTP endpoint the operator's settings name; None when tracing is off. SystemExit when a setting
    is malformed (``api.otlp_traces_endpoint``): the operator refuses to start, as for its other settings
    (runners go on untraced instead)."""
    try:
        return api.otlp_traces_endpoint(env)
    except ValueError as error:
        raise SystemExit(f"{error} (the chart's tracing.endpoint and tracing.env set these)") from None


class _Ids:
    """An IdGenerator whose next ids are the ones the tracer asks for: the run's trace id, and a span id a
    link elsewhere names (the reconciler records from one thread at a time; thread-local all the same)."""

    def __init__(self) -> None:
        self.local = threading.local()

    def generate_span_id(self) -> int:
        return int(getattr(self.local, "span_id", 0)) or random.getrandbits(64) or 1

    def generate_trace_id(self) -> int:
        return int(getattr(self.local, "trace_id", 0)) or random.getrandbits(128) or 1

    def is_trace_id_random(self) -> bool:
        return False  # a hash of the run's identity


class DecisionTracer:
    """Records the operator's decisions about runs as spans of the runs' traces."""

    def __init__(self, provider: TracerProvider) -> None:
        self.provider = provider
        self.tracer = provider.get_tracer(SCOPE)
        self.ids = cast(_Ids, provider.id_generator)

    @classmethod
    def from_env(cls, env: Mapping[str, str], exporter: SpanExporter | None = None) -> DecisionTracer | None:
        """A tracer when ``env`` names an endpoint (or ``exporter`` is given), else None."""
        if endpoint(env) is None and exporter is None:
            return None
        try:
            from opentelemetry.sdk.resources import Resource
            from opentelemetry.sdk.trace import TracerProvider
            from opentelemetry.sdk.trace.export import BatchSpanProcessor
            from opentelemetry.sdk.trace.sampling import _get_from_env_or_default

            if exporter is None:
                from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

                exporter = OTLPSpanExporter()
        except ImportError:
            log.warning("tracing is off: an OTLP endpoint is set but OpenTelemetry is not installed; install "
                        "durable-run[otel] (the operator image has it)")
            return None
        named = env.get("OTEL_SERVICE_NAME") or "service.name=" in env.get("OTEL_RESOURCE_ATTRIBUTES", "")
        # The sampler decides on the trace id (parent-based, ratio), as the runners' do: a run is sampled whole.
        provider = TracerProvider(resource=Resource.create({} if named else {"service.name": SERVICE_NAME}),
                                  sampler=_get_from_env_or_default(), id_generator=cast("IdGenerator", _Ids()),
                                  shutdown_on_exit=False)
        provider.add_span_processor(BatchSpanProcessor(exporter))  # a bounded queue (OTEL_BSP_MAX_QUEUE_SIZE)
        log.info("tracing the operator's decisions to the runs' traces")
        return cls(provider)

    def record(self, run: decide.RunView, plan: decide.Plan) -> None:
        """The decisions of ``plan``, carried out on ``run``, in the run's trace: one span per Event; at a child
        run's admission, a span in each of the parent's and the child's traces, linked to each other."""
        key = api.run_key(run.namespace, run.name, run.uid, run.spec.checkpoint.runId)
        common: dict[str, Any] = {"durablerun.run": key, "k8s.namespace.name": run.namespace,
                                  "durablerun.name": run.name, "durablerun.attempt": run.status.attempt,
                                  "durablerun.epoch": run.status.epoch}
        if plan.restart_reason:
            common["durablerun.restart.reason"] = plan.restart_reason
        if plan.abort_reason:
            common["durablerun.abort.reason"] = plan.abort_reason
        if plan.completion:
            common["durablerun.completion"] = plan.completion
        progress, waiting = run.status.progress, run.status.waitingFor
        step = progress.inFlight.name if progress.inFlight else progress.stepName
        if step:
            common["durablerun.step"] = step
        if waiting and waiting.event:
            common["durablerun.waiting.event"] = waiting.event
        try:
            parent = run.annotations.get(api.ANNOTATION_PARENT_TRACE)
            if parent and run.raw_status is None and plan.patch:  # admitted now
                self._link_child(run, key, parent)
            for kind, reason, _message in plan.events:  # the message may quote the workflow: never exported
                self._span(f"operator {reason}", api.trace_id_of(key), {
                    **common, "durablerun.operator.reason": reason, "durablerun.operator.event_type": kind})
        except Exception:  # tracing never changes a decision
            log.exception("tracing: could not record the decisions about %s/%s", run.namespace, run.name)

    def _link_child(self, run: decide.RunView, key: str, parent_trace: str) -> None:
        from opentelemetry.trace import Link, SpanContext, TraceFlags

        try:
            parent_id = int(parent_trace, 16)
        except ValueError:
            return  # not ours: the annotation was edited by hand
        child_id = api.trace_id_of(key)
        in_parent, in_child = random.getrandbits(64) or 1, random.getrandbits(64) or 1
        sampled = TraceFlags(TraceFlags.SAMPLED)
        parent_name = dict(run.body["metadata"].get("labels") or {}).get(api.LABEL_PARENT, "")
        self._span(f"child run {run.name}", parent_id, {
            "k8s.namespace.name": run.namespace, "durablerun.name": parent_name, "durablerun.child.name": run.name,
            "durablerun.child.trace_id": api.trace_id(key)},
            links=[Link(SpanContext(child_id, in_child, is_remote=True, trace_flags=sampled))], span_id=in_parent)
        self._span("operator admitted a child run", child_id, {
            "durablerun.run": key, "k8s.namespace.name": run.namespace, "durablerun.name": run.name,
            "durablerun.parent.name": parent_name, "durablerun.parent.trace_id": f"{parent_id:032x}"},
            links=[Link(SpanContext(parent_id, in_parent, is_remote=True, trace_flags=sampled))], span_id=in_child)

    def _span(self, name: str, trace_id: int, attributes: Mapping[str, Any], *, links: Any = None,
              span_id: int = 0) -> None:
        from opentelemetry import context

        self.ids.local.trace_id, self.ids.local.span_id = trace_id, span_id
        try:
            # No parent (an empty context): the trace id comes from the id generator.
            self.tracer.start_span(name, context=context.Context(), attributes=attributes, links=links).end()
        finally:
            self.ids.local.trace_id = self.ids.local.span_id = 0

    def shutdown(self) -> None:
        """Deliver what is queued, waiting :data:`FLUSH_SECONDS` at most."""
        flusher = threading.Thread(target=self.provider.shutdown, name="durablerun-trace-flush", daemon=True)
        flusher.start()
        flusher.join(FLUSH_SECONDS)

