"""A real Prometheus scrapes the real operator while runs crash, resume and abort.

The metrics agree with the DurableRun statuses they come from, DurableRunAborted
fires with the run's labels, and every dashboard query returns data.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from durablerun_testbed import procs
from tests.helpers.prometheus import (
    DASHBOARD,
    firing,
    has_numbers,
    panels,
    resolve_variables,
    rules_for_test,
    run_target,
    scalar,
    substitute,
)
from tests.helpers.runs import Operator, RunEnv
from tests.helpers.session import StartPrometheus

pytestmark = pytest.mark.testbed

#: Panels of the parts this operator runs without (the webhook ingress, Kueue, tracing, model quotas): their
#: queries have no data here; tests/observability/test_prometheus_e2e.py checks each of them with data.
OPTIONAL_SERIES = ("durablerun_webhook_", "durablerun_runs_queued", "durablerun_run_trace", "durablerun_quota_")


def test_metrics_alerts_and_dashboard_from_the_real_operator(
    operator: Operator, runs: RunEnv, start_prometheus: StartPrometheus, tmp_path: Path
) -> None:
    started = time.time()
    prometheus = start_prometheus([f"127.0.0.1:{operator.metrics_port}"], rule_files=[rules_for_test(tmp_path)])
    # 20 steps: the kill comes after a report of two journaled (renewals are 2 s apart) and a scrape.
    runs.apply(runs.manifest("resumed", "optest_flows:steps", {"steps": 20, "sleep": 0.6, "usd": "0.05"}))
    runs.apply(runs.manifest("capped", "optest_flows:steps", {"steps": 5, "sleep": 0.05, "usd": "0.10"},
                             policy={"costCeilingUSD": "0.15"}))
    runs.apply(runs.manifest("ongoing", "optest_flows:steps", {"steps": 400, "sleep": 0.5, "usd": "0.01"}))
    procs.wait_for(lambda: (runs.get("resumed").get("status", {}).get("progress") or {}).get("completedSteps", 0) >= 2,
                   timeout=90, what="the run to be killed to journal two steps")
    # Rates need a sample from before the crash: wait for Prometheus to have scraped the operator.
    procs.wait_for(lambda: prometheus.query("durablerun_resume_latency_seconds_count == 0"), timeout=90,
                   what="a scrape of the operator before the crash")
    assert runs.testbed.node
    node = runs.testbed.node
    pod = runs.get("resumed")["status"]["pod"]
    procs.wait_for(lambda: any(p["pod"] == f"{runs.namespace}/{pod}" and p["running"] for p in node.processes()),
                   timeout=60, what=f"pod {pod}'s runner process")
    node.kill(runs.namespace, pod)
    # A disruption too: someone deletes the pod of the long run; it resumes without consuming maxRestarts.
    runs.testbed.kubectl("delete", "pod", runs.get("ongoing")["status"]["pod"], "-n", runs.namespace, "--wait=false")
    runs.wait_phase("resumed", "Succeeded", timeout=90)
    capped = runs.wait_phase("capped", "Aborted", timeout=60)
    assert capped["status"]["abortReason"] == "BudgetExhausted"

    # DurableRunAborted fires for the aborted run, with its labels.
    alerts = procs.wait_for(lambda: firing(prometheus).get(("DurableRunAborted", runs.namespace, "capped")),
                            timeout=90, what="DurableRunAborted to fire")
    assert alerts["reason"] == "BudgetExhausted"
    assert alerts["severity"] == "critical"

    # Metric values equal the status they come from.
    resumed = runs.get("resumed")["status"]
    selector = f'namespace="{runs.namespace}", name="resumed"'

    def matches() -> bool:
        return (scalar(prometheus, f"durablerun_run_status_restarts{{{selector}}}") == resumed["restarts"]
                and scalar(prometheus, f"durablerun_run_completed_steps{{{selector}}}")
                == resumed["progress"]["completedSteps"]
                and scalar(prometheus, f"durablerun_run_cost_usd{{{selector}}}") == float(resumed["cost"]["usd"])
                and scalar(prometheus, f'durablerun_run_phase{{{selector}, phase="Succeeded"}}') == 1)

    procs.wait_for(matches, timeout=90, what="the metrics of the resumed run to match its status")
    assert resumed["restarts"] == 1
    crash = prometheus.query(f'durablerun_run_restarts_total{{{selector}, reason="Crash"}}')
    assert float(crash[0]["value"][1]) == 1
    procs.wait_for(lambda: prometheus.query("durablerun_resume_latency_seconds_count > 0"), timeout=90,
                   what="a resume latency observation")

    # Every panel's query returns data from this Prometheus.
    dashboard = json.loads(DASHBOARD.read_text())
    values = resolve_variables(prometheus, dashboard, absent=frozenset({"webhook_job"}))
    empty = []
    for panel in panels(dashboard):
        for target in panel.get("targets", []):
            if any(series in target["expr"] for series in OPTIONAL_SERIES):
                continue
            expr = substitute(target["expr"], values)
            if not has_numbers(run_target(prometheus, expr, bool(target.get("instant")), started)):
                empty.append(f"{panel['title']}: {expr}")
    assert not empty, "dashboard queries without data:\n" + "\n".join(empty)
