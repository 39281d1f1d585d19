"""A real Prometheus scrapes RunMetrics fed like the operator feeds it, evaluates the shipped rules and answers
every query of the shipped dashboard.

The operator is simulated at the metrics API (observe_run / record_* with
statuses as the operator writes them); the end-to-end test against the real
operator lives with the operator's tests. Rules are the generated file with
every ``for`` set to 0s, so alerts fire within a few evaluation intervals.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry, ProcessCollector, start_http_server

from durablerun import resource
from durablerun_operator import metrics
from durablerun_operator.ingress import counters
from durablerun_testbed import procs
from tests.helpers.prometheus import (
    DASHBOARD,
    WAIT,
    FakeOperator,
    firing,
    has_numbers,
    now,
    panels,
    resolve_variables,
    rules_for_test,
    run_target,
    running,
    scalar,
    substitute,
)
from tests.helpers.session import StartPrometheus


@pytest.fixture
def served(tmp_path: Path) -> Iterator[tuple[metrics.RunMetrics, FakeOperator]]:
    registry = CollectorRegistry()
    ProcessCollector(registry=registry)  # the operator uses the default registry, which has these
    run_metrics = metrics.RunMetrics(registry)
    run_metrics.serve(0, "127.0.0.1")
    yield run_metrics, FakeOperator(run_metrics)
    run_metrics.stop()


@pytest.fixture
def ingress_served() -> Iterator[int]:
    """The webhook ingress's series (its Counter and Histogram, as its process serves them) on a port."""
    registry = CollectorRegistry()
    registry.register(counters.REQUESTS)
    registry.register(counters.LATENCY)
    http, thread = start_http_server(0, addr="127.0.0.1", registry=registry)
    yield int(http.server_port)
    http.shutdown()
    http.server_close()
    thread.join(timeout=10)


# --- the test --------------------------------------------------------------------------------------


