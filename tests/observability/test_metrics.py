"""RunMetrics on a private registry: values come from the status, staleness is computed at scrape time,
a forgotten run leaves no series behind."""

from __future__ import annotations

import urllib.request
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from prometheus_client import CollectorRegistry
from prometheus_client.parser import text_string_to_metric_families

from durablerun import api, quotas, resource
from durablerun_operator import metrics

NOW = datetime(2025, 3, 1, 12, 0, 0, tzinfo=UTC)


def ts(seconds_before_now: float) -> str:
    """An RFC 3339 timestamp as the API server stores it."""
    return (NOW - timedelta(seconds=seconds_before_now)).strftime("%Y-%m-%dT%H:%M:%SZ")


class FakeMonotonic:
    def __init__(self) -> None:
        self.value = 1000.0

    def __call__(self) -> float:
        return self.value


@pytest.fixture
def clock() -> FakeMonotonic:
    return FakeMonotonic()


@pytest.fixture
def registry() -> CollectorRegistry:
    return CollectorRegistry()


@pytest.fixture
def run_metrics(registry: CollectorRegistry, clock: FakeMonotonic) -> metrics.RunMetrics:
    return metrics.RunMetrics(registry, version="1.2.3", monotonic=clock)


def status(**fields: Any) -> resource.DurableRunStatus:
    """A status parsed from the camelCase JSON the API server returns."""
    return resource.DurableRunStatus.model_validate(fields)


def value(registry: CollectorRegistry, metric: str, /, **labels: str) -> float | None:
    return registry.get_sample_value(metric, labels)


def series_of(registry: CollectorRegistry, namespace: str, name: str) -> list[str]:
    return [
        sample.name
        for family in registry.collect()
        for sample in family.samples
        if sample.labels.get("namespace") == namespace and sample.labels.get("name") == name
    ]


RUNNING = status(
    phase="Running",
    attempt=3, epoch=3, pod="train-a3", restarts=2, disruptions=1,
    lease={"holder": "train-a3", "epoch": 3, "acquireTime": ts(600), "renewTime": ts(5), "durationSeconds": 45},
    progress={"step": 41, "stepName": "summarize", "completedSteps": 40, "totalSteps": 160,
              "fraction": "0.25", "lastProgressTime": ts(30)},
    cost={"usd": "3.1415", "tokens": 123456},
    childrenTotal={"runs": 5, "finished": 2, "summary": "2/5", "usd": "1.25", "tokens": 40},
    checkpoint={"position": 40, "key": "journal/40.json", "time": ts(31)},
    startTime=ts(7200),
)
POLICY = resource.Policy(costCeilingUSD="10.00", maxTokens=1_000_000, maxSteps=500, progressTimeout="15m")


def test_gauges_match_the_status_and_policy(run_metrics: metrics.RunMetrics, registry: CollectorRegistry) -> None:
    run_metrics.observe_run("ml", "train", RUNNING, POLICY, NOW)
    run = {"namespace": "ml", "name": "train"}
    for phase in api.Phase:
        expected = 1.0 if phase is api.Phase.RUNNING else 0.0
        assert value(registry, "durablerun_run_phase", **run, phase=phase.value) == expected
    assert value(registry, "durablerun_run_progress_ratio", **run) == 0.25
    assert value(registry, "durablerun_run_completed_steps", **run) == 40
    assert value(registry, "durablerun_run_total_steps", **run) == 160
    assert value(registry, "durablerun_run_cost_usd", **run) == pytest.approx(3.1415)
    assert value(registry, "durablerun_run_tokens", **run) == 123456
    assert value(registry, "durablerun_run_cost_ceiling_usd", **run) == 10.0
    assert value(registry, "durablerun_run_children", **run) == 5
    assert value(registry, "durablerun_run_children_cost_usd", **run) == pytest.approx(1.25)
    assert value(registry, "durablerun_run_token_limit", **run) == 1_000_000
    assert value(registry, "durablerun_run_step_limit", **run) == 500
    assert value(registry, "durablerun_run_status_restarts", **run) == 2
    assert value(registry, "durablerun_run_status_disruptions", **run) == 1
    assert value(registry, "durablerun_run_progress_timeout_seconds", **run) == 900
    # The lease's own duration wins over the policy's default 60s.
    assert value(registry, "durablerun_run_lease_duration_seconds", **run) == 45
    assert value(registry, "durablerun_run_seconds_since_progress", **run) == 30
    assert value(registry, "durablerun_run_seconds_since_checkpoint", **run) == 31
    assert value(registry, "durablerun_run_seconds_since_lease_renewal", **run) == 5
    assert value(registry, "durablerun_run_abort_reason", **run, reason="BudgetExhausted") is None
    assert value(registry, "durablerun_build_info", version="1.2.3") == 1


