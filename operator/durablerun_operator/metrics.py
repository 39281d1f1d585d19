"""The operator's Prometheus metrics: one series set per DurableRun, plus operator health.

The reconcile code calls a small API (``RunMetrics``); it never touches
prometheus-client itself, so names, labels and lifetimes are decided here, in
one place, and documented in docs/metrics.md. Alerts and the dashboard
(hack/monitoring/) query exactly these names. That is why it is one module of
over 400 lines: a series' name, labels, lifetime and the snapshot it is
computed from are read together, and split they would drift apart.

Design choices, and why:

- Per-run series live in one custom collector fed from stored state, not in
  labelled Gauge/Counter objects. ``forget_run`` drops one dict entry and every
  series of that run (gauges and counters alike) is gone at the next scrape;
  no label set can be left behind.
- "Seconds since" gauges are computed when Prometheus scrapes, from the
  timestamps of the last observed status plus the monotonic time elapsed since
  that observation. A reconcile loop that is slow or idle does not freeze them,
  and a wall-clock jump on the operator's node does not bend them.
- Labels are bounded: ``namespace`` and ``name`` of the run, and small closed
  sets (phase, reason, outcome). Never pod names, step names or epochs.
- Every counter of a run starts at 0 for every known reason the first time the
  run is seen. A series that appears already at 1 is invisible to
  ``increase()``/``rate()``; pre-initialised series make the first restart or
  abort count.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from decimal import Decimal, InvalidOperation
from importlib import metadata
from wsgiref.simple_server import WSGIServer

from prometheus_client import REGISTRY, CollectorRegistry, Counter, Gauge, Histogram, Info, start_http_server
from prometheus_client.metrics_core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily, Metric
from prometheus_client.registry import Collector

from durablerun import api, quotas, resource

logger = logging.getLogger(__name__)

PREFIX = "durablerun_"
RUN_LABELS = ("namespace", "name")

# Closed label sets. Anything else is counted as "Other" (and logged) so a
# caller's typo cannot grow the number of series without bound.
# Restarts: Crash, OOMKilled, LeaseExpired and Fenced (an attempt superseded by a
# zombie write) count against maxRestarts; the rest are disruptions.
RESTART_REASONS = tuple(reason.value for reason in api.RestartReason)
ABORT_REASONS = tuple(reason.value for reason in api.AbortReason)
COMPLETION_OUTCOMES = (api.Phase.SUCCEEDED.value, api.Phase.FAILED.value, api.Phase.ABORTED.value)
OTHER = "Other"
PHASES = tuple(phase.value for phase in api.Phase)
FINISHED_PHASES = frozenset(phase.value for phase in api.Phase if phase.finished)

# Pod end -> new attempt holds the lease: backoff (10s..5m by default) plus pod
# start-up and replay, so seconds to tens of minutes.
RESUME_LATENCY_BUCKETS = (1.0, 2.5, 5.0, 10.0, 20.0, 30.0, 60.0, 120.0, 300.0, 600.0, 1200.0, 3600.0)
# One reconcile is a few API calls: milliseconds to seconds.
RECONCILE_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)

Clock = Callable[[], float]


def _version() -> str:
    try:
        return metadata.version("durable-run")
    except metadata.PackageNotFoundError:  # running from a source tree without an install
        return "unknown"


def _timestamp(text: str | None) -> datetime | None:
    """An RFC 3339 status timestamp as an aware datetime; None if absent or unreadable."""
    if not text:
        return None
    try:
        return api.parse_time(text)
    except ValueError:
        logger.warning("ignoring unreadable timestamp %r in a DurableRun status", text)
        return None


def _number(text: str | None) -> float | None:
    """A decimal string (cost, fraction) as a float; None if absent or unreadable."""
    if text is None:
        return None
    try:
        return float(Decimal(text))
    except (InvalidOperation, ValueError):
        logger.warning("ignoring unreadable number %r in a DurableRun", text)
        return None


@dataclass(slots=True)
class _Snapshot:
    """What one ``observe_run`` saw, reduced to numbers and timestamps."""

    phase: str
    abort_reason: str | None
    trace_id: str | None
    progress_ratio: float | None
    completed_steps: int
    total_steps: int | None
    cost_usd: float | None
    tokens: int
    children: int | None
    children_cost_usd: float | None
    restarts: int
    disruptions: int
    cost_ceiling_usd: float | None
    token_limit: int | None
    step_limit: int | None
    progress_timeout_seconds: float | None
    lease_duration_seconds: float | None
    last_progress: datetime | None
    last_checkpoint: datetime | None
    lease_renewal: datetime | None
    #: The policy.askAt limit a Waiting run reached (status.waitingFor.budget), while it waits on it.
    waiting_on_budget: str | None
    #: The model quota a Waiting run found no room in (status.waitingFor.quota), while it waits for it.
    waiting_on_quota: str | None
    # The reconciler's "now" and the monotonic clock at the same instant: at
    # scrape time, age = (observed_at - t) + (monotonic() - observed_mono).
    observed_at: datetime
    observed_mono: float


def _ratio(status: resource.DurableRunStatus, phase: str) -> float | None:
    progress = status.progress
    fraction = _number(progress.fraction)
    if fraction is not None:
        return fraction
    if progress.totalSteps:
        return progress.completedSteps / progress.totalSteps
    # A run that succeeded has done all its steps, even when it never said how many.
    return 1.0 if phase == api.Phase.SUCCEEDED.value else None


def _snapshot(status: resource.DurableRunStatus, policy: resource.Policy, now: datetime, mono: float) -> _Snapshot:
    # A run the operator has not yet given a phase is, for humans and alerts, Pending.
    phase = (status.phase or api.Phase.PENDING).value
    if now.tzinfo is None:
        now = now.replace(tzinfo=UTC)
    lease_duration = status.lease.durationSeconds
    return _Snapshot(
        phase=phase,
        abort_reason=status.abortReason.value if status.abortReason else None,
        trace_id=status.traceID,
        progress_ratio=_ratio(status, phase),
        completed_steps=status.progress.completedSteps,
        total_steps=status.progress.totalSteps,
        cost_usd=_number(status.cost.usd),
        tokens=status.cost.tokens,
        children=status.childrenTotal.runs if status.childrenTotal else None,
        children_cost_usd=_number(status.childrenTotal.usd) if status.childrenTotal else None,
        restarts=status.restarts,
        disruptions=status.disruptions,
        cost_ceiling_usd=_number(policy.costCeilingUSD),
        token_limit=policy.maxTokens,
        step_limit=policy.maxSteps,
        progress_timeout_seconds=policy.progress_timeout.total_seconds(),
        lease_duration_seconds=float(lease_duration) if lease_duration else policy.lease_duration.total_seconds(),
        # A run that never completed a step has made no progress since it started.
        last_progress=_timestamp(status.progress.lastProgressTime) or _timestamp(status.startTime),
        last_checkpoint=_timestamp(status.checkpoint.time),
        lease_renewal=_timestamp(status.lease.renewTime) or _timestamp(status.lease.acquireTime),
        waiting_on_budget=(status.waitingFor.budget if phase == api.Phase.WAITING.value and status.waitingFor
                           else None),
        waiting_on_quota=(status.waitingFor.quota if phase == api.Phase.WAITING.value and status.waitingFor
                          else None),
        observed_at=now,
        observed_mono=mono,
    )


@dataclass(slots=True)
class _Run:
    snapshot: _Snapshot | None = None
    # Counts by (kind, label), only those ever counted ("restarts", "aborts", "completions"): most runs never
    # restart or abort, and a dict of zeros per kind is a kilobyte a run in a fleet of 100,000. Every known
    # label is exported all the same, 0 when absent.
    counts: dict[tuple[str, str], float] = field(default_factory=dict)


#: The counter of each kind of count, and the labels it always exports.
_COUNTED = (("restarts", "run_restarts", RESTART_REASONS), ("aborts", "run_aborts", ABORT_REASONS),
            ("completions", "run_completions", COMPLETION_OUTCOMES))


def _gauge(name: str, documentation: str, *extra_labels: str) -> GaugeMetricFamily:
    return GaugeMetricFamily(PREFIX + name, documentation, labels=(*RUN_LABELS, *extra_labels))


def _counter(name: str, documentation: str, *extra_labels: str) -> CounterMetricFamily:
    return CounterMetricFamily(PREFIX + name, documentation, labels=(*RUN_LABELS, *extra_labels))


class _RunCollector(Collector):
    """Renders every run's series from the stored snapshots at scrape time."""

    def __init__(self, metrics: RunMetrics) -> None:
        self._metrics = metrics

    def describe(self) -> Iterable[Metric]:
        # Names only, so the registry rejects a second collector with the same names.
        return [*self._families(), self._queued()]

    @staticmethod
    def _queued() -> GaugeMetricFamily:
        return GaugeMetricFamily(PREFIX + "runs_queued", "Runs waiting for Kueue to admit their next attempt "
                                 "(phase Queued), by namespace.", labels=("namespace",))

    def collect(self) -> Iterable[Metric]:
        families = self._families()
        by_name = {family.name: family for family in families}
        runs = self._metrics._runs_copy()
        mono = self._metrics._monotonic()
        queued: dict[str, int] = {}
        for key, run in sorted(runs.items()):
            self._fill(by_name, key, run, mono)
            if run.snapshot is not None and run.snapshot.phase == api.Phase.QUEUED.value:
                queued[key[0]] = queued.get(key[0], 0) + 1
        runs_queued = self._queued()
        for namespace, count in sorted(queued.items()):
            runs_queued.add_metric([namespace], count)
        return [*families, runs_queued]

    @staticmethod
    def _families() -> list[Metric]:
        return [
            _gauge("run_phase", "1 for the run's current phase, 0 for every other phase.", "phase"),
            _gauge("run_abort_reason", "1 while the run is Aborted, labelled with status.abortReason.", "reason"),
            _gauge("run_trace", "1, labelled with the run's OpenTelemetry trace id (status.traceID): the "
                   "dashboard links a run to its trace.", "trace_id"),
            _gauge("run_progress_ratio", "Fraction of the run's steps completed, 0..1 (when known)."),
            _gauge("run_completed_steps", "Steps journaled so far (status.progress.completedSteps)."),
            _gauge("run_total_steps", "Total steps, when the workflow declares it (status.progress.totalSteps)."),
            _gauge("run_cost_usd", "Cost so far in US dollars (status.cost.usd)."),
            _gauge("run_tokens", "Tokens used so far (status.cost.tokens)."),
            _gauge("run_cost_ceiling_usd", "spec.policy.costCeilingUSD, when set."),
            _gauge("run_children", "Child runs created for the run (status.childrenTotal.runs), when it has any."),
            _gauge("run_children_cost_usd", "Its child runs' cost in US dollars (status.childrenTotal.usd); "
                   "it counts toward the run's costCeilingUSD."),
            _gauge("run_token_limit", "spec.policy.maxTokens, when set."),
            _gauge("run_step_limit", "spec.policy.maxSteps, when set."),
            _gauge("run_waiting_on_budget", "1 while the run waits for a person to raise the policy.askAt limit it "
                   "reached (status.waitingFor.budget: costUSD or tokens).", "budget"),
            _gauge("run_waiting_on_quota", "1 while the run waits, with no pod, for room in the model quota it "
                   "names (status.waitingFor.quota).", "quota"),
            _gauge("run_status_restarts", "Restarts after crashes, OOM kills and expired leases (status.restarts)."),
            _gauge("run_status_disruptions", "Restarts after evictions, preemptions, lost nodes, deleted pods."),
            _gauge("run_progress_timeout_seconds", "spec.policy.progressTimeout in seconds."),
            _gauge("run_lease_duration_seconds", "Lease validity without renewal, in seconds."),
            _gauge("run_seconds_since_progress", "Seconds since a step last completed (or the run started)."),
            _gauge("run_seconds_since_checkpoint", "Seconds since the run last wrote its journal."),
            _gauge("run_seconds_since_lease_renewal", "Seconds since the runner last renewed its lease (Running)."),
            _counter("run_restarts", "Restarts the operator made, by cause.", "reason"),
            _counter("run_aborts", "Times the run was aborted, by abortReason.", "reason"),
            _counter("run_completions", "Times the run finished, by outcome (its final phase).", "outcome"),
        ]

    @staticmethod
    def _fill(by_name: dict[str, Metric], key: tuple[str, str], run: _Run, mono: float) -> None:
        def put(name: str, value: float | None, *extra: str) -> None:
            if value is not None:
                family = by_name[PREFIX + name]
                assert isinstance(family, GaugeMetricFamily | CounterMetricFamily)
                family.add_metric([*key, *extra], value)

        for kind, name, known in _COUNTED:
            others = sorted(label for k, label in run.counts if k == kind and label not in known)
            for label in (*known, *others):
                put(name, run.counts.get((kind, label), 0.0), label)
        snap = run.snapshot
        if snap is None:  # only events so far (e.g. right after an operator restart)
            return
        for phase in PHASES:
            put("run_phase", 1.0 if phase == snap.phase else 0.0, phase)
        if snap.phase == api.Phase.ABORTED.value:
            put("run_abort_reason", 1.0, snap.abort_reason or "Unknown")
        if snap.trace_id:
            put("run_trace", 1.0, snap.trace_id)
        put("run_progress_ratio", snap.progress_ratio)
        put("run_completed_steps", snap.completed_steps)
        put("run_total_steps", snap.total_steps)
        put("run_cost_usd", snap.cost_usd)
        put("run_tokens", snap.tokens)
        put("run_cost_ceiling_usd", snap.cost_ceiling_usd)
        put("run_children", snap.children)
        put("run_children_cost_usd", snap.children_cost_usd)
        put("run_token_limit", snap.token_limit)
        put("run_step_limit", snap.step_limit)
        if snap.waiting_on_budget:
            put("run_waiting_on_budget", 1.0, snap.waiting_on_budget)
        if snap.waiting_on_quota:
            put("run_waiting_on_quota", 1.0, snap.waiting_on_quota)
        put("run_status_restarts", snap.restarts)
        put("run_status_disruptions", snap.disruptions)
        put("run_progress_timeout_seconds", snap.progress_timeout_seconds)
        put("run_lease_duration_seconds", snap.lease_duration_seconds)

        def age(then: datetime | None) -> float | None:
            if then is None:
                return None
            seconds = (snap.observed_at - then).total_seconds() + (mono - snap.observed_mono)
            # A runner clock ahead of the operator's must not read as negative staleness.
            return max(seconds, 0.0)

        # Staleness only where something is expected to move: a finished run's
        # last progress is history, and only a Running run has a pod that must
        # renew the lease (in Backoff the old lease is stale by design).
        if snap.phase not in FINISHED_PHASES:
            put("run_seconds_since_progress", age(snap.last_progress))
            put("run_seconds_since_checkpoint", age(snap.last_checkpoint))
        if snap.phase == api.Phase.RUNNING.value:
            put("run_seconds_since_lease_renewal", age(snap.lease_renewal))


