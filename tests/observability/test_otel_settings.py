"""OpenTelemetry's settings, read once for the runner and the operator (``api.otlp_traces_endpoint``), and the
runner's sampling decision.

The runner goes on untraced on a bad setting (tests/observability/test_tracing.py), the operator refuses to
start (tests/operator/test_decision_spans.py); what is wrong, and the fix, are said here, the same for both.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from durablerun import api
from durablerun._private.telemetry import tracing
from durablerun.stores import RunRef, open_store

BASE = "http://otel-collector:4318"


@pytest.mark.parametrize(("env", "endpoint"), [
    ({}, None),
    ({"OTEL_EXPORTER_OTLP_ENDPOINT": "  "}, None),
    ({"OTEL_EXPORTER_OTLP_ENDPOINT": BASE}, BASE),
    ({"OTEL_EXPORTER_OTLP_ENDPOINT": BASE, "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "https://t.example/v1/traces"},
     "https://t.example/v1/traces"),  # the traces-only variable wins
    ({"OTEL_EXPORTER_OTLP_ENDPOINT": BASE, "OTEL_SDK_DISABLED": "TRUE"}, None),
    ({"OTEL_EXPORTER_OTLP_ENDPOINT": "not a url", "OTEL_TRACES_EXPORTER": "none"}, None),  # off: not read
    ({"OTEL_EXPORTER_OTLP_ENDPOINT": BASE, "OTEL_EXPORTER_OTLP_PROTOCOL": "http/protobuf",
      "OTEL_TRACES_SAMPLER": "parentbased_traceidratio", "OTEL_TRACES_SAMPLER_ARG": "0.25"}, BASE),
])
def test_the_endpoint_traces_go_to_or_none_when_off(env: dict[str, str], endpoint: str | None) -> None:
    assert api.otlp_traces_endpoint(env) == endpoint


@pytest.mark.parametrize(("env", "said"), [
    ({"OTEL_EXPORTER_OTLP_ENDPOINT": "collector:4318"},
     "OTEL_EXPORTER_OTLP_ENDPOINT='collector:4318' is not an http(s) URL: set it to the collector's OTLP/HTTP "
     "address, e.g. http://otel-collector:4318"),
    ({"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "http://user:pw@:x/v1/traces"},
     "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT='<a URL with credentials>' is not an http(s) URL"),
    ({"OTEL_EXPORTER_OTLP_ENDPOINT": "ftp://collector"}, "OTEL_EXPORTER_OTLP_ENDPOINT='ftp://collector' is not"),
    ({"OTEL_EXPORTER_OTLP_ENDPOINT": BASE, "OTEL_TRACES_EXPORTER": "console"},
     "OTEL_TRACES_EXPORTER='console': traces are exported with otlp only"),
    ({"OTEL_EXPORTER_OTLP_ENDPOINT": BASE, "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL": "grpc",
      "OTEL_EXPORTER_OTLP_PROTOCOL": "http/protobuf"},
     "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL='grpc': traces are sent as OTLP over HTTP only: set it to http/protobuf"),
    ({"OTEL_EXPORTER_OTLP_ENDPOINT": BASE, "OTEL_TRACES_SAMPLER": "sometimes"},
     "OTEL_TRACES_SAMPLER='sometimes' is not a sampler OpenTelemetry knows: use one of always_on"),
    ({"OTEL_EXPORTER_OTLP_ENDPOINT": BASE, "OTEL_TRACES_SAMPLER": "traceidratio", "OTEL_TRACES_SAMPLER_ARG": "2"},
     "OTEL_TRACES_SAMPLER_ARG='2' is not a ratio between 0 and 1"),
])
def test_a_bad_setting_is_named_with_its_fix_and_no_credentials(env: dict[str, str], said: str) -> None:
    with pytest.raises(ValueError, match=re.escape(said)) as raised:
        api.otlp_traces_endpoint(env)
    assert "pw" not in str(raised.value)


@pytest.mark.parametrize(("sampler", "arg", "traced"), [
    ("parentbased_always_on", "", True), ("always_off", "", False), ("parentbased_always_off", "", False),
    ("traceidratio", "0", False), ("parentbased_traceidratio", "1", True),
])
def test_the_sampler_decides_once_for_the_whole_run(tmp_path: Path, sampler: str, arg: str, traced: bool) -> None:
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    env = {"OTEL_EXPORTER_OTLP_ENDPOINT": BASE, "OTEL_TRACES_SAMPLER": sampler, "OTEL_TRACES_SAMPLER_ARG": arg}
    store = open_store(f"file://{tmp_path}")
    try:
        sinks = tracing.sinks_for(store, RunRef.local("sampled"), env=env, exporter=InMemorySpanExporter())
    finally:
        store.close()
    assert len(sinks) == int(traced)