def test_a_run_is_labelled_with_its_trace_id(run_metrics: metrics.RunMetrics, registry: CollectorRegistry) -> None:
    trace_id = api.trace_id("ml/train/u1")
    run_metrics.observe_run("ml", "train", RUNNING.model_copy(update={"traceID": trace_id}), POLICY, NOW)
    assert value(registry, "durablerun_run_trace", namespace="ml", name="train", trace_id=trace_id) == 1
    run_metrics.observe_run("ml", "old", RUNNING, POLICY, NOW)  # admitted before the operator recorded it
    assert "durablerun_run_trace" not in series_of(registry, "ml", "old")


def test_progress_ratio_from_steps_and_absent_when_unknown(
    run_metrics: metrics.RunMetrics, registry: CollectorRegistry
) -> None:
    run_metrics.observe_run("ns", "counted", status(phase="Running", progress={"completedSteps": 3, "totalSteps": 4}),
                            resource.Policy(), NOW)
    run_metrics.observe_run("ns", "open-ended", status(phase="Running", progress={"completedSteps": 3}),
                            resource.Policy(), NOW)
    run_metrics.observe_run("ns", "done", status(phase="Succeeded", progress={"completedSteps": 9}),
                            resource.Policy(), NOW)
    assert value(registry, "durablerun_run_progress_ratio", namespace="ns", name="counted") == 0.75
    assert value(registry, "durablerun_run_progress_ratio", namespace="ns", name="open-ended") is None
    assert value(registry, "durablerun_run_progress_ratio", namespace="ns", name="done") == 1.0
    # Without a ceiling there is no ceiling series (rather than a misleading 0).
    assert value(registry, "durablerun_run_cost_ceiling_usd", namespace="ns", name="counted") is None
    # Nor children series for a run without children.
    assert value(registry, "durablerun_run_children", namespace="ns", name="counted") is None
    assert value(registry, "durablerun_run_children_cost_usd", namespace="ns", name="counted") is None


def test_a_run_without_a_phase_counts_as_pending(run_metrics: metrics.RunMetrics, registry: CollectorRegistry) -> None:
    run_metrics.observe_run("ns", "new", status(), resource.Policy(), NOW)
    assert value(registry, "durablerun_run_phase", namespace="ns", name="new", phase="Pending") == 1
    assert value(registry, "durablerun_run_cost_usd", namespace="ns", name="new") == 0


def test_runs_queued_counts_the_queued_runs_of_each_namespace(
    run_metrics: metrics.RunMetrics, registry: CollectorRegistry
) -> None:
    for namespace, name, phase in (("a", "q1", api.Phase.QUEUED), ("a", "q2", api.Phase.QUEUED),
                                   ("a", "r", api.Phase.RUNNING), ("b", "q3", api.Phase.QUEUED),
                                   ("c", "p", api.Phase.PENDING)):
        run_metrics.observe_run(namespace, name, status(phase=phase), resource.Policy(), NOW)
    assert value(registry, "durablerun_runs_queued", namespace="a") == 2
    assert value(registry, "durablerun_runs_queued", namespace="b") == 1
    assert value(registry, "durablerun_runs_queued", namespace="c") is None
    run_metrics.observe_run("a", "q1", status(phase=api.Phase.RUNNING), resource.Policy(), NOW)
    assert value(registry, "durablerun_runs_queued", namespace="a") == 1


def test_a_run_waiting_on_its_budget_says_which_limit_while_it_waits(
    run_metrics: metrics.RunMetrics, registry: CollectorRegistry
) -> None:
    waiting = resource.WaitingFor(budget=resource.ASK_TOKENS)
    run_metrics.observe_run("ml", "asks", status(phase=api.Phase.WAITING, waitingFor=waiting), resource.Policy(), NOW)
    run_metrics.observe_run("ml", "sleeps", status(phase=api.Phase.WAITING, waitingFor=resource.WaitingFor(
        wakeTime=ts(-60))), resource.Policy(), NOW)
    assert value(registry, "durablerun_run_waiting_on_budget", namespace="ml", name="asks", budget="tokens") == 1
    assert [s for s in series_of(registry, "ml", "sleeps") if "budget" in s] == []
    run_metrics.observe_run("ml", "asks", status(phase=api.Phase.RUNNING), resource.Policy(), NOW)
    assert value(registry, "durablerun_run_waiting_on_budget", namespace="ml", name="asks", budget="tokens") is None


