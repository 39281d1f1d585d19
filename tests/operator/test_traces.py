"""A DurableRun's trace in a real Jaeger: its runners' spans and the operator's decisions, one trace per run.

The operator gets the OTLP endpoint as the chart sets it (OTEL_EXPORTER_OTLP_ENDPOINT in its environment) and
hands it on to the runner pods it creates; the tests read the trace back through Jaeger's query API.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from typing import Any

import pytest

from durablerun import api
from durablerun_testbed import procs
from durablerun_testbed.jaeger import Jaeger
from tests.helpers.runs import Operator, RunEnv, StartOperator

pytestmark = pytest.mark.testbed


@pytest.fixture
def traced(start_operator: StartOperator, jaeger: Jaeger) -> Operator:
    """The test's operator, tracing to the session's Jaeger (spans leave within a tenth of a second)."""
    return start_operator(OTEL_EXPORTER_OTLP_ENDPOINT=jaeger.otlp_endpoint, OTEL_BSP_SCHEDULE_DELAY="100")


def spans_of(jaeger: Jaeger, trace_id: str, ready: Callable[[list[dict[str, Any]]], bool],
             what: str) -> list[dict[str, Any]]:
    def spans() -> list[dict[str, Any]] | None:
        trace = jaeger.trace(trace_id)
        found = [{**s, "service": trace["processes"][s["processID"]]["serviceName"]}
                 for s in (trace or {}).get("spans", [])] if trace else []
        return found if ready(found) else None

    return procs.wait_for(spans, timeout=30, interval=0.2, what=what)


def tags(span: dict[str, Any]) -> dict[str, Any]:
    return {t["key"]: t["value"] for t in span.get("tags", [])}


def named(spans: list[dict[str, Any]], name: str) -> list[dict[str, Any]]:
    return [s for s in spans if s["operationName"] == name]


def test_a_crashed_run_is_one_trace_of_its_attempts_and_the_operators_decisions(
        traced: Operator, runs: RunEnv, jaeger: Jaeger) -> None:
    runs.apply(runs.manifest("traced", "optest_flows:steps", {"steps": 3, "sleep": 0, "hold": "s1"}))
    # The runner reports the step in flight with its lease renewals (every leaseDuration/3).
    procs.wait_for(lambda: ((runs.get("traced").get("status") or {}).get("progress") or {}).get("inFlight"),
                   timeout=60, what="the runner to report step s1 in flight")
    run = runs.get("traced")
    trace_id = run["status"]["traceID"]
    assert trace_id == api.trace_id(f"{runs.namespace}/traced/{run['metadata']['uid']}")
    assert runs.testbed.node
    runs.testbed.node.kill(runs.namespace, run["status"]["pod"])
    (runs.ledger_dir / "release-s1").touch()
    done = runs.wait_phase("traced", "Succeeded", timeout=90)
    assert done["status"]["restarts"] == 1

    # The Restarting Event says what the killed runner was doing, not its last log line.
    (restarting,) = [e["message"] for e in runs.events("traced") if e["reason"] == "Restarting"]
    assert "exit code 137 (killed by SIGKILL) during step 's1' (position " in restarting, restarting
    assert ", attempt 1, running for " in restarting, restarting
    assert "{" not in restarting, restarting

    spans = spans_of(jaeger, trace_id, lambda s: len(named(s, "attempt")) == 2 and bool(named(s, "operator Succeeded")),
                     what="both attempts and the operator's Succeeded in the run's trace")
    # The operator's decisions, in the run's trace.
    decisions = Counter(s["operationName"] for s in spans if s["service"] == "durablerun-operator")
    assert (decisions["operator AttemptStarted"], decisions["operator Restarting"],
            decisions["operator Succeeded"]) == (2, 1, 1), decisions
    (restart,) = named(spans, "operator Restarting")
    assert tags(restart)["durablerun.restart.reason"] == "Crash"
    assert tags(restart)["durablerun.step"] == "s1"  # the step in flight: a name, never the Event's message
    assert "durablerun.operator.message" not in tags(restart)
    # The runners' attempts: the killed one ended by the next, both on the pod's node.
    attempts = {tags(s)["durablerun.attempt.outcome"]: tags(s) for s in named(spans, "attempt")}
    assert set(attempts) == {"Crashed", "Completed"}
    (final_pod,) = [p for p in runs.pods("traced") if p["metadata"]["name"] == done["status"]["pod"]]
    assert attempts["Completed"]["k8s.node.name"] == final_pod["spec"]["nodeName"]
    assert {s["service"] for s in named(spans, "attempt")} == {"durablerun"}


def test_a_parents_trace_and_its_childrens_traces_link_to_each_other(
        traced: Operator, runs: RunEnv, jaeger: Jaeger) -> None:
    runs.apply(runs.manifest("fam", "optest_children:supervisor", {"children": 2, "sleep": 0.1}))
    done = runs.wait_phase("fam", "Succeeded", "Failed", timeout=120)
    assert done["status"]["phase"] == "Succeeded", done["status"].get("message")
    parent_trace = done["status"]["traceID"]
    kids = {name: runs.get(f"fam-{name}") for name in done["status"]["childRequests"]}
    assert sorted(kids) == ["w0", "w1"]
    kid_traces = {kid["metadata"]["name"]: kid["status"]["traceID"] for kid in kids.values()}

    def links(span: dict[str, Any]) -> set[str]:
        return {r["traceID"] for r in span.get("references", []) if r["traceID"] != span["traceID"]}

    spans = spans_of(jaeger, parent_trace, lambda s: len([x for x in s if x["operationName"].startswith(
        "child run ")]) == 2, what="the parent's child-run spans")
    for name, kid_trace in kid_traces.items():
        (child_span,) = named(spans, f"child run {name}")
        assert links(child_span) == {kid_trace}
        kid_spans = spans_of(jaeger, kid_trace, lambda s: bool(named(s, "operator admitted a child run")),
                             what=f"{name}'s admission in its own trace")
        (admitted,) = named(kid_spans, "operator admitted a child run")
        assert links(admitted) == {parent_trace}
        assert named(kid_spans, "attempt"), "the child's runner traces into the child's own trace"
