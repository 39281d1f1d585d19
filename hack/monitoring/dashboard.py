"""durable-run's Grafana dashboard: runs by phase, progress, cost, restarts, aborts, staleness, operator health,
the webhook ingress.

Built with the Grafana Foundation SDK (its typed builders for Grafana 11.6), so a misspelt option or a value of
the wrong kind fails ``make generate`` (and mypy) instead of being ignored by Grafana.

Every query goes through the ``$datasource`` variable, every per-run query is
filtered by ``$job`` and ``$namespace``. ``$job`` is read from
durablerun_build_info, so the dashboard needs no assumption about how the
operator's scrape job is named.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol, Self, TypeVar

from grafana_foundation_sdk.builders import bargauge, prometheus, stat, table, timeseries
from grafana_foundation_sdk.builders import common as common_builders
from grafana_foundation_sdk.builders import dashboard as dashboard_builders
from grafana_foundation_sdk.cog import builder as cogbuilder
from grafana_foundation_sdk.cog import variants as cogvariants
from grafana_foundation_sdk.models import common
from grafana_foundation_sdk.models import dashboard as models
from grafana_foundation_sdk.models.prometheus import PromQueryFormat

from monitoring import config

DATASOURCE = models.DataSourceRef(type_val="prometheus", uid="${datasource}")
RUN = config.RUN
SEL = 'job=~"$job", namespace=~"$namespace"'
OP = 'job=~"$job"'
HOOKS = 'job=~"$webhook_job"'  # the webhook ingress is scraped as a job of its own (docs/web.md)
PER_RUN = "{{namespace}}/{{name}}"

Thresholds = Sequence[tuple[float | None, str]]


def _max(metric: str, selector: str = SEL, by: str = RUN) -> str:
    return f"max by ({by}) ({metric}{{{selector}}})"


def query(expr: str, legend: str = "__auto", *, instant: bool = False, table: bool = False) -> prometheus.Dataquery:
    q = prometheus.Dataquery().expr(expr).legend_format(legend).datasource(DATASOURCE)
    q = q.instant() if instant else q.range()
    return q.format(PromQueryFormat.TABLE if table else PromQueryFormat.TIME_SERIES)


class _Panel(Protocol):
    """What every panel builder of the SDK has (they share no base class that says so)."""

    def title(self, title: str) -> Self: ...
    def description(self, description: str) -> Self: ...
    def datasource(self, datasource: models.DataSourceRef) -> Self: ...
    def with_target(self, target: cogbuilder.Builder[cogvariants.Dataquery]) -> Self: ...
    def span(self, w: int) -> Self: ...
    def height(self, h: int) -> Self: ...
    def unit(self, unit: str) -> Self: ...
    def thresholds(self, thresholds: cogbuilder.Builder[models.ThresholdsConfig]) -> Self: ...


P = TypeVar("P", bound=_Panel)


def _panel(panel: P, title: str, description: str, queries: Sequence[prometheus.Dataquery], *, width: int = 12,
           height: int = 8, unit: str = "short", thresholds: Thresholds = ((None, "green"),)) -> P:
    """What every panel sets: queries A, B, ... through $datasource, size, unit, thresholds (explicit, as
    Grafana's default thresholds paint 80 and above red)."""
    panel = panel.title(title).description(description).datasource(DATASOURCE).span(width).height(height).unit(unit)
    for i, q in enumerate(queries):
        panel = panel.with_target(q.ref_id(chr(ord("A") + i)))
    steps = [models.Threshold(value=value, color=color) for value, color in thresholds]
    return panel.thresholds(dashboard_builders.ThresholdsConfig().mode(models.ThresholdsMode.ABSOLUTE).steps(steps))


def _reduce_last() -> common_builders.ReduceDataOptions:
    return common_builders.ReduceDataOptions().calcs(["lastNotNull"]).fields("").values(False)


def _timeseries(title: str, description: str, queries: Sequence[prometheus.Dataquery], *, stack: bool = False,
                bars: bool = False, width: int = 12, height: int = 8, unit: str = "short",
                thresholds: Thresholds = ((None, "green"),)) -> timeseries.Panel:
    panel = _panel(timeseries.Panel(), title, description, queries, width=width, height=height, unit=unit,
                   thresholds=thresholds)
    panel = (panel.draw_style(common.GraphDrawStyle.BARS if bars else common.GraphDrawStyle.LINE)
             .fill_opacity(30 if stack or bars else 10).line_width(1).show_points(common.VisibilityMode.NEVER)
             .legend(common_builders.VizLegendOptions().display_mode(common.LegendDisplayMode.LIST)
                     .placement(common.LegendPlacement.BOTTOM).show_legend(True))
             .tooltip(common_builders.VizTooltipOptions().mode(common.TooltipDisplayMode.MULTI)
                      .sort(common.SortOrder.DESCENDING)))
    if stack:
        panel = panel.stacking(common_builders.StackingConfig().mode(common.StackingMode.NORMAL).group("A"))
    return panel


def _bargauge(title: str, description: str, q: prometheus.Dataquery, *, display: common.BarGaugeDisplayMode,
              width: int = 12, unit: str = "short", thresholds: Thresholds = ((None, "green"),)) -> bargauge.Panel:
    return (_panel(bargauge.Panel(), title, description, [q], width=width, unit=unit, thresholds=thresholds)
            .display_mode(display).orientation(common.VizOrientation.HORIZONTAL).reduce_options(_reduce_last()))


def _table(title: str, description: str, queries: Sequence[prometheus.Dataquery], rename: dict[str, str],
           *, hide: tuple[str, ...] = ("Time",), sort_by: str | None = None, width: int = 12, height: int = 8,
           unit: str = "short", thresholds: Thresholds = ((None, "green"),)) -> table.Panel:
    """Instant table queries -> one row per run (merged), columns renamed, ``hide`` hidden."""
    panel = (_panel(table.Panel(), title, description, queries, width=width, height=height, unit=unit,
                    thresholds=thresholds)
             .show_header(True).cell_height(common.TableCellHeight.SM)
             .footer(common_builders.TableFooterOptions().show(False))
             .transformations([
                 models.DataTransformerConfig(id_val="merge", options={}),
                 models.DataTransformerConfig(id_val="organize", options={
                     "excludeByName": dict.fromkeys(hide, True), "renameByName": rename}),
             ]))
    if sort_by is not None:
        panel = panel.sort_by([common_builders.TableSortByFieldState().display_name(sort_by).desc(True)])
    return panel


def _stale_table() -> table.Panel:
    return _table(
        "Staleness of active runs",
        "Seconds since each unfinished run last completed a step, last wrote its journal, and (while "
        "Running) last renewed its lease. Computed when Prometheus scrapes, not when the operator last "
        "reconciled.",
        [
            query(_max("durablerun_run_seconds_since_progress"), instant=True, table=True),
            query(_max("durablerun_run_seconds_since_checkpoint"), instant=True, table=True),
            query(_max("durablerun_run_seconds_since_lease_renewal"), instant=True, table=True),
        ],
        {"Value #A": "since progress", "Value #B": "since checkpoint", "Value #C": "since lease renewal"},
        sort_by="since progress", height=9, unit="s", thresholds=((None, "green"), (300, "yellow"), (600, "red")),
    ).cell_options(common.TableColorTextCellOptions())


PanelBuilder = bargauge.Panel | stat.Panel | table.Panel | timeseries.Panel


def rows() -> list[tuple[str, list[PanelBuilder]]]:
    """The dashboard, row by row; panels fill each row left to right (24 columns)."""
    quantiles = (("0.5", "p50"), ("0.9", "p90"), ("0.99", "p99"))
    return [
        ("Runs", [
            _panel(stat.Panel(), "Runs by phase", "How many DurableRuns are in each phase now.",
                   [query(f"sum by (phase) (durablerun_run_phase{{{SEL}}})", "{{phase}}", instant=True)],
                   width=8, height=6)
            .reduce_options(_reduce_last()).color_mode(common.BigValueColorMode.VALUE)
            .graph_mode(common.BigValueGraphMode.NONE).text_mode(common.BigValueTextMode.VALUE_AND_NAME)
            .orientation(common.VizOrientation.AUTO).justify_mode(common.BigValueJustifyMode.AUTO),
            _timeseries("Runs by phase over time", "Runs in each phase, stacked.",
                        [query(f"sum by (phase) (durablerun_run_phase{{{SEL}}})", "{{phase}}")],
                        width=10, height=6, stack=True),
            _timeseries("Queued runs (Kueue)",
                        "Runs waiting for Kueue to admit their next attempt, per namespace: no pod, no quota "
                        "held (docs/install.md, Queues and quotas with Kueue). Empty without Kueue.",
                        [query(f"sum by (namespace) (durablerun_runs_queued{{{SEL}}})", "{{namespace}}")],
                        width=6, height=6, stack=True),
        ]),
        ("Progress and cost", [
            _bargauge("Progress per run",
                      "Completed steps as a share of the run's total steps (for runs that declare a total).",
                      query(_max("durablerun_run_progress_ratio"), PER_RUN, instant=True),
                      display=common.BarGaugeDisplayMode.GRADIENT, unit="percentunit",
                      thresholds=((None, "blue"), (1, "green")))
            .min(0).max(1).show_unfilled(True),
            _bargauge("Budget used per run",
                      "Cost, its child runs' included, as a share of the run's policy.costCeilingUSD "
                      "(runs with a ceiling). At 100% the run is aborted (BudgetExhausted).",
                      query(f"({_max('durablerun_run_cost_usd')} + ({_max('durablerun_run_children_cost_usd')}"
                            f" or {_max('durablerun_run_cost_usd')} * 0)) / "
                            f"{_max('durablerun_run_cost_ceiling_usd')}", PER_RUN, instant=True),
                      display=common.BarGaugeDisplayMode.GRADIENT, unit="percentunit",
                      thresholds=((None, "green"), (config.BUDGET_RATIO, "orange"), (1, "red")))
            .min(0).max(1).show_unfilled(True),
            _timeseries("Cost by namespace",
                        "Sum of the cost of the DurableRuns that exist, per namespace, over time "
                        "(a deleted run's cost leaves the sum).",
                        [query(f"sum by (namespace) (durablerun_run_cost_usd{{{SEL}}})", "{{namespace}}")],
                        width=8, unit="currencyUSD", stack=True),
            _bargauge("Top runs by cost", "The ten most expensive runs now.",
                      query(f"topk(10, {_max('durablerun_run_cost_usd')})", PER_RUN, instant=True),
                      display=common.BarGaugeDisplayMode.BASIC, width=8, unit="currencyUSD"),
            _timeseries("Tokens by namespace", "Sum of the tokens used by the DurableRuns that exist, per namespace.",
                        [query(f"sum by (namespace) (durablerun_run_tokens{{{SEL}}})", "{{namespace}}")],
                        width=8, stack=True),
        ]),
        ("Restarts and aborts", [
            _timeseries("Restarts by reason",
                        "Restarts the operator made, by cause: Crash, OOMKilled and LeaseExpired use the "
                        "run's maxRestarts; Evicted, Preempted, NodeLost and PodDeleted its maxDisruptions.",
                        [query(f"sum by (reason) (increase(durablerun_run_restarts_total{{{SEL}}}"
                               "[$__rate_interval]))", "{{reason}}")],
                        stack=True, bars=True),
            _table("Runs that restarted",
                   "status.restarts (crashes, OOM kills, expired leases) and status.disruptions "
                   "(evictions, preemptions, lost nodes, deleted pods) of every run that has any.",
                   [query(_max("durablerun_run_status_restarts") + " > 0", instant=True, table=True),
                    query(_max("durablerun_run_status_disruptions") + " > 0", instant=True, table=True)],
                   {"Value #A": "restarts", "Value #B": "disruptions"}, sort_by="restarts"),
            _table("Aborted runs",
                   "Every DurableRun in phase Aborted, with status.abortReason and its cost. "
                   "DurableRunAborted (or, for an abort by request, DurableRunAbortedByUser) fires for each.",
                   [query(f"max by ({RUN}, reason) (durablerun_run_abort_reason{{{SEL}}}) == 1",
                          instant=True, table=True),
                    query(f"{_max('durablerun_run_cost_usd')} and on ({RUN}) "
                          f"max by ({RUN}) (durablerun_run_abort_reason{{{SEL}}}) == 1", instant=True, table=True)],
                   {"Value #B": "cost"}, hide=("Time", "Value #A"), height=9, unit="currencyUSD"),
            _timeseries("Finished runs by outcome",
                        "Runs that finished, by outcome (Succeeded, Failed, Aborted), and aborts by reason.",
                        [query(f"sum by (outcome) (increase(durablerun_run_completions_total{{{SEL}}}"
                               "[$__rate_interval]))", "{{outcome}}"),
                         query(f"sum by (reason) (increase(durablerun_run_aborts_total{{{SEL}}}[$__rate_interval]))",
                               "aborted: {{reason}}")],
                        height=9, bars=True),
        ]),
        ("Traces", [
            _table("Runs and their traces",
                   "Each run's OpenTelemetry trace id (status.traceID): one trace holds its attempts, steps, "
                   "waits, model calls and the operator's decisions. Click an id to open the trace where the "
                   "Trace link variable points (docs/metrics.md, Traces); without it, copy the id into your "
                   "tracing backend.",
                   [query(f"max by ({RUN}, trace_id) (durablerun_run_trace{{{SEL}}})", instant=True, table=True)],
                   {}, hide=("Time", "Value"), width=24, height=7)
            .override_by_name("trace_id", [models.DynamicConfigValue(id_val="links", value=[
                {"title": "Open the run's trace", "url": "${trace_url}${__value.raw}", "targetBlank": True}])]),
        ]),
        ("Staleness", [
            _stale_table(),
            _timeseries("Lease age / lease duration",
                        "Age of each Running run's lease as a multiple of its duration. Above 1 the lease "
                        "has expired and the operator should replace the runner; above "
                        f"{config.LEASE_STALE_FACTOR} DurableRunLeaseStale fires.",
                        [query(f"{_max('durablerun_run_seconds_since_lease_renewal')} / "
                               f"{_max('durablerun_run_lease_duration_seconds')}", PER_RUN)],
                        height=9, thresholds=((None, "green"), (1, "orange"), (config.LEASE_STALE_FACTOR, "red")))
            .thresholds_style(common_builders.GraphThresholdsStyleConfig().mode(common.GraphThresholdsStyleMode.LINE)),
            _timeseries("Seconds since last progress",
                        "Seconds since each unfinished run last completed a step (or started, if it never "
                        "did), against its policy.progressTimeout (dashed).",
                        [query(_max("durablerun_run_seconds_since_progress"), PER_RUN),
                         query(_max("durablerun_run_progress_timeout_seconds") + f" and on ({RUN}) "
                               + _max("durablerun_run_seconds_since_progress"), "timeout " + PER_RUN)],
                        unit="s")
            .override_by_regexp("timeout .*", [models.DynamicConfigValue(
                id_val="custom.lineStyle", value=common.LineStyle(fill="dash", dash=[10, 10]))]),
            _timeseries("Seconds since last checkpoint", "Seconds since each unfinished run last wrote its journal.",
                        [query(_max("durablerun_run_seconds_since_checkpoint"), PER_RUN)], unit="s"),
        ]),
        ("Resume and operator", [
            _timeseries("Resume latency",
                        "From the end of a run's previous pod until its next attempt holds the lease "
                        "(backoff, scheduling, start-up and journal replay).",
                        [query(f"histogram_quantile({q}, sum by (le) "
                               f"(rate(durablerun_resume_latency_seconds_bucket{{{OP}}}[$__rate_interval])))", name)
                         for q, name in quantiles],
                        width=8, unit="s"),
            _panel(stat.Panel(), "Operator up",
                   "1 while Prometheus scrapes the operator. DurableRunOperatorDown fires when "
                   "durablerun_build_info is absent for 5 minutes.",
                   [query(f"sum(up{{{OP}}})", "up", instant=True),
                    query(f"count by (version) (durablerun_build_info{{{OP}}})", "version {{version}}", instant=True)],
                   width=4, thresholds=((None, "red"), (1, "green")))
            .reduce_options(_reduce_last()).color_mode(common.BigValueColorMode.BACKGROUND)
            .graph_mode(common.BigValueGraphMode.NONE).text_mode(common.BigValueTextMode.VALUE_AND_NAME),
            _timeseries("Reconciles",
                        "Reconciles per second, reconciles that ended in an error, and reconcile duration.",
                        [query(f"sum(rate(durablerun_reconcile_duration_seconds_count{{{OP}}}[$__rate_interval]))",
                               "reconciles/s"),
                         query(f"sum(rate(durablerun_reconcile_errors_total{{{OP}}}[$__rate_interval]))", "errors/s"),
                         *[query(f"histogram_quantile({q}, sum by (le) "
                                 f"(rate(durablerun_reconcile_duration_seconds_bucket{{{OP}}}[$__rate_interval])))",
                                 f"{name} seconds") for q, name in quantiles[1:]]],
                        width=6),
            _timeseries("Operator memory and CPU",
                        "Resident memory (left) and CPU cores used (right) of the operator process.",
                        [query(f"sum by (instance) (process_resident_memory_bytes{{{OP}}})", "memory {{instance}}"),
                         query(f"sum by (instance) (rate(process_cpu_seconds_total{{{OP}}}[$__rate_interval]))",
                               "cpu {{instance}}")],
                        width=6, unit="bytes")
            .override_by_regexp("cpu .*", [models.DynamicConfigValue(id_val="unit", value="short"),
                                           models.DynamicConfigValue(id_val="custom.axisPlacement",
                                                                     value=common.AxisPlacement.RIGHT)]),
            _table("Firing durable-run alerts",
                   "Alerts of durable-run's rules that are firing now (needs the PrometheusRule or "
                   "deploy/monitoring/durablerun-rules.yaml loaded into this Prometheus).",
                   [query('max by (alertname, severity, namespace, name, reason, budget, quota) '
                          '(ALERTS{alertname=~"DurableRun.*", alertstate="firing"})', instant=True, table=True)],
                   {}, hide=("Time", "Value"), width=24, height=7),
        ]),
        ("Model quotas", [
            _timeseries("Model quota use",
                        "Tokens taken in each ModelQuota's last-minute window (solid) against its tokensPerMinute "
                        "(dashed), as the operator reads the runners' shared Redis every 10 s (docs/agents.md, "
                        "Model quotas). DurableRunQuotaSaturated fires at 95% for 15 minutes while runs wait.",
                        [query(f"max by (quota) (durablerun_quota_tokens_used{{{OP}}})", "{{quota}}"),
                         query(f"max by (quota) (durablerun_quota_tokens_limit{{{OP}}})", "limit {{quota}}")],
                        width=12)
            .override_by_regexp("limit .*", [models.DynamicConfigValue(
                id_val="custom.lineStyle", value=common.LineStyle(fill="dash", dash=[10, 10]))]),
            _timeseries("Runs waiting for a quota",
                        "Runs Waiting, with no pod, for room in each quota, and calls in flight (granted, not yet "
                        "settled).",
                        [query(f"sum by (quota) (durablerun_quota_runs_waiting{{{OP}}})", "waiting {{quota}}"),
                         query(f"max by (quota) (durablerun_quota_calls_in_flight{{{OP}}})", "in flight {{quota}}")],
                        width=8),
            _panel(stat.Panel(), "Quota windows reachable",
                   "1 when the operator last read the quota's windows from the shared Redis, 0 when it could not "
                   "(runners then wait or go unlimited). DurableRunQuotaWindowsDown fires after 2 minutes at 0.",
                   [query(f"min by (quota) (durablerun_quota_windows_up{{{OP}}})", "{{quota}}", instant=True)],
                   width=4, thresholds=((None, "red"), (1, "green")))
            .reduce_options(_reduce_last()).color_mode(common.BigValueColorMode.BACKGROUND)
            .graph_mode(common.BigValueGraphMode.NONE).text_mode(common.BigValueTextMode.VALUE_AND_NAME),
            _timeseries("Wait for a quota's grant",
                        "p50 and p99 of how long calls waited for their share of each quota, from the first ask "
                        "to the grant, across the run's pods when it yielded (the runners count it in the shared "
                        "Redis).",
                        [query(f"histogram_quantile({q}, sum by (quota, le) (rate("
                               f"durablerun_quota_grant_wait_seconds_bucket{{{OP}}}[$__rate_interval])))",
                               f"p{round(q * 100)} {{{{quota}}}}") for q in (0.5, 0.99)],
                        width=12, unit="s"),
            _timeseries("Calls a provider refused",
                        "Calls a second that a provider answered with 429, per quota: a quota set above the "
                        "provider's own limit, or calls to the same organisation from outside durable-run. Each "
                        "429 with a Retry-After holds every call of the quota until then.",
                        [query(f"sum by (quota) (rate(durablerun_quota_provider_rejections_total{{{OP}}}"
                               "[$__rate_interval]))", "{{quota}}")],
                        width=12, unit="reqps"),
        ]),
        ("Webhook ingress", [
            _timeseries("Webhook requests by outcome",
                        "Requests a second the webhook ingress answered, by outcome: delivered, duplicate, "
                        "unauthorized, gone, conflict, bad_request, too_large, rate_limited, error (docs/web.md).",
                        [query(f"sum by (outcome) (rate(durablerun_webhook_requests_total{{{HOOKS}}}"
                               "[$__rate_interval]))", "{{outcome}}")],
                        stack=True, unit="reqps"),
            _timeseries("Webhook answer time", "How long the ingress took to answer a request.",
                        [query(f"histogram_quantile({q}, sum by (le) "
                               f"(rate(durablerun_webhook_request_seconds_bucket{{{HOOKS}}}[$__rate_interval])))",
                               name) for q, name in quantiles],
                        unit="s"),
        ]),
    ]


def _variables() -> list[cogbuilder.Builder[models.VariableModel]]:
    def query_variable(name: str, label: str, expr: str) -> dashboard_builders.QueryVariable:
        return (dashboard_builders.QueryVariable(name).label(label).datasource(DATASOURCE)
                .query({"query": expr, "refId": f"{name}-variable"})
                .refresh(models.VariableRefresh.ON_TIME_RANGE_CHANGED).include_all(True).multi(True)
                .current(models.VariableOption(selected=True, text=["All"], value=["$__all"]))
                .sort(models.VariableSort.ALPHABETICAL_ASC).regex("").hide(models.VariableHide.DONT_HIDE)
                .options([]))

    return [
        dashboard_builders.DatasourceVariable("datasource").label("Data source").type("prometheus")
        .regex("").hide(models.VariableHide.DONT_HIDE),
        # "All" jobs means the jobs found (never ".+": up{job=~".+"} is every target).
        query_variable("job", "Operator job", "label_values(durablerun_build_info, job)"),
        # "All" namespaces: ".+", short and also right for runs created after the page loaded.
        query_variable("namespace", "Namespace", 'label_values(durablerun_run_phase{job=~"$job"}, namespace)')
        .all_value(".+"),
        query_variable("webhook_job", "Webhook job", "label_values(durablerun_webhook_requests_total, job)"),
        # Where a trace id opens (docs/metrics.md, Traces): any tracing UI whose trace URL ends in the id. Not a
        # data link to a Grafana data source: its uid is not templated, and this one file serves every Grafana.
        dashboard_builders.TextBoxVariable("trace_url").label("Trace link").default_value("")
        .description("URL a trace id is appended to, to open it: e.g. https://jaeger.example.com/trace/")
        .hide(models.VariableHide.DONT_HIDE),
    ]


def build() -> dict[str, object]:
    """The dashboard as Grafana's JSON model (nested SDK objects: serialize with the SDK's JSONEncoder)."""
    board = (
        dashboard_builders.Dashboard(config.DASHBOARD_TITLE)
        .uid(config.DASHBOARD_UID)
        .description("Durable runs on Kubernetes: phases, progress, cost, restarts, aborts, staleness and "
                     "the durable-run operator's health. Metrics: docs/metrics.md.")
        .tags(["durable-run"]).editable().tooltip(models.DashboardCursorSync.CROSSHAIR)
        .refresh("30s").version(1).time("now-6h", "now").timezone("browser")
        .fiscal_year_start_month(0).live_now(False).week_start("")
        .annotation(dashboard_builders.AnnotationQuery().name("Annotations & Alerts").built_in(1)
                    .datasource(models.DataSourceRef(type_val="grafana", uid="-- Grafana --"))
                    .enable(True).hide(True).icon_color("rgba(0, 211, 255, 1)").type("dashboard"))
        .link(dashboard_builders.DashboardLink("Runbooks").type(models.DashboardLinkType.LINK)
              .url(config.RUNBOOK_BASE_URL).target_blank(True).icon("doc")
              .tooltip("What to do when a durable-run alert fires")
              .as_dropdown(False).include_vars(False).keep_time(False).tags([]))
        .variables(_variables())
    )
    # The SDK lays panels out: each row's panels left to right after the row, a new line once 24 columns are
    # full. It does not move a panel that would overflow: keep each line's widths summing to 24
    # (tests/observability/test_dashboard.py checks no panel crosses the edge or overlaps another).
    next_id = 1
    for title, row_panels in rows():
        board = board.with_row(dashboard_builders.Row(title).id(next_id))
        next_id += 1
        for panel in row_panels:
            board = board.with_panel(panel.id(next_id))
            next_id += 1
    return board.build().to_json()
