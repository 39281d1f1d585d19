"""The dashboard's structure (a lint, as kubernetes-mixin runs one), and names that agree across the metrics,
the rules, the dashboard and the docs. Offline: the queries themselves run against Prometheus in
test_prometheus_e2e.py."""

from __future__ import annotations

import json
import re
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
import yaml
from prometheus_client import CollectorRegistry

from durablerun import api, resource
from durablerun_operator import metrics
from durablerun_operator.ingress import counters

REPO = Path(__file__).resolve().parents[2]
DASHBOARD = REPO / "deploy" / "monitoring" / "durablerun-dashboard.json"
CHART_DASHBOARD = REPO / "charts" / "durable-run" / "files" / "durablerun-dashboard.json"
RULES = REPO / "deploy" / "monitoring" / "durablerun-rules.yaml"
METRICS_DOC = REPO / "docs" / "metrics.md"


@pytest.fixture(scope="module")
def dashboard() -> dict[str, Any]:
    body: dict[str, Any] = json.loads(DASHBOARD.read_text())
    return body


def panels(dashboard: dict[str, Any]) -> list[dict[str, Any]]:
    return [p for p in dashboard["panels"] if p["type"] != "row"]


def exposed_names() -> set[str]:
    """Every sample name RunMetrics exposes once every optional series is present."""
    registry = CollectorRegistry()
    run_metrics = metrics.RunMetrics(registry)
    status = resource.DurableRunStatus.model_validate({
        "phase": "Aborted", "abortReason": "UserRequested",
        "progress": {"completedSteps": 1, "totalSteps": 2, "lastProgressTime": "2025-01-01T00:00:00Z"},
        "checkpoint": {"time": "2025-01-01T00:00:00Z"}, "lease": {"renewTime": "2025-01-01T00:00:00Z"},
        "childrenTotal": {"runs": 1, "usd": "0.1"}, "traceID": "0af7651916cd43dd8448eb211c80319c",
    })
    policy = resource.Policy(costCeilingUSD="1", maxTokens=1, maxSteps=1)
    run_metrics.observe_run("ns", "aborted", status, policy, datetime.now(UTC))
    run_metrics.observe_run("ns", "running", status.model_copy(update={"phase": api.Phase.RUNNING}), policy,
                            datetime.now(UTC))
    run_metrics.observe_run("ns", "queued", status.model_copy(update={"phase": api.Phase.QUEUED}), policy,
                            datetime.now(UTC))
    run_metrics.observe_run("ns", "asks", status.model_copy(update={
        "phase": api.Phase.WAITING, "waitingFor": resource.WaitingFor(budget=resource.ASK_COST)}), policy,
        datetime.now(UTC))
    throttled = resource.WaitingFor(quota="gpt-4o", wakeTime="2025-01-01T00:01:00Z")
    run_metrics.observe_run("ns", "throttled", status.model_copy(update={
        "phase": api.Phase.WAITING, "waitingFor": throttled}), policy, datetime.now(UTC))
    run_metrics.observe_quota("gpt-4o", 60000, 500, (1000.0, 2.0, 1), 1)
    run_metrics.observe_quota_counts("gpt-4o", (3, (1, 1, 0, 0, 0, 0, 0, 0), 0.5))
    names = {sample.name for family in registry.collect() for sample in family.samples}
    # The webhook ingress's series (its own process and registry).
    return names | {sample.name for metric in (counters.REQUESTS, counters.LATENCY)
                    for family in metric.collect() for sample in family.samples}


def referenced_names(text: str) -> set[str]:
    return set(re.findall(r"\b(durablerun_[a-z_]+)\b", text))


def test_the_chart_ships_the_same_dashboard() -> None:
    assert CHART_DASHBOARD.read_text() == DASHBOARD.read_text()


def test_variables_for_datasource_job_and_namespace(dashboard: dict[str, Any]) -> None:
    variables = {v["name"]: v for v in dashboard["templating"]["list"]}
    assert variables["datasource"]["type"] == "datasource"
    assert variables["datasource"]["query"] == "prometheus"
    assert variables["namespace"]["query"]["query"].startswith("label_values(durablerun_run_phase")
    assert variables["namespace"]["includeAll"]
    assert variables["namespace"]["multi"]
    assert variables["job"]["query"]["query"] == "label_values(durablerun_build_info, job)"
    # "All" jobs must expand to the jobs found: ".+" would count every target in `up`.
    assert "allValue" not in variables["job"]


def test_every_query_uses_the_datasource_variable(dashboard: dict[str, Any]) -> None:
    for panel in panels(dashboard):
        assert panel["datasource"] == {"type": "prometheus", "uid": "${datasource}"}, panel["title"]
        assert panel["targets"], panel["title"]
        for target in panel["targets"]:
            assert target["datasource"] == {"type": "prometheus", "uid": "${datasource}"}, panel["title"]