def test_a_run_waiting_for_room_in_a_model_quota_names_the_quota_while_it_waits(
    run_metrics: metrics.RunMetrics, registry: CollectorRegistry
) -> None:
    throttled = status(phase=api.Phase.WAITING, waitingFor=resource.WaitingFor(quota="gpt-4o", wakeTime=ts(60)))
    run_metrics.observe_run("ml", "agent", throttled, resource.Policy(), NOW)
    assert value(registry, "durablerun_run_waiting_on_quota", namespace="ml", name="agent", quota="gpt-4o") == 1
    run_metrics.observe_run("ml", "agent", status(phase=api.Phase.RUNNING), resource.Policy(), NOW)
    assert value(registry, "durablerun_run_waiting_on_quota", namespace="ml", name="agent", quota="gpt-4o") is None


def test_a_model_quotas_reading_sets_its_gauges_and_an_unreadable_one_says_so(
    run_metrics: metrics.RunMetrics, registry: CollectorRegistry
) -> None:
    run_metrics.observe_quota("gpt-4o", 60000, None, (41200.4, 3.0, 2), 5)
    assert value(registry, "durablerun_quota_tokens_used", quota="gpt-4o") == pytest.approx(41200.4)
    assert value(registry, "durablerun_quota_tokens_limit", quota="gpt-4o") == 60000
    assert value(registry, "durablerun_quota_requests_used", quota="gpt-4o") is None  # no request limit
    assert value(registry, "durablerun_quota_calls_in_flight", quota="gpt-4o") == 2
    assert value(registry, "durablerun_quota_runs_waiting", quota="gpt-4o") == 5
    assert value(registry, "durablerun_quota_windows_up", quota="gpt-4o") == 1
    run_metrics.observe_quota("gpt-4o", 60000, None, None, 5)  # Redis cannot be reached
    assert value(registry, "durablerun_quota_windows_up", quota="gpt-4o") == 0
    assert value(registry, "durablerun_quota_tokens_used", quota="gpt-4o") is None  # not a stale reading
    run_metrics.forget_quotas_but(set())  # deleted
    assert value(registry, "durablerun_quota_tokens_limit", quota="gpt-4o") is None
    assert value(registry, "durablerun_quota_windows_up", quota="gpt-4o") is None


def test_a_quotas_counts_render_as_a_counter_and_a_cumulative_histogram_and_go_with_the_quota(
    run_metrics: metrics.RunMetrics, registry: CollectorRegistry
) -> None:
    # Two grants at once, one after 5 s, one after 2 h (past the last bound): buckets are Redis's, per bucket.
    per_bucket = (2, 0, 1, 0, 0, 0, 0, 1)
    assert len(per_bucket) == len(quotas.WAIT_BUCKETS) + 1
    run_metrics.observe_quota_counts("gpt-4o", (7, per_bucket, 7205.0))
    assert value(registry, "durablerun_quota_provider_rejections_total", quota="gpt-4o") == 7
    bucket = "durablerun_quota_grant_wait_seconds_bucket"
    assert value(registry, bucket, quota="gpt-4o", le="0.1") == 2
    assert value(registry, bucket, quota="gpt-4o", le="10.0") == 3
    assert value(registry, bucket, quota="gpt-4o", le="7200.0") == 3
    assert value(registry, bucket, quota="gpt-4o", le="+Inf") == 4
    assert value(registry, "durablerun_quota_grant_wait_seconds_count", quota="gpt-4o") == 4
    assert value(registry, "durablerun_quota_grant_wait_seconds_sum", quota="gpt-4o") == 7205.0
    run_metrics.observe_quota_counts("gpt-4o", None)  # another replica writes its status now
    assert value(registry, "durablerun_quota_provider_rejections_total", quota="gpt-4o") is None
    run_metrics.observe_quota_counts("gpt-4o", (1, per_bucket, 1.0))
    run_metrics.forget_quotas_but(set())  # deleted
    assert value(registry, "durablerun_quota_grant_wait_seconds_count", quota="gpt-4o") is None


def test_seconds_since_advance_at_scrape_time_without_new_observations(
    run_metrics: metrics.RunMetrics, registry: CollectorRegistry, clock: FakeMonotonic
) -> None:
    run_metrics.observe_run("ml", "train", RUNNING, POLICY, NOW)
    clock.value += 95.5  # the reconciler is idle; Prometheus scrapes later
    run = {"namespace": "ml", "name": "train"}
    assert value(registry, "durablerun_run_seconds_since_progress", **run) == pytest.approx(125.5)
    assert value(registry, "durablerun_run_seconds_since_checkpoint", **run) == pytest.approx(126.5)
    assert value(registry, "durablerun_run_seconds_since_lease_renewal", **run) == pytest.approx(100.5)
    # A new observation with a renewed lease starts that clock again.
    renewed = RUNNING.model_copy(update={"lease": RUNNING.lease.model_copy(update={"renewTime": ts(-95)})})
    run_metrics.observe_run("ml", "train", renewed, POLICY, NOW + timedelta(seconds=95.5))
    clock.value += 2
    assert value(registry, "durablerun_run_seconds_since_lease_renewal", **run) == pytest.approx(2.5)


