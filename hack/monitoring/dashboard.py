"""durable-run's Grafana dashboard: runs by phase, progress, cost, restarts, aborts, staleness, operator health.

Every query goes through the ``$datasource`` variable, every per-run query is
filtered by ``$job`` and ``$namespace``. ``$job`` is read from
durablerun_build_info, so the dashboard needs no assumption about how the
operator's scrape job is named.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from monitoring import config

DATASOURCE = {"type": "prometheus", "uid": "${datasource}"}
RUN = config.RUN
SEL = 'job=~"$job", namespace=~"$namespace"'
OP = 'job=~"$job"'
PER_RUN = "{{namespace}}/{{name}}"


def _max(metric: str, selector: str = SEL, by: str = RUN) -> str:
    return f"max by ({by}) ({metric}{{{selector}}})"


@dataclass
class Query:
    expr: str
    legend: str = ""
    instant: bool = False
    table: bool = False

    def target(self, ref_id: str) -> dict[str, Any]:
        return {
            "datasource": DATASOURCE,
            "refId": ref_id,
            "expr": self.expr,
            "legendFormat": self.legend or "__auto",
            "instant": self.instant,
            "range": not self.instant,
            "format": "table" if self.table else "time_series",
        }


@dataclass
class Panel:
    title: str
    kind: str
    description: str
    queries: list[Query]
    width: int = 12
    height: int = 8
    unit: str = "short"
    min: float | None = None
    max: float | None = None
    options: dict[str, Any] = field(default_factory=dict)
    custom: dict[str, Any] = field(default_factory=dict)
    thresholds: list[tuple[float | None, str]] = field(default_factory=lambda: [(None, "green")])
    transformations: list[dict[str, Any]] = field(default_factory=list)
    overrides: list[dict[str, Any]] = field(default_factory=list)

    def render(self, panel_id: int, x: int, y: int) -> dict[str, Any]:
        defaults: dict[str, Any] = {
            "unit": self.unit,
            "thresholds": {"mode": "absolute",
                           "steps": [{"color": color, "value": value} for value, color in self.thresholds]},
            "custom": self.custom,
        }
        if self.min is not None:
            defaults["min"] = self.min
        if self.max is not None:
            defaults["max"] = self.max
        return {
            "id": panel_id,
            "type": self.kind,
            "title": self.title,
            "description": self.description,
            "datasource": DATASOURCE,
            "gridPos": {"h": self.height, "w": self.width, "x": x, "y": y},
            "targets": [q.target(chr(ord("A") + i)) for i, q in enumerate(self.queries)],
            "fieldConfig": {"defaults": defaults, "overrides": self.overrides},
            "options": self.options,
            "transformations": self.transformations,
        }


def _row(title: str, panel_id: int, y: int) -> dict[str, Any]:
    return {"id": panel_id, "type": "row", "title": title, "collapsed": False, "panels": [],
            "gridPos": {"h": 1, "w": 24, "x": 0, "y": y}}


def _timeseries(stack: bool = False, bars: bool = False) -> dict[str, Any]:
    custom: dict[str, Any] = {"drawStyle": "bars" if bars else "line", "fillOpacity": 30 if stack or bars else 10,
                              "lineWidth": 1, "showPoints": "never"}
    if stack:
        custom["stacking"] = {"mode": "normal", "group": "A"}
    return custom


LEGEND = {"legend": {"displayMode": "list", "placement": "bottom", "showLegend": True},
          "tooltip": {"mode": "multi", "sort": "desc"}}
TABLE_OPTIONS = {"showHeader": True, "cellHeight": "sm", "footer": {"show": False}}


def _table_transforms(rename: dict[str, str], hide: tuple[str, ...] = ("Time",)) -> list[dict[str, Any]]:
    """Instant table queries -> one row per run, columns renamed."""
    return [
        {"id": "merge", "options": {}},
        {"id": "organize", "options": {"excludeByName": dict.fromkeys(hide, True), "renameByName": rename}},
    ]


def _stale_table() -> Panel:
    return Panel(
        title="Staleness of active runs",
        kind="table",
        description=(
            "Seconds since each unfinished run last completed a step, last wrote its journal, and (while "
            "Running) last renewed its lease. Computed when Prometheus scrapes, not when the operator last "
            "reconciled."
        ),
        queries=[
            Query(_max("durablerun_run_seconds_since_progress"), instant=True, table=True),
            Query(_max("durablerun_run_seconds_since_checkpoint"), instant=True, table=True),
            Query(_max("durablerun_run_seconds_since_lease_renewal"), instant=True, table=True),
        ],
        width=12, height=9, unit="s",
        thresholds=[(None, "green"), (300, "yellow"), (600, "red")],
        custom={"cellOptions": {"type": "color-text"}},
        options=TABLE_OPTIONS | {"sortBy": [{"displayName": "since progress", "desc": True}]},
        transformations=_table_transforms(
            {"Value #A": "since progress", "Value #B": "since checkpoint", "Value #C": "since lease renewal"}
        ),
    )


def rows() -> list[tuple[str, list[Panel]]]:
    """The dashboard, row by row; panels fill each row left to right (24 columns)."""
    quantiles = (("0.5", "p50"), ("0.9", "p90"), ("0.99", "p99"))
    return [
        ("Runs", [
            Panel(
                title="Runs by phase", kind="stat",
                description="How many DurableRuns are in each phase now.",
                queries=[Query(f"sum by (phase) (durablerun_run_phase{{{SEL}}})", legend="{{phase}}", instant=True)],
                width=10, height=6,
                options={"reduceOptions": {"calcs": ["lastNotNull"], "fields": "", "values": False},
                         "colorMode": "value", "graphMode": "none", "textMode": "value_and_name",
                         "orientation": "auto", "justifyMode": "auto"},
            ),
            Panel(
                title="Runs by phase over time", kind="timeseries",
                description="Runs in each phase, stacked.",
                queries=[Query(f"sum by (phase) (durablerun_run_phase{{{SEL}}})", legend="{{phase}}")],
                width=14, height=6, custom=_timeseries(stack=True), options=LEGEND,
            ),
        ]),
        ("Progress and cost", [
            Panel(
                title="Progress per run", kind="bargauge",
                description="Completed steps as a share of the run's total steps (for runs that declare a total).",
                queries=[Query(_max("durablerun_run_progress_ratio"), legend=PER_RUN, instant=True)],
                unit="percentunit", min=0, max=1,
                thresholds=[(None, "blue"), (1, "green")],
                options={"displayMode": "gradient", "orientation": "horizontal", "showUnfilled": True,
                         "reduceOptions": {"calcs": ["lastNotNull"], "fields": "", "values": False}},
            ),
            Panel(
                title="Budget used per run", kind="bargauge",
                description="Cost, its child runs' included, as a share of the run's policy.costCeilingUSD "
                            "(runs with a ceiling). At 100% the run is aborted (BudgetExhausted).",
                queries=[Query(f"({_max('durablerun_run_cost_usd')} + ({_max('durablerun_run_children_cost_usd')}"
                               f" or {_max('durablerun_run_cost_usd')} * 0)) / "
                               f"{_max('durablerun_run_cost_ceiling_usd')}", legend=PER_RUN, instant=True)],
                unit="percentunit", min=0, max=1,
                thresholds=[(None, "green"), (config.BUDGET_RATIO, "orange"), (1, "red")],
                options={"displayMode": "gradient", "orientation": "horizontal", "showUnfilled": True,
                         "reduceOptions": {"calcs": ["lastNotNull"], "fields": "", "values": False}},
            ),
            Panel(
                title="Cost by namespace", kind="timeseries",
                description="Sum of the cost of the DurableRuns that exist, per namespace, over time "
                            "(a deleted run's cost leaves the sum).",
                queries=[Query(f"sum by (namespace) (durablerun_run_cost_usd{{{SEL}}})", legend="{{namespace}}")],
                width=8, unit="currencyUSD", custom=_timeseries(stack=True), options=LEGEND,
            ),
            Panel(
                title="Top runs by cost", kind="bargauge",
                description="The ten most expensive runs now.",
                queries=[Query(f"topk(10, {_max('durablerun_run_cost_usd')})", legend=PER_RUN, instant=True)],
                width=8, unit="currencyUSD",
                options={"displayMode": "basic", "orientation": "horizontal",
                         "reduceOptions": {"calcs": ["lastNotNull"], "fields": "", "values": False}},
            ),
            Panel(
                title="Tokens by namespace", kind="timeseries",
                description="Sum of the tokens used by the DurableRuns that exist, per namespace.",
                queries=[Query(f"sum by (namespace) (durablerun_run_tokens{{{SEL}}})", legend="{{namespace}}")],
                width=8, custom=_timeseries(stack=True), options=LEGEND,
            ),
        ]),
        ("Restarts and aborts", [
            Panel(
                title="Restarts by reason", kind="timeseries",
                description="Restarts the operator made, by cause: Crash, OOMKilled and LeaseExpired use the "
                            "run's maxRestarts; Evicted, Preempted, NodeLost and PodDeleted its maxDisruptions.",
                queries=[Query(f"sum by (reason) (increase(durablerun_run_restarts_total{{{SEL}}}[$__rate_interval]))",
                               legend="{{reason}}")],
                custom=_timeseries(stack=True, bars=True), options=LEGEND,
            ),
            Panel(
                title="Runs that restarted", kind="table",
                description="status.restarts (crashes, OOM kills, expired leases) and status.disruptions "
                            "(evictions, preemptions, lost nodes, deleted pods) of every run that has any.",
                queries=[
                    Query(_max("durablerun_run_status_restarts") + " > 0", instant=True, table=True),
                    Query(_max("durablerun_run_status_disruptions") + " > 0", instant=True, table=True),
                ],
                options=TABLE_OPTIONS | {"sortBy": [{"displayName": "restarts", "desc": True}]},
                transformations=_table_transforms({"Value #A": "restarts", "Value #B": "disruptions"}),
            ),
            Panel(
                title="Aborted runs", kind="table",
                description="Every DurableRun in phase Aborted, with status.abortReason and its cost. "
                            "DurableRunAborted (or, for an abort by request, DurableRunAbortedByUser) fires for each.",
                queries=[
                    Query(f'max by ({RUN}, reason) (durablerun_run_abort_reason{{{SEL}}}) == 1',
                          instant=True, table=True),
                    Query(f"{_max('durablerun_run_cost_usd')} and on ({RUN}) "
                          f"max by ({RUN}) (durablerun_run_abort_reason{{{SEL}}}) == 1",
                          instant=True, table=True),
                ],
                width=12, height=9, unit="currencyUSD",
                options=TABLE_OPTIONS,
                transformations=_table_transforms({"Value #B": "cost"}, hide=("Time", "Value #A")),
            ),
            Panel(
                title="Finished runs by outcome", kind="timeseries",
                description="Runs that finished, by outcome (Succeeded, Failed, Aborted), and aborts by reason.",
                queries=[
                    Query(f"sum by (outcome) (increase(durablerun_run_completions_total{{{SEL}}}[$__rate_interval]))",
                          legend="{{outcome}}"),
                    Query(f"sum by (reason) (increase(durablerun_run_aborts_total{{{SEL}}}[$__rate_interval]))",
                          legend="aborted: {{reason}}"),
                ],
                width=12, height=9, custom=_timeseries(bars=True), options=LEGEND,
            ),
        ]),
        ("Staleness", [
            _stale_table(),
            Panel(
                title="Lease age / lease duration", kind="timeseries",
                description="Age of each Running run's lease as a multiple of its duration. Above 1 the lease "
                            f"has expired and the operator should replace the runner; above {config.LEASE_STALE_FACTOR}"
                            " DurableRunLeaseStale fires.",
                queries=[Query(f"{_max('durablerun_run_seconds_since_lease_renewal')} / "
                               f"{_max('durablerun_run_lease_duration_seconds')}", legend=PER_RUN)],
                height=9, custom=_timeseries() | {"thresholdsStyle": {"mode": "line"}},
                thresholds=[(None, "green"), (1, "orange"), (config.LEASE_STALE_FACTOR, "red")],
                options=LEGEND,
            ),
            Panel(
                title="Seconds since last progress", kind="timeseries",
                description="Seconds since each unfinished run last completed a step (or started, if it never "
                            "did), against its policy.progressTimeout (dashed).",
                queries=[
                    Query(_max("durablerun_run_seconds_since_progress"), legend=PER_RUN),
                    Query(_max("durablerun_run_progress_timeout_seconds") + f" and on ({RUN}) "
                          + _max("durablerun_run_seconds_since_progress"), legend="timeout " + PER_RUN),
                ],
                width=12, unit="s", custom=_timeseries(), options=LEGEND,
                overrides=[{"matcher": {"id": "byRegexp", "options": "timeout .*"},
                            "properties": [{"id": "custom.lineStyle", "value": {"fill": "dash", "dash": [10, 10]}}]}],
            ),
            Panel(
                title="Seconds since last checkpoint", kind="timeseries",
                description="Seconds since each unfinished run last wrote its journal.",
                queries=[Query(_max("durablerun_run_seconds_since_checkpoint"), legend=PER_RUN)],
                width=12, unit="s", custom=_timeseries(), options=LEGEND,
            ),
        ]),
        ("Resume and operator", [
            Panel(
                title="Resume latency", kind="timeseries",
                description="From the end of a run's previous pod until its next attempt holds the lease "
                            "(backoff, scheduling, start-up and journal replay).",
                queries=[
                    Query(f"histogram_quantile({q}, sum by (le) "
                          f"(rate(durablerun_resume_latency_seconds_bucket{{{OP}}}[$__rate_interval])))", legend=name)
                    for q, name in quantiles
                ],
                width=8, unit="s", custom=_timeseries(), options=LEGEND,
            ),
            Panel(
                title="Operator up", kind="stat",
                description="1 while Prometheus scrapes the operator. DurableRunOperatorDown fires when "
                            "durablerun_build_info is absent for 5 minutes.",
                queries=[Query(f"sum(up{{{OP}}})", legend="up", instant=True),
                         Query(f"count by (version) (durablerun_build_info{{{OP}}})", legend="version {{version}}",
                               instant=True)],
                width=4, thresholds=[(None, "red"), (1, "green")],
                options={"reduceOptions": {"calcs": ["lastNotNull"], "fields": "", "values": False},
                         "colorMode": "background", "graphMode": "none", "textMode": "value_and_name"},
            ),
            Panel(
                title="Reconciles", kind="timeseries",
                description="Reconciles per second, reconciles that ended in an error, and reconcile duration.",
                queries=[
                    Query(f"sum(rate(durablerun_reconcile_duration_seconds_count{{{OP}}}[$__rate_interval]))",
                          legend="reconciles/s"),
                    Query(f"sum(rate(durablerun_reconcile_errors_total{{{OP}}}[$__rate_interval]))",
                          legend="errors/s"),
                    *[Query(f"histogram_quantile({q}, sum by (le) "
                            f"(rate(durablerun_reconcile_duration_seconds_bucket{{{OP}}}[$__rate_interval])))",
                            legend=f"{name} seconds") for q, name in quantiles[1:]],
                ],
                width=6, custom=_timeseries(), options=LEGEND,
            ),
            Panel(
                title="Operator memory and CPU", kind="timeseries",
                description="Resident memory (left) and CPU cores used (right) of the operator process.",
                queries=[
                    Query(f"sum by (instance) (process_resident_memory_bytes{{{OP}}})", legend="memory {{instance}}"),
                    Query(f"sum by (instance) (rate(process_cpu_seconds_total{{{OP}}}[$__rate_interval]))",
                          legend="cpu {{instance}}"),
                ],
                width=6, unit="bytes", custom=_timeseries(), options=LEGEND,
                overrides=[{"matcher": {"id": "byRegexp", "options": "cpu .*"},
                            "properties": [{"id": "unit", "value": "short"},
                                           {"id": "custom.axisPlacement", "value": "right"}]}],
            ),
            Panel(
                title="Firing durable-run alerts", kind="table",
                description="Alerts of durable-run's rules that are firing now (needs the PrometheusRule or "
                            "deploy/monitoring/durablerun-rules.yaml loaded into this Prometheus).",
                queries=[Query('max by (alertname, severity, namespace, name, reason, budget) '
                               '(ALERTS{alertname=~"DurableRun.*", alertstate="firing"})', instant=True, table=True)],
                width=24, height=7, options=TABLE_OPTIONS,
                transformations=_table_transforms({}, hide=("Time", "Value")),
            ),
        ]),
    ]


def _variables() -> list[dict[str, Any]]:
    def query_variable(name: str, label: str, query: str, all_value: str | None) -> dict[str, Any]:
        variable = {
            "name": name, "label": label, "type": "query", "datasource": DATASOURCE,
            "query": {"query": query, "refId": f"{name}-variable"}, "definition": query,
            "refresh": 2, "includeAll": True, "multi": True,
            "current": {"selected": True, "text": ["All"], "value": ["$__all"]},
            "sort": 1, "regex": "", "hide": 0, "options": [],
        }
        if all_value is not None:
            variable["allValue"] = all_value
        return variable

    return [
        {"name": "datasource", "label": "Data source", "type": "datasource", "query": "prometheus",
         "current": {}, "hide": 0, "refresh": 1, "regex": "", "options": []},
        # "All" jobs means the jobs found (never ".+": up{job=~".+"} is every target).
        query_variable("job", "Operator job", "label_values(durablerun_build_info, job)", None),
        # "All" namespaces: ".+", short and also right for runs created after the page loaded.
        query_variable("namespace", "Namespace", 'label_values(durablerun_run_phase{job=~"$job"}, namespace)', ".+"),
    ]


def build() -> dict[str, Any]:
    panels: list[dict[str, Any]] = []
    next_id, y = 1, 0
    for title, row_panels in rows():
        panels.append(_row(title, next_id, y))
        next_id, y = next_id + 1, y + 1
        x, row_height = 0, 0
        for panel in row_panels:
            if x + panel.width > 24:
                x, y, row_height = 0, y + row_height, 0
            panels.append(panel.render(next_id, x, y))
            next_id += 1
            x += panel.width
            row_height = max(row_height, panel.height)
        y += row_height
    return {
        "uid": config.DASHBOARD_UID,
        "title": config.DASHBOARD_TITLE,
        "description": "Durable runs on Kubernetes: phases, progress, cost, restarts, aborts, staleness and "
                       "the durable-run operator's health. Metrics: docs/metrics.md.",
        "tags": ["durable-run"],
        "editable": True,
        "graphTooltip": 1,
        "refresh": "30s",
        "schemaVersion": 39,
        "version": 1,
        "time": {"from": "now-6h", "to": "now"},
        "timepicker": {},
        "timezone": "browser",
        "fiscalYearStartMonth": 0,
        "liveNow": False,
        "weekStart": "",
        "annotations": {"list": [{
            "builtIn": 1, "datasource": {"type": "grafana", "uid": "-- Grafana --"}, "enable": True, "hide": True,
            "iconColor": "rgba(0, 211, 255, 1)", "name": "Annotations & Alerts", "type": "dashboard",
        }]},
        "links": [{"title": "Runbooks", "type": "link", "url": config.RUNBOOK_BASE_URL, "targetBlank": True,
                   "icon": "doc", "tooltip": "What to do when a durable-run alert fires", "asDropdown": False,
                   "includeVars": False, "keepTime": False, "tags": []}],
        "templating": {"list": _variables()},
        "panels": panels,
    }
