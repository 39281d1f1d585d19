"""The operator's tracer on its own (no test bed): which settings turn it on, and the spans a plan becomes.

The spans' journey to a real collector is tests/operator/test_traces.py's.
"""

from __future__ import annotations

import re
from datetime import timedelta

import pytest
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from durablerun import api
from durablerun_operator import decide, tracing
from tests.operator.run_bodies import T0, body, ended, running


def test_tracing_is_off_without_an_endpoint_and_a_malformed_one_stops_the_operator_naming_it() -> None:
    assert tracing.DecisionTracer.from_env({}) is None
    assert tracing.DecisionTracer.from_env({"OTEL_EXPORTER_OTLP_ENDPOINT": "http://c:4318",
                                            "OTEL_SDK_DISABLED": "true"}) is None
    assert tracing.endpoint({"OTEL_EXPORTER_OTLP_ENDPOINT": "http://collector:4318"}) == "http://collector:4318"
    with pytest.raises(SystemExit, match=re.escape("OTEL_EXPORTER_OTLP_ENDPOINT='collector:4318' is not an http(s) URL")
                       + ".*" + re.escape("(the chart's tracing.endpoint and tracing.env set these)")):
        tracing.endpoint({"OTEL_EXPORTER_OTLP_ENDPOINT": "collector:4318"})


def test_a_restart_becomes_a_span_of_the_runs_trace_named_after_its_event() -> None:
    exporter = InMemorySpanExporter()
    tracer = tracing.DecisionTracer.from_env({}, exporter=exporter)
    assert tracer is not None
    run = decide.RunView.from_body(body(running()))
    now = T0 + timedelta(seconds=120)
    plan = decide.decide(run, [decide.PodView.from_pod(ended(137), now, 60.0)], now)
    tracer.record(run, plan)
    tracer.shutdown()  # delivers what is queued
    (span,) = exporter.get_finished_spans()
    assert span.name == "operator Restarting"
    assert span.context.trace_id == api.trace_id_of("ns/run/u1")
    assert span.parent is None
    attributes = dict(span.attributes or {})
    assert attributes["durablerun.restart.reason"] == "Crash"
    assert attributes["durablerun.operator.event_type"] == "Warning"
    # Reasons and names, never the Event's message (it may quote the workflow: a Failed run's exception text).
    assert not any("exit code 137" in str(value) for value in attributes.values())
    assert "durablerun.operator.message" not in attributes
