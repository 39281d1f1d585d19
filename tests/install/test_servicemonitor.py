"""The chart's ServiceMonitor, scraped by a real Prometheus the way the Prometheus Operator would scrape it.

Per-run series carry their run's `namespace` label. A ServiceMonitor's target carries a `namespace` label
too (the operator's), so without `honorLabels: true` Prometheus keeps the target's and renames the run's to
`exported_namespace`: every per-run alert and panel would then be grouped under the operator's namespace.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from prometheus_client import CollectorRegistry, start_http_server

from durablerun_operator import metrics
from durablerun_operator.ingress import counters
from durablerun_testbed import procs
from durablerun_testbed.prometheus import Prometheus, ServiceMonitorTarget
from tests.helpers.clis import Helm, Manifest
from tests.helpers.prometheus import FakeOperator, running
from tests.helpers.session import StartPrometheus

from .helpers import one

RELEASE_NAMESPACE = "durable-run"
WAIT = 30.0  # seconds; Prometheus scrapes every second


@pytest.fixture
def operator_metrics() -> Iterator[tuple[metrics.RunMetrics, FakeOperator]]:
    run_metrics = metrics.RunMetrics(CollectorRegistry())
    run_metrics.serve(0, "127.0.0.1")
    operator = FakeOperator(run_metrics)
    operator.observe("team-a", "survey", **running(1, 3, 10, "0.50", 1_000))
    operator.observe("team-b", "notes", **running(2, 5, None, "1.25", 9_000))
    yield run_metrics, operator
    run_metrics.stop()


def rendered(tmp_path: Path, service_monitor: Manifest) -> ServiceMonitorTarget:
    helm = Helm(tmp_path / "helm")
    helm.home.mkdir()
    objects = helm.template("durable-run", RELEASE_NAMESPACE, {"metrics": {"serviceMonitor": service_monitor}})
    return ServiceMonitorTarget(one(objects, "ServiceMonitor"), one(objects, "Service"), pod="durable-run-7d9f-x2k")


def scrape(start_prometheus: StartPrometheus, run_metrics: metrics.RunMetrics,
           target: ServiceMonitorTarget) -> Prometheus:
    prometheus = start_prometheus([f"127.0.0.1:{run_metrics.port}"], service_monitor=target)
    procs.wait_for(lambda: prometheus.query("durablerun_run_phase"), timeout=WAIT, what="the first scrape")
    return prometheus


def series(prometheus: Prometheus, promql: str) -> list[dict[str, Any]]:
    return [sample["metric"] for sample in prometheus.query(promql)]


def test_per_run_series_keep_their_namespace(
    start_prometheus: StartPrometheus, operator_metrics: tuple[metrics.RunMetrics, FakeOperator], tmp_path: Path
) -> None:
    run_metrics, _ = operator_metrics
    target = rendered(tmp_path, {"enabled": True})  # the chart's defaults
    prometheus = scrape(start_prometheus, run_metrics, target)

    phases = series(prometheus, 'durablerun_run_phase{phase="Running"}')
    assert sorted((s["namespace"], s["name"]) for s in phases) == [("team-a", "survey"), ("team-b", "notes")]
    assert not series(prometheus, '{exported_namespace!=""}')
    # The target's labels still reach series that have none of their own (the operator's own metrics).
    (reconciles,) = series(prometheus, "durablerun_reconcile_duration_seconds_count")
    assert reconciles["namespace"] == RELEASE_NAMESPACE
    assert reconciles["service"] == target.service["metadata"]["name"]
    assert reconciles["pod"] == target.pod
    assert reconciles["job"] == "durable-run"


def test_without_honor_labels_the_operators_namespace_takes_over(
    start_prometheus: StartPrometheus, operator_metrics: tuple[metrics.RunMetrics, FakeOperator], tmp_path: Path
) -> None:
    """What the test above guards against: the same scrape with honorLabels off renames the runs' namespace."""
    run_metrics, _ = operator_metrics
    prometheus = scrape(start_prometheus, run_metrics, rendered(tmp_path, {"enabled": True, "honorLabels": False}))
    phases = series(prometheus, 'durablerun_run_phase{phase="Running"}')
    assert sorted((s["namespace"], s["exported_namespace"]) for s in phases) == [
        (RELEASE_NAMESPACE, "team-a"), (RELEASE_NAMESPACE, "team-b")]


def test_relabelings_and_metric_relabelings_apply(
    start_prometheus: StartPrometheus, operator_metrics: tuple[metrics.RunMetrics, FakeOperator], tmp_path: Path
) -> None:
    run_metrics, _ = operator_metrics
    target = rendered(tmp_path, {
        "enabled": True,
        "relabelings": [{"action": "replace", "targetLabel": "cluster", "replacement": "prod-eu"}],
        "metricRelabelings": [{"action": "drop", "sourceLabels": ["__name__"],
                               "regex": "durablerun_run_cost_usd"}],
    })
    prometheus = scrape(start_prometheus, run_metrics, target)
    assert {s["cluster"] for s in series(prometheus, "durablerun_run_phase")} == {"prod-eu"}
    assert series(prometheus, "durablerun_run_completed_steps")
    assert not series(prometheus, "durablerun_run_cost_usd")


def test_the_webhook_ingress_is_scraped_by_its_own_service_monitor(
    start_prometheus: StartPrometheus, tmp_path: Path
) -> None:
    """With webhooks.enabled the chart's second ServiceMonitor finds the ingress's metrics port: the
    dashboard's "Webhook ingress" row has series, under a job of their own."""
    helm = Helm(tmp_path / "helm")
    helm.home.mkdir()
    objects = helm.template("durable-run", RELEASE_NAMESPACE, {
        "metrics": {"serviceMonitor": {"enabled": True}},
        "webhooks": {"enabled": True, "url": "https://hooks.example.com", "namespaces": ["team-a"]}})
    hooks = [o for o in objects if o["metadata"]["name"].endswith("-webhooks")]
    target = ServiceMonitorTarget(one(hooks, "ServiceMonitor"), one(hooks, "Service"), pod="durable-run-webhooks-x",
                                  container="webhooks")
    counters.REQUESTS.labels("delivered").inc()  # the ingress's own series, as its process serves them
    served, thread = start_http_server(0, addr="127.0.0.1")
    try:
        prometheus = start_prometheus([f"127.0.0.1:{served.server_port}"], service_monitor=target)
        procs.wait_for(lambda: prometheus.query("durablerun_webhook_requests_total"), timeout=WAIT,
                       what="the first scrape of the ingress")
        outcomes = series(prometheus, "durablerun_webhook_requests_total")
        assert {s["outcome"] for s in outcomes} == set(counters.OUTCOMES)
        assert {s["job"] for s in outcomes} == {"durable-run-webhooks"}  # not the operator's job
        assert series(prometheus, 'durablerun_webhook_requests_total{outcome="delivered"} > 0')
    finally:
        served.shutdown()
        served.server_close()
        thread.join(timeout=10)