#: One quota's counts as its runners keep them in the shared windows: calls a provider refused, grants per
#: wait bucket (quotas.WAIT_BUCKETS and one past the last bound), and the seconds those grants waited.
QuotaCounts = tuple[int, tuple[int, ...], float]


class _QuotaCountsCollector(Collector):
    """Renders the counts the runners keep in Redis as last read. They are Redis's, not this process's: one
    replica renders each quota's (the one that writes its status), and they start again from 0, a counter
    reset to Prometheus, when the quota's keys were idle long enough for Redis to drop them."""

    def __init__(self, metrics: RunMetrics) -> None:
        self._metrics = metrics

    def describe(self) -> Iterable[Metric]:
        return self._families()

    @staticmethod
    def _families() -> list[Metric]:
        return [
            CounterMetricFamily(PREFIX + "quota_provider_rejections", "Calls to the model quota's models that a "
                                "provider refused (429), as the runners counted them.", labels=("quota",)),
            HistogramMetricFamily(PREFIX + "quota_grant_wait_seconds", "How long calls waited for their share of "
                                  "the model quota, from the first ask to the grant (across the run's pods when "
                                  "it yielded).", labels=("quota",)),
        ]

    def collect(self) -> Iterable[Metric]:
        rejected, waits = self._families()
        bounds = [*(str(bound) for bound in quotas.WAIT_BUCKETS), "+Inf"]
        for name, (refused, counts, seconds) in sorted(self._metrics._quota_counts_copy().items()):
            rejected.add_metric([name], refused)  # type: ignore[attr-defined]
            cumulative = [sum(counts[:i + 1]) for i in range(len(bounds))]
            waits.add_metric([name], buckets=list(zip(bounds, cumulative, strict=True)),  # type: ignore[attr-defined]
                             sum_value=seconds)
        return [rejected, waits]