def test_per_run_selectors_filter_by_job_and_namespace(dashboard: dict[str, Any]) -> None:
    for panel in panels(dashboard):
        for target in panel["targets"]:
            expr = target["expr"]
            for metric in re.findall(r"\bdurablerun_run_\w+", expr):
                selectors = re.findall(rf"\b{metric}\{{([^}}]*)\}}", expr)
                assert selectors, f"{panel['title']}: {metric} without a selector"
                for selector in selectors:
                    assert 'namespace=~"$namespace"' in selector, f"{panel['title']}: {expr}"
                    assert 'job=~"$job"' in selector, f"{panel['title']}: {expr}"
            for metric in re.findall(r"\b(?:durablerun_(?!run_|webhook_)\w+|process_\w+|up)\{([^}]*)\}", expr):
                assert 'job=~"$job"' in metric, f"{panel['title']}: {expr}"
            for metric in re.findall(r"\bdurablerun_webhook_\w+\{([^}]*)\}", expr):  # the ingress's own job
                assert 'job=~"$webhook_job"' in metric, f"{panel['title']}: {expr}"


def test_layout_ids_and_descriptions(dashboard: dict[str, Any]) -> None:
    ids = [p["id"] for p in dashboard["panels"]]
    assert len(ids) == len(set(ids))
    cells: set[tuple[int, int]] = set()
    for panel in dashboard["panels"]:
        grid = panel["gridPos"]
        assert grid["x"] >= 0, panel["title"]
        assert grid["x"] + grid["w"] <= 24, panel["title"]
        area = {(x, y) for x in range(grid["x"], grid["x"] + grid["w"])
                for y in range(grid["y"], grid["y"] + grid["h"])}
        assert not area & cells, f"{panel['title']} overlaps another panel"
        cells |= area
    for panel in panels(dashboard):
        assert panel["description"], panel["title"]
        ref_ids = [t["refId"] for t in panel["targets"]]
        assert len(ref_ids) == len(set(ref_ids)), panel["title"]


def test_the_panels_the_issue_asks_for(dashboard: dict[str, Any]) -> None:
    titles = {p["title"] for p in panels(dashboard)}
    for wanted in ("Runs by phase", "Progress per run", "Cost by namespace", "Restarts by reason",
                   "Aborted runs", "Staleness of active runs", "Resume latency", "Operator up", "Reconciles",
                   "Webhook requests by outcome", "Webhook answer time"):
        assert wanted in titles
    aborted = next(p for p in panels(dashboard) if p["title"] == "Aborted runs")
    assert aborted["type"] == "table"
    assert "reason" in aborted["targets"][0]["expr"]
    resume = next(p for p in panels(dashboard) if p["title"] == "Resume latency")
    assert {t["legendFormat"] for t in resume["targets"]} == {"p50", "p90", "p99"}


def test_staleness_cells_take_their_threshold_colour(dashboard: dict[str, Any]) -> None:
    stale = next(p for p in panels(dashboard) if p["title"] == "Staleness of active runs")
    defaults = stale["fieldConfig"]["defaults"]
    assert defaults["custom"]["cellOptions"] == {"type": "color-text"}
    assert defaults["unit"] == "s"
    assert [(s["value"], s["color"]) for s in defaults["thresholds"]["steps"]] == [
        (None, "green"), (300, "yellow"), (600, "red")]


def test_rules_and_dashboard_use_only_metrics_that_exist() -> None:
    exposed = exposed_names()
    for path in (RULES, DASHBOARD):
        unknown = referenced_names(path.read_text()) - exposed
        assert not unknown, f"{path.name} refers to metrics the operator does not expose: {unknown}"


def test_every_metric_is_documented() -> None:
    documented = METRICS_DOC.read_text()
    # (prometheus-client's automatic *_created samples of counters and histograms aside)
    for name in exposed_names() - {n for n in exposed_names() if n.endswith("_created")}:
        family = re.sub(r"_(bucket|count|sum)$", "", name)
        assert f"`{family}`" in documented or f"`{name}`" in documented, f"docs/metrics.md lacks {family}"


def test_generated_outputs_say_so() -> None:
    assert "Do not edit" in RULES.read_text().splitlines()[0]
    assert "Do not edit" in json.loads(DASHBOARD.read_text())["__generated"]
    rules = yaml.safe_load(RULES.read_text())
    assert [g["name"] for g in rules["groups"]] == ["durablerun.runs", "durablerun.operator", "durablerun.quotas"]


def test_a_run_links_to_its_trace_through_the_trace_link_variable(dashboard: dict[str, Any]) -> None:
    variables = {v["name"]: v for v in dashboard["templating"]["list"]}
    assert variables["trace_url"]["type"] == "textbox"
    traces = next(p for p in panels(dashboard) if p["title"] == "Runs and their traces")
    assert "durablerun_run_trace" in traces["targets"][0]["expr"]
    (override,) = traces["fieldConfig"]["overrides"]
    assert override["matcher"] == {"id": "byName", "options": "trace_id"}
    (link,) = next(p["value"] for p in override["properties"] if p["id"] == "links")
    assert link["url"] == "${trace_url}${__value.raw}"