def test_prometheus_scrapes_alerts_and_answers_every_dashboard_query(
    start_prometheus: StartPrometheus, served: tuple[metrics.RunMetrics, FakeOperator], ingress_served: int,
    tmp_path: Path
) -> None:
    run_metrics, operator = served
    started = time.time()
    ceiling_25 = resource.Policy(costCeilingUSD="25.00")
    # Eight runs in two namespaces, as the operator would observe them.
    operator.observe("research", "survey", ceiling_25, **running(1, 12, 40, "1.75", 42_000)
                     | {"traceID": "0af7651916cd43dd8448eb211c80319c"})
    operator.observe("research", "costly", ceiling_25, **running(1, 30, None, "23.10", 910_000))
    operator.observe("research", "notes", **running(2, 7, None, "0.40", 9_000) | {
        "phase": "Waiting", "waitingFor": {"event": "approval", "since": now(-300)}})
    operator.observe("research", "done", **running(1, 20, 20, "3.00", 70_000) | {
        "phase": "Succeeded", "outcome": "Completed", "completionTime": now(-120)})
    operator.observe("ml", "flaky", **running(1, 5, 50, "0.90", 15_000))
    operator.observe("ml", "pricey", resource.Policy(costCeilingUSD="10"), **running(1, 60, 100, "8.00", 400_000))
    hung = running(1, 3, 30, "0.20", 2_000)
    hung["progress"]["lastProgressTime"] = now(-1200)  # progressTimeout is 10m
    hung["lease"]["renewTime"] = now(-300)  # leaseDuration is 60s
    operator.observe("ml", "hung", **hung)
    # Waiting for Kueue to admit its next attempt (the Queued runs panel).
    operator.observe("ml", "queued", **running(1, 2, None, "0.10", 1_000) | {"phase": "Queued"})
    observed_hung = time.monotonic()
    # A model quota's windows, as the operator reads them from the runners' Redis (the "Model quotas" row).
    run_metrics.observe_quota("gpt-4o", 60_000, 500, (41_200.0, 120.0, 3), 2)
    run_metrics.observe_quota_counts("gpt-4o", (12, (40, 9, 3, 1, 0, 0, 0, 0), 95.0))

    prometheus = start_prometheus([f"127.0.0.1:{run_metrics.port}", f"127.0.0.1:{ingress_served}"],
                                  rule_files=[rules_for_test(tmp_path)])
    # Counters are scraped at 0 before anything happens, as in a cluster.
    procs.wait_for(lambda: prometheus.query('durablerun_run_restarts_total{name="flaky", reason="Crash"} == 0'),
                   timeout=WAIT, what="the first scrape")
    procs.wait_for(lambda: prometheus.query(f'up{{instance="127.0.0.1:{ingress_served}"}} == 1'),
                   timeout=WAIT, what="the ingress's first scrape")
    for outcome, seconds in (("delivered", 0.004), ("delivered", 0.03), ("unauthorized", 0.002)):  # webhooks
        counters.REQUESTS.labels(outcome).inc()
        counters.LATENCY.observe(seconds)

    # ml/flaky crashes, is OOM-killed and evicted; each time a new attempt resumes it.
    for epoch, (reason, latency, completed) in enumerate(
        (("Crash", 11.8, 7), ("OOMKilled", 23.4, 9), ("Evicted", 4.2, 12)), start=2
    ):
        restarts = min(epoch - 1, 2)
        disruptions = 1 if reason == "Evicted" else 0
        run_metrics.record_restart("ml", "flaky", reason)
        operator.observe("ml", "flaky", **running(epoch - 1, completed - 2, 50, "0.90", 15_000) | {
            "phase": "Pending" if disruptions else "Backoff", "restarts": restarts, "disruptions": disruptions,
            "lastPodEndTime": now()})
        run_metrics.observe_resume_latency(latency)
        operator.observe("ml", "flaky", **running(epoch, completed, 50, f"{0.9 + epoch / 10:.2f}", 15_000 * epoch)
                         | {"restarts": restarts, "disruptions": disruptions})
    # ml/pricey reaches its ceiling and is aborted.
    run_metrics.record_abort("ml", "pricey", "BudgetExhausted")
    run_metrics.record_completion("ml", "pricey", "Aborted")
    operator.observe("ml", "pricey", resource.Policy(costCeilingUSD="10"), **running(1, 71, 100, "10.02", 480_000) | {
        "phase": "Aborted", "abortReason": "BudgetExhausted", "outcome": "Aborted", "completionTime": now()})
    procs.wait_for(lambda: prometheus.query('durablerun_run_abort_reason{name="pricey"}'),
                   timeout=WAIT, what="the abort in Prometheus")
    # The runners' counts in the quota's windows grow (12 -> 15 refusals; 13 more grants, one of them slow).
    run_metrics.observe_quota_counts("gpt-4o", (15, (50, 14, 4, 1, 1, 0, 0, 0), 400.0))
    procs.wait_for(lambda: prometheus.query('durablerun_quota_provider_rejections_total{quota="gpt-4o"} == 15'),
                   timeout=WAIT, what="the quota's counts in Prometheus")

    # --- metric values match the statuses they come from -------------------------------------------------
    run = 'namespace="{}", name="{}"'.format
    assert scalar(prometheus, f"durablerun_run_progress_ratio{{{run('research', 'survey')}}}") == 0.3
    assert scalar(prometheus, f"durablerun_run_completed_steps{{{run('research', 'survey')}}}") == 12
    assert scalar(prometheus, f"durablerun_run_cost_usd{{{run('research', 'survey')}}}") == 1.75
    assert scalar(prometheus, f"durablerun_run_tokens{{{run('research', 'survey')}}}") == 42_000
    assert scalar(prometheus, f"durablerun_run_cost_ceiling_usd{{{run('research', 'survey')}}}") == 25
    assert scalar(prometheus, f"durablerun_run_progress_ratio{{{run('ml', 'flaky')}}}") == 0.24
    assert scalar(prometheus, f"durablerun_run_status_restarts{{{run('ml', 'flaky')}}}") == 2
    assert scalar(prometheus, f"durablerun_run_status_disruptions{{{run('ml', 'flaky')}}}") == 1
    by_reason = {r["metric"]["reason"]: float(r["value"][1]) for r in prometheus.query(
        f"durablerun_run_restarts_total{{{run('ml', 'flaky')}}} > 0")}
    assert by_reason == {"Crash": 1, "OOMKilled": 1, "Evicted": 1}
    assert scalar(prometheus, f'durablerun_run_phase{{{run("ml", "pricey")}, phase="Aborted"}}') == 1
    assert scalar(prometheus, f"sum(durablerun_run_phase{{{run('ml', 'pricey')}}})") == 1
    assert scalar(prometheus, f'durablerun_run_abort_reason{{{run("ml", "pricey")}, reason="BudgetExhausted"}}') == 1
    assert scalar(prometheus, f"durablerun_run_cost_usd{{{run('ml', 'pricey')}}}") == 10.02
    assert scalar(prometheus, "durablerun_resume_latency_seconds_count") == 3
    assert scalar(prometheus, "durablerun_resume_latency_seconds_sum") == pytest.approx(39.4)
    assert scalar(prometheus, 'durablerun_quota_grant_wait_seconds_count{quota="gpt-4o"}') == 70
    assert scalar(prometheus, 'durablerun_quota_grant_wait_seconds_bucket{quota="gpt-4o", le="60.0"}') == 69
    # Staleness is computed at scrape time: it grows from scrape to scrape with no new observation.
    since_hung = f"durablerun_run_seconds_since_progress{{{run('ml', 'hung')}}}"
    first = scalar(prometheus, since_hung)
    # 1200s old when observed, plus however long ago that was (a scrape can only lag behind).
    assert 1200 <= first <= 1200 + (time.monotonic() - observed_hung) + 1
    procs.wait_for(lambda: scalar(prometheus, since_hung) >= first + 2, timeout=WAIT,
                   what="seconds since progress to grow between scrapes")

    # --- alerts: exactly the expected ones fire ------------------------------------------------------------
    expected = {
        ("DurableRunAborted", "ml", "pricey"),
        ("DurableRunRestartLoop", "ml", "flaky"),
        ("DurableRunStuck", "ml", "hung"),
        ("DurableRunLeaseStale", "ml", "hung"),
        ("DurableRunBudgetNearCeiling", "research", "costly"),
    }
    procs.wait_for(lambda: set(firing(prometheus)) == expected, timeout=WAIT,
                   what=f"exactly {sorted(expected)} firing")
    alerts = firing(prometheus)
    assert alerts[("DurableRunAborted", "ml", "pricey")] == {
        "alertname": "DurableRunAborted", "namespace": "ml", "name": "pricey", "reason": "BudgetExhausted",
        "severity": "critical",
    }
    assert alerts[("DurableRunBudgetNearCeiling", "research", "costly")]["budget"] == "cost"
    active = {a["labels"]["alertname"]: a for a in prometheus.api("alerts")["alerts"]}
    assert active["DurableRunAborted"]["annotations"]["description"].startswith(
        "DurableRun ml/pricey was aborted: BudgetExhausted.")
    assert active["DurableRunAborted"]["annotations"]["runbook_url"].endswith("docs/runbooks.md#durablerunaborted")

    # --- every dashboard query returns data ------------------------------------------------------------------
    dashboard = json.loads(DASHBOARD.read_text())
    values = resolve_variables(prometheus, dashboard)
    assert values["job"] == "(durablerun-operator)"
    namespaces = prometheus.api("label/namespace/values", **{"match[]": "durablerun_run_phase"})
    assert sorted(namespaces) == ["ml", "research"]
    failures, checked = [], 0
    for panel in panels(dashboard):
        for target in panel["targets"]:
            expr = substitute(target["expr"], values)
            try:
                result = run_target(prometheus, expr, target["instant"], started)
            except Exception as error:  # report every broken query at once
                failures.append(f"{panel['title']} [{target['refId']}]: {expr}: {error}")
                continue
            checked += 1
            if not has_numbers(result):
                failures.append(f"{panel['title']} [{target['refId']}]: no data: {expr}")
    assert not failures, "\n".join(failures)
    assert checked >= 25

    # One namespace selected: a per-run panel shows only that namespace's runs.
    progress = next(p for p in panels(dashboard) if p["title"] == "Progress per run")["targets"][0]["expr"]
    shown = prometheus.query(substitute(progress, values | {"namespace": "research"}))
    assert {r["metric"]["name"] for r in shown} == {"survey", "done"}