class RunMetrics:
    """The operator's metrics. Thread-safe: reconcile handlers write, the HTTP thread scrapes.

    ``registry`` None means prometheus-client's default registry, which also
    carries the process_* and python_* metrics of the operator process.
    ``monotonic`` is injectable for tests.
    """

    def __init__(
        self,
        registry: CollectorRegistry | None = None,
        *,
        version: str | None = None,
        monotonic: Clock = time.monotonic,
    ) -> None:
        self._registry = REGISTRY if registry is None else registry
        self._monotonic = monotonic
        self._lock = threading.Lock()
        self._runs: dict[tuple[str, str], _Run] = {}
        self._server: WSGIServer | None = None
        self._thread: threading.Thread | None = None

        self._registry.register(_RunCollector(self))
        self._quota_counts: dict[str, QuotaCounts] = {}
        self._registry.register(_QuotaCountsCollector(self))
        self._resume_latency = Histogram(
            PREFIX + "resume_latency_seconds",
            "Seconds from the end of a run's previous pod until the next attempt holds the lease.",
            buckets=RESUME_LATENCY_BUCKETS, registry=self._registry,
        )
        self._reconcile = Histogram(
            PREFIX + "reconcile_duration_seconds",
            "Seconds one reconcile of a DurableRun took.",
            buckets=RECONCILE_BUCKETS, registry=self._registry,
        )
        self._reconcile_errors = Counter(
            PREFIX + "reconcile_errors",
            "Reconciles of a DurableRun that ended in an error (the run is reconciled again after a backoff).",
            registry=self._registry,
        )
        self._upgrades = Counter(
            PREFIX + "upgrades",
            "Runs moved to a new runner image by kubectl durablerun upgrade (their pin moved).",
            registry=self._registry,
        )
        self._mass_lease_expiry = Gauge(
            PREFIX + "mass_lease_expiry",
            "1 while a mass lease expiry holds restarts that rest only on the lease (docs/operator.md), else 0.",
            registry=self._registry,
        )
        self._starts_paced = Gauge(
            PREFIX + "starts_paced",
            "1 while new runs' first pods are paced because running runs' lease renewals fall behind "
            "(docs/operator.md, Renewals first), else 0.",
            registry=self._registry,
        )
        self._lease_restarts_held = Gauge(
            PREFIX + "lease_restarts_held",
            "Runs whose lease expired and whose restart is held because of a mass lease expiry.",
            registry=self._registry,
        )
        quota = ("quota",)
        self._quota_gauges = {
            "tokens_used": Gauge(PREFIX + "quota_tokens_used", "Tokens taken in the model quota's last-minute "
                                 "window (ModelQuota status.tokensUsed).", quota, registry=self._registry),
            "tokens_limit": Gauge(PREFIX + "quota_tokens_limit", "The model quota's tokensPerMinute.", quota,
                                  registry=self._registry),
            "requests_used": Gauge(PREFIX + "quota_requests_used", "Requests taken in the model quota's last-minute "
                                   "window.", quota, registry=self._registry),
            "requests_limit": Gauge(PREFIX + "quota_requests_limit", "The model quota's requestsPerMinute.", quota,
                                    registry=self._registry),
            "in_flight": Gauge(PREFIX + "quota_calls_in_flight", "Calls granted a share of the model quota and not "
                               "yet settled.", quota, registry=self._registry),
            "runs_waiting": Gauge(PREFIX + "quota_runs_waiting", "Runs Waiting, with no pod, for room in the model "
                                  "quota (of the runs this replica decides).", quota, registry=self._registry),
            "up": Gauge(PREFIX + "quota_windows_up", "1 when the operator last read the model quota's windows from "
                        "the shared Redis, 0 when it could not (runners then wait or proceed, as "
                        f"{api.Env.LLM_QUOTA_UNAVAILABLE} says).", quota, registry=self._registry),
        }
        self._quotas: set[str] = set()
        # An Info metric: exposed as durablerun_build_info{version="..."} 1.
        Info(PREFIX + "build", "The operator's version.", registry=self._registry).info(
            {"version": version or _version()}
        )

    # --- per run --------------------------------------------------------------

    def observe_run(
        self, namespace: str, name: str, status: resource.DurableRunStatus, policy: resource.Policy, now: datetime
    ) -> None:
        """Sets every gauge of the run from its status and policy, as of ``now``."""
        snapshot = _snapshot(status, policy, now, self._monotonic())
        with self._lock:
            self._run((namespace, name)).snapshot = snapshot

    def forget_run(self, namespace: str, name: str) -> None:
        """Removes every series of the run (call when the DurableRun is deleted)."""
        with self._lock:
            self._runs.pop((namespace, name), None)

    def record_restart(self, namespace: str, name: str, reason: str) -> None:
        """Counts a restart by cause: one of ``RESTART_REASONS``."""
        self._count(namespace, name, "restarts", reason, RESTART_REASONS)

    def record_abort(self, namespace: str, name: str, reason: str) -> None:
        """Counts an abort by its ``api.AbortReason``."""
        self._count(namespace, name, "aborts", reason, ABORT_REASONS)

    def record_completion(self, namespace: str, name: str, outcome: str) -> None:
        """Counts a finished run by its final phase: Succeeded, Failed or Aborted."""
        self._count(namespace, name, "completions", outcome, COMPLETION_OUTCOMES)

    def runs(self) -> list[tuple[str, str]]:
        """The (namespace, name) of every run with series, e.g. to forget runs that vanished."""
        with self._lock:
            return sorted(self._runs)

    # --- operator -------------------------------------------------------------

    def observe_resume_latency(self, seconds: float) -> None:
        """Previous pod ended -> new attempt holds the lease."""
        self._resume_latency.observe(seconds)

    def observe_reconcile(self, seconds: float) -> None:
        self._reconcile.observe(seconds)

    def record_reconcile_error(self) -> None:
        self._reconcile_errors.inc()

    def record_upgrade(self) -> None:
        self._upgrades.inc()

    def set_mass_lease_expiry(self, active: bool) -> None:
        self._mass_lease_expiry.set(1 if active else 0)

    def set_starts_paced(self, paced: bool) -> None:
        self._starts_paced.set(1 if paced else 0)

    def set_lease_restarts_held(self, runs: int) -> None:
        self._lease_restarts_held.set(runs)

    # --- model quotas ---------------------------------------------------------

    def runs_waiting_on_quota(self) -> dict[str, int]:
        """Runs Waiting for room, per model quota (status.waitingFor.quota)."""
        counts: dict[str, int] = {}
        with self._lock:
            for run in self._runs.values():
                if run.snapshot is not None and run.snapshot.waiting_on_quota:
                    counts[run.snapshot.waiting_on_quota] = counts.get(run.snapshot.waiting_on_quota, 0) + 1
        return counts

    def observe_quota(self, name: str, tokens_limit: int | None, requests_limit: int | None,
                      used: tuple[float, float, int] | None, runs_waiting: int | None) -> None:
        """A reading of quota ``name``'s windows: (tokens, requests, calls in flight), None if unreadable."""
        gauges = self._quota_gauges
        self._quotas.add(name)
        gauges["up"].labels(name).set(0 if used is None else 1)
        for key, value in (("tokens_limit", tokens_limit), ("requests_limit", requests_limit),
                           ("runs_waiting", runs_waiting),
                           ("tokens_used", None if used is None or not tokens_limit else used[0]),
                           ("requests_used", None if used is None or not requests_limit else used[1]),
                           ("in_flight", None if used is None else used[2])):
            if value is None:
                with contextlib.suppress(KeyError):
                    gauges[key].remove(name)
            else:
                gauges[key].labels(name).set(value)

    def observe_quota_counts(self, name: str, counts: QuotaCounts | None) -> None:
        """Quota ``name``'s counts as read from its windows; None: this replica does not render them (another
        writes the quota's status), or they could not be read."""
        with self._lock:
            if counts is None:
                self._quota_counts.pop(name, None)
            else:
                self._quota_counts[name] = counts

    def _quota_counts_copy(self) -> dict[str, QuotaCounts]:
        with self._lock:
            return dict(self._quota_counts)

    def forget_quotas_but(self, names: set[str]) -> None:
        """Remove the series of the quotas not in ``names`` (deleted)."""
        with self._lock:
            self._quota_counts = {name: c for name, c in self._quota_counts.items() if name in names}
        for gone in self._quotas - names:
            for gauge in self._quota_gauges.values():
                with contextlib.suppress(KeyError):
                    gauge.remove(gone)
        self._quotas &= names

    # --- HTTP -----------------------------------------------------------------

    def serve(self, port: int, addr: str = "0.0.0.0") -> None:
        """Serves /metrics on ``addr:port`` from a daemon thread (port 0: any free port, see ``port``)."""
        if self._server is not None:
            raise RuntimeError(f"metrics are already served on port {self.port}")
        self._server, self._thread = start_http_server(port, addr=addr, registry=self._registry)

    @property
    def port(self) -> int:
        """The port ``serve`` listens on."""
        if self._server is None:
            raise RuntimeError("metrics are not served: call serve() first")
        return int(self._server.server_port)

    def stop(self) -> None:
        """Stops serving (tests; the operator serves until it exits)."""
        if self._server is not None and self._thread is not None:
            self._server.shutdown()
            self._server.server_close()
            self._thread.join()
        self._server = self._thread = None

    # --- internals ------------------------------------------------------------

    def _run(self, key: tuple[str, str]) -> _Run:
        run = self._runs.get(key)
        if run is None:
            run = self._runs[key] = _Run()
        return run

    def _count(self, namespace: str, name: str, kind: str, label: str, known: tuple[str, ...]) -> None:
        if label not in known:
            logger.warning("metrics: unknown %s label %r for %s/%s, counted as %s", kind, label,
                           namespace, name, OTHER)
            label = OTHER
        with self._lock:
            counts = self._run((namespace, name)).counts
            counts[kind, label] = counts.get((kind, label), 0.0) + 1.0

    def _runs_copy(self) -> dict[tuple[str, str], _Run]:
        # Snapshots are replaced, never mutated, so a shallow copy under the lock
        # is a consistent view; counters are copied since they are mutated.
        with self._lock:
            return {
                key: _Run(run.snapshot, dict(run.counts))
                for key, run in self._runs.items()
            }