def test_a_runner_clock_ahead_of_the_operator_reads_as_zero_not_negative(
    run_metrics: metrics.RunMetrics, registry: CollectorRegistry
) -> None:
    ahead = status(phase="Running", lease={"renewTime": ts(-3)}, progress={"lastProgressTime": ts(-3)})
    run_metrics.observe_run("ns", "skewed", ahead, resource.Policy(), NOW)
    assert value(registry, "durablerun_run_seconds_since_lease_renewal", namespace="ns", name="skewed") == 0
    assert value(registry, "durablerun_run_seconds_since_progress", namespace="ns", name="skewed") == 0


def test_staleness_is_exported_only_where_something_should_move(
    run_metrics: metrics.RunMetrics, registry: CollectorRegistry
) -> None:
    stamps = {"lease": {"renewTime": ts(100)}, "progress": {"lastProgressTime": ts(100)},
              "checkpoint": {"time": ts(100)}}
    for phase in ("Backoff", "Waiting", "Succeeded", "Aborted"):
        run_metrics.observe_run("ns", phase.lower(), status(phase=phase, **stamps), resource.Policy(), NOW)
    since = "durablerun_run_seconds_since_"
    # Between attempts the old lease is stale by design: no lease series outside Running.
    assert value(registry, since + "lease_renewal", namespace="ns", name="backoff") is None
    assert value(registry, since + "progress", namespace="ns", name="backoff") == 100
    assert value(registry, since + "checkpoint", namespace="ns", name="waiting") == 100
    for finished in ("succeeded", "aborted"):
        for kind in ("progress", "checkpoint", "lease_renewal"):
            assert value(registry, since + kind, namespace="ns", name=finished) is None


def test_a_run_that_never_completed_a_step_is_stale_since_it_started(
    run_metrics: metrics.RunMetrics, registry: CollectorRegistry
) -> None:
    run_metrics.observe_run("ns", "slow-start", status(phase="Pending", startTime=ts(700)), resource.Policy(), NOW)
    assert value(registry, "durablerun_run_seconds_since_progress", namespace="ns", name="slow-start") == 700
    assert value(registry, "durablerun_run_seconds_since_checkpoint", namespace="ns", name="slow-start") is None


def test_abort_reason_series_exists_while_aborted(run_metrics: metrics.RunMetrics, registry: CollectorRegistry) -> None:
    aborted = status(phase="Aborted", abortReason="BudgetExhausted", cost={"usd": "10.02"})
    run_metrics.observe_run("ns", "pricey", aborted, resource.Policy(costCeilingUSD="10"), NOW)
    assert value(registry, "durablerun_run_abort_reason", namespace="ns", name="pricey", reason="BudgetExhausted") == 1
    # Raising the ceiling resumes the run: the abort series goes away.
    run_metrics.observe_run("ns", "pricey", status(phase="Running", cost={"usd": "10.02"}),
                            resource.Policy(costCeilingUSD="20"), NOW)
    assert "durablerun_run_abort_reason" not in series_of(registry, "ns", "pricey")


def test_counters_start_at_zero_for_every_reason_and_count_events(
    run_metrics: metrics.RunMetrics, registry: CollectorRegistry
) -> None:
    run_metrics.observe_run("ns", "flaky", RUNNING, POLICY, NOW)
    run = {"namespace": "ns", "name": "flaky"}
    # Every known label is there at 0 before anything happens, so increase() sees the first event.
    for reason in metrics.RESTART_REASONS:
        assert value(registry, "durablerun_run_restarts_total", **run, reason=reason) == 0
    for reason in api.AbortReason:
        assert value(registry, "durablerun_run_aborts_total", **run, reason=reason.value) == 0
    for outcome in ("Succeeded", "Failed", "Aborted"):
        assert value(registry, "durablerun_run_completions_total", **run, outcome=outcome) == 0
    run_metrics.record_restart("ns", "flaky", "Crash")
    run_metrics.record_restart("ns", "flaky", "Crash")
    run_metrics.record_restart("ns", "flaky", "Evicted")
    run_metrics.record_abort("ns", "flaky", "RetryLimitExceeded")
    run_metrics.record_completion("ns", "flaky", "Aborted")
    assert value(registry, "durablerun_run_restarts_total", **run, reason="Crash") == 2
    assert value(registry, "durablerun_run_restarts_total", **run, reason="Evicted") == 1
    assert value(registry, "durablerun_run_aborts_total", **run, reason="RetryLimitExceeded") == 1
    assert value(registry, "durablerun_run_completions_total", **run, outcome="Aborted") == 1