def test_a_deleted_run_disappears_and_a_stopped_operator_alerts(
    start_prometheus: StartPrometheus, served: tuple[metrics.RunMetrics, FakeOperator], tmp_path: Path
) -> None:
    run_metrics, operator = served
    operator.observe("ml", "gone", **running(1, 2, 4, "0.10", 100))
    operator.observe("ml", "kept", **running(1, 3, 4, "0.20", 200))
    run_metrics.record_restart("ml", "gone", "Crash")
    prometheus = start_prometheus([f"127.0.0.1:{run_metrics.port}"], rule_files=[rules_for_test(tmp_path)])
    every_series_of = 'count({__name__=~"durablerun_.+", namespace="ml", name="%s"})'
    procs.wait_for(lambda: prometheus.query(every_series_of % "gone"), timeout=WAIT, what="the run scraped")
    assert scalar(prometheus, every_series_of % "gone") == scalar(prometheus, every_series_of % "kept")
    # (Before the first scrape, the operator looked absent: wait for that to clear.)
    procs.wait_for(lambda: not firing(prometheus), timeout=WAIT, what="no alert for two healthy runs")

    # The DurableRun is deleted: every one of its series goes stale at the next scrape.
    run_metrics.forget_run("ml", "gone")
    procs.wait_for(lambda: not prometheus.query(every_series_of % "gone"), timeout=WAIT,
                   what="the deleted run's series to disappear")
    assert scalar(prometheus, 'durablerun_run_cost_usd{namespace="ml", name="kept"}') == 0.2

    # The operator stops: its build_info goes stale and DurableRunOperatorDown fires.
    run_metrics.stop()
    procs.wait_for(lambda: ("DurableRunOperatorDown", "", "") in firing(prometheus), timeout=WAIT,
                   what="DurableRunOperatorDown firing")
    assert firing(prometheus)[("DurableRunOperatorDown", "", "")] == {
        "alertname": "DurableRunOperatorDown", "severity": "critical"}
    assert scalar(prometheus, 'up{job="durablerun-operator"}') == 0
