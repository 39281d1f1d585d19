"""Feeding RunMetrics as the operator does, and reading back what Prometheus and the shipped dashboard make of it.

Shared by the Prometheus tests here, the operator's end-to-end metrics test and the chart's ServiceMonitor test.
"""

from __future__ import annotations

import math
import re
import time
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import yaml

from durablerun import api, resource
from durablerun_operator import metrics
from durablerun_testbed.prometheus import Prometheus

REPO = Path(__file__).resolve().parents[2]
RULES = REPO / "deploy" / "monitoring" / "durablerun-rules.yaml"
DASHBOARD = REPO / "deploy" / "monitoring" / "durablerun-dashboard.json"
WAIT = 30.0  # seconds; Prometheus scrapes and evaluates every second


def iso(moment: datetime) -> str:
    return moment.strftime("%Y-%m-%dT%H:%M:%S.%fZ")


@dataclass
class FakeOperator:
    """Feeds RunMetrics the way the reconciler does: a status as written to the DurableRun, then events."""

    metrics: metrics.RunMetrics

    def observe(self, namespace: str, name: str, policy: resource.Policy | None = None, **status: Any) -> None:
        started = time.perf_counter()
        self.metrics.observe_run(namespace, name, resource.DurableRunStatus.model_validate(status),
                                 policy or resource.Policy(), api.now())
        self.metrics.observe_reconcile(time.perf_counter() - started + 0.004)


def now(offset_seconds: float = 0) -> str:
    """The time ``offset_seconds`` from now, as the operator writes status times."""
    return iso(api.now() + timedelta(seconds=offset_seconds))


def running(epoch: int, completed: int, total: int | None, usd: str, tokens: int, **extra: Any) -> dict[str, Any]:
    """A healthy Running status: lease just renewed, a step and a checkpoint a few seconds ago."""
    progress: dict[str, Any] = {"step": completed + 1, "stepName": "call_model", "completedSteps": completed,
                                "lastProgressTime": now(-4)}
    if total:
        progress |= {"totalSteps": total, "fraction": f"{completed / total:.4f}"}
    status: dict[str, Any] = {
        "phase": "Running", "attempt": epoch, "epoch": epoch, "pod": f"pod-a{epoch}",
        "lease": {"holder": f"pod-a{epoch}", "epoch": epoch, "acquireTime": now(-60), "renewTime": now(-3),
                  "durationSeconds": 60},
        "progress": progress,
        "cost": {"usd": usd, "tokens": tokens},
        "checkpoint": {"position": completed, "key": f"journal/{completed:08d}.json", "time": now(-4)},
        "startTime": now(-3600),
    }
    return status | extra


def rules_for_test(tmp_path: Path) -> Path:
    """The shipped rules with every `for` at 0s (the expressions are unchanged)."""
    body = yaml.safe_load(RULES.read_text())
    for group in body["groups"]:
        for rule in group["rules"]:
            rule["for"] = "0s"
    path = tmp_path / "durablerun-rules.yaml"
    path.write_text(yaml.safe_dump(body, sort_keys=False))
    return path


def firing(prometheus: Prometheus) -> dict[tuple[str, str, str], dict[str, str]]:
    """Firing alerts by (alertname, namespace, name), with their labels."""
    return {
        (a["labels"]["alertname"], a["labels"].get("namespace", ""), a["labels"].get("name", "")): a["labels"]
        for a in prometheus.api("alerts")["alerts"] if a["state"] == "firing"
    }


def scalar(prometheus: Prometheus, promql: str) -> float:
    result = prometheus.query(promql)
    assert len(result) == 1, f"{promql}: {result}"
    return float(result[0]["value"][1])


# --- the dashboard as Grafana would run it --------------------------------------------------------


def panels(dashboard: dict[str, Any]) -> Iterator[dict[str, Any]]:
    for panel in dashboard["panels"]:
        if panel["type"] == "row":
            yield from panel.get("panels", [])
        else:
            yield panel


def resolve_variables(prometheus: Prometheus, dashboard: dict[str, Any],
                      absent: frozenset[str] = frozenset()) -> dict[str, str]:
    """Each variable's value with "All" selected: the regex Grafana substitutes. Variables named in ``absent``
    belong to a component this Prometheus does not scrape and match nothing."""
    values: dict[str, str] = {"__rate_interval": "1m", "__interval": "15s", "__range": "5m"}
    for variable in dashboard["templating"]["list"]:
        if variable["type"] != "query":
            continue
        if variable["name"] in absent:
            values[variable["name"]] = "()"
            continue
        query = variable["query"]["query"]
        match = re.fullmatch(r"label_values\((.+),\s*(\w+)\)", query)
        assert match, f"variable {variable['name']}: unsupported query {query}"
        selector = substitute(match.group(1), values)
        found = prometheus.api(f"label/{match.group(2)}/values", **{"match[]": selector})
        assert found, f"variable {variable['name']} ({query}) has no values"
        values[variable["name"]] = variable.get("allValue") or "(" + "|".join(grafana_escape(v) for v in found) + ")"
    return values


def grafana_escape(value: str) -> str:
    """How Grafana's Prometheus data source escapes one value of a multi-value variable."""
    return re.sub(r"([$^*{}\[\]'+?.()|])", r"\\\\\1", value)


def substitute(expr: str, values: dict[str, str]) -> str:
    def value(match: re.Match[str]) -> str:
        name = match.group(1) or match.group(2)
        assert name in values, f"unknown variable ${name} in {expr}"
        return values[name]

    result = re.sub(r"\$\{(\w+)\}|\$(\w+)", value, expr)
    assert "$" not in result, result
    return result


def run_target(prometheus: Prometheus, expr: str, instant: bool, start: float) -> list[dict[str, Any]]:
    if instant:
        return prometheus.query(expr)
    result: list[dict[str, Any]] = prometheus.api(
        "query_range", query=expr, start=f"{start:.3f}", end=f"{time.time():.3f}", step="1")["result"]
    return result


def has_numbers(result: list[dict[str, Any]]) -> bool:
    samples = [s["value"] for s in result if "value" in s] + [v for s in result for v in s.get("values", [])]
    return any(not math.isnan(float(v[1])) for v in samples)