def test_unknown_reasons_are_bounded_to_other(run_metrics: metrics.RunMetrics, registry: CollectorRegistry) -> None:
    for i in range(5):
        run_metrics.record_restart("ns", "odd", f"pod-odd-a{i} exited")
    assert value(registry, "durablerun_run_restarts_total", namespace="ns", name="odd", reason="Other") == 5
    restart_labels = {
        sample.labels["reason"] for family in registry.collect() for sample in family.samples
        if sample.name == "durablerun_run_restarts_total"
    }
    assert restart_labels == {*metrics.RESTART_REASONS, "Other"}


def test_forget_run_removes_every_series_of_that_run_only(
    run_metrics: metrics.RunMetrics, registry: CollectorRegistry
) -> None:
    for name in ("gone", "kept"):
        run_metrics.observe_run("ns", name, RUNNING, POLICY, NOW)
        run_metrics.record_restart("ns", name, "OOMKilled")
        run_metrics.record_abort("ns", name, "UserRequested")
        run_metrics.record_completion("ns", name, "Aborted")
    before = series_of(registry, "ns", "gone")
    assert {"durablerun_run_phase", "durablerun_run_restarts_total", "durablerun_run_aborts_total",
            "durablerun_run_completions_total", "durablerun_run_seconds_since_lease_renewal"} <= set(before)
    run_metrics.forget_run("ns", "gone")
    assert series_of(registry, "ns", "gone") == []
    assert series_of(registry, "ns", "kept") == before
    assert run_metrics.runs() == [("ns", "kept")]
    # No series of the forgotten run under any label, e.g. in another metric's exposition.
    assert 'name="gone"' not in _exposition(registry)


def test_operator_histograms_and_errors(run_metrics: metrics.RunMetrics, registry: CollectorRegistry) -> None:
    run_metrics.observe_resume_latency(12.0)
    run_metrics.observe_resume_latency(75.0)
    run_metrics.observe_reconcile(0.02)
    run_metrics.record_reconcile_error()
    assert value(registry, "durablerun_resume_latency_seconds_count") == 2
    assert value(registry, "durablerun_resume_latency_seconds_bucket", le="20.0") == 1
    assert value(registry, "durablerun_resume_latency_seconds_sum") == 87
    assert value(registry, "durablerun_reconcile_duration_seconds_bucket", le="0.025") == 1
    assert value(registry, "durablerun_reconcile_errors_total") == 1


def test_every_metric_is_prefixed_and_labels_are_bounded(
    run_metrics: metrics.RunMetrics, registry: CollectorRegistry
) -> None:
    run_metrics.observe_run("ns", "a", RUNNING, POLICY, NOW)
    run_metrics.record_restart("ns", "a", "Crash")
    allowed = {"namespace", "name", "phase", "reason", "outcome", "le", "version"}
    for family in registry.collect():
        assert family.name.startswith("durablerun_"), family.name
        for sample in family.samples:
            assert set(sample.labels) <= allowed, sample
            # The pod and the step are never labels (they change every attempt/step).
            assert "train-a3" not in sample.labels.values()
            assert "summarize" not in sample.labels.values()


def test_a_second_run_metrics_on_one_registry_is_refused(registry: CollectorRegistry) -> None:
    metrics.RunMetrics(registry)
    with pytest.raises(ValueError, match="Duplicated timeseries"):
        metrics.RunMetrics(registry)


def test_serve_exposes_the_registry_over_http(run_metrics: metrics.RunMetrics) -> None:
    run_metrics.observe_run("ml", "train", RUNNING, POLICY, NOW)
    run_metrics.serve(0, "127.0.0.1")
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{run_metrics.port}/metrics", timeout=5) as response:
            body = response.read().decode()
    finally:
        run_metrics.stop()
    families = {family.name: family for family in text_string_to_metric_families(body)}
    ratio = families["durablerun_run_progress_ratio"].samples[0]
    assert ratio.labels == {"namespace": "ml", "name": "train"}
    assert ratio.value == 0.25
    with pytest.raises(RuntimeError, match="not served"):
        _ = run_metrics.port


def _exposition(registry: CollectorRegistry) -> str:
    from prometheus_client import generate_latest

    return generate_latest(registry).decode()
