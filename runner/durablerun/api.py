"""The DurableRun contract shared by the SDK, the runner pod and the operator.

The custom resource's spec and status models are in ``durablerun.resource``,
the other half of the contract; this module holds the names and encodings.

One source for: the resource's group, version and kind, the
outcomes a runner attempt ends with and their exit codes, the restart reasons,
the labels, annotations and environment the operator hands to a runner pod, the
operator's own environment, the OpenTelemetry settings both read
(``otlp_traces_endpoint``), the clock (``now()``), and the encodings both sides
must agree on (durations, times, the input hash). docs/design.md describes the
contract as a whole. The operator imports this module; this module imports
nothing of the operator. Every one of these names is written only here or in
resource.py: the
runner, the operator, hack/, bench/ and tests/ import it
(tests/test_contract_literals.py fails on a copy).
"""

from __future__ import annotations

import enum
import functools
import hashlib
import json
import re
from collections.abc import Mapping
from datetime import UTC, datetime, timedelta
from typing import Any, overload
from urllib.parse import urlsplit

from pydantic import BaseModel, ConfigDict, Field

from durablerun import errors

GROUP = "durablerun.dev"
VERSION = "v1alpha1"
API_VERSION = f"{GROUP}/{VERSION}"
KIND = "DurableRun"
PLURAL = "durableruns"
SINGULAR = "durablerun"
SHORT_NAME = "dr"
#: The CustomResourceDefinition's name.
CRD_NAME = f"{PLURAL}.{GROUP}"
# The ModelQuota kind (durablerun.quotas): cluster-scoped limits on model calls that the runs of the namespaces
# it covers share.
QUOTA_KIND = "ModelQuota"
QUOTA_PLURAL = "modelquotas"
QUOTA_SINGULAR = "modelquota"
QUOTA_SHORT_NAME = "mq"
QUOTA_CRD_NAME = f"{QUOTA_PLURAL}.{GROUP}"
# The DurableRunSchedule kind (durablerun.schedules): DurableRuns created on a clock, as a CronJob creates Jobs.
SCHEDULE_KIND = "DurableRunSchedule"
SCHEDULE_PLURAL = "durablerunschedules"
SCHEDULE_SINGULAR = "durablerunschedule"
SCHEDULE_SHORT_NAME = "drs"
SCHEDULE_CRD_NAME = f"{SCHEDULE_PLURAL}.{GROUP}"

# Labels and annotations the operator puts on runner pods.
LABEL_RUN = f"{GROUP}/run"
LABEL_EPOCH = f"{GROUP}/epoch"
# Kubernetes' recommended labels (app.kubernetes.io/*) and the values durable-run gives them.
LABEL_NAME = "app.kubernetes.io/name"
LABEL_COMPONENT = "app.kubernetes.io/component"
LABEL_MANAGED_BY = "app.kubernetes.io/managed-by"
#: LABEL_MANAGED_BY of what the operator creates; LABEL_NAME of the CRD and the chart's objects.
APP_NAME = "durable-run"
#: LABEL_NAME of runner pods.
RUNNER_APP_NAME = "durablerun-runner"
#: LABEL_COMPONENT of the operator's pod (the chart sets it): select it with OPERATOR_SELECTOR.
OPERATOR_COMPONENT = "operator"
OPERATOR_SELECTOR = f"{LABEL_COMPONENT}={OPERATOR_COMPONENT}"
#: reportingComponent and reportingInstance of the Events the operator writes.
REPORTING_COMPONENT = f"{GROUP}/operator"
REPORTING_INSTANCE = "durablerun-operator"
POD_FINALIZER = f"{GROUP}/termination"
RUN_FINALIZER = f"{GROUP}/cleanup"
# The container of a runner pod that runs `durablerun pod`.
RUNNER_CONTAINER = "runner"
# The runner container's terminationMessagePath: the runner writes its outcome there for the kubelet.
TERMINATION_MESSAGE_PATH = "/dev/termination-log"
# Annotations users set on a DurableRun (kubectl durablerun abort / retry):
# abort it (the value is the reason); retry a Failed or Aborted run from its journal (any new value,
# e.g. a timestamp, asks once more).
ANNOTATION_ABORT = f"{GROUP}/abort"
ANNOTATION_RETRY = f"{GROUP}/retry"
# Move a run to new code (kubectl durablerun upgrade, after its replay check passed): a JSON object
# {"image": "<name>@sha256:...", "by": "<who>", "checkedIn": "<the replay pod>"}; the operator moves
# status.pin to it once per value (docs/operator.md#upgrading-code-under-running-runs).
ANNOTATION_UPGRADE = f"{GROUP}/upgrade"
# The label a child run carries: its parent DurableRun's name (kubectl durablerun tree).
LABEL_PARENT = f"{GROUP}/parent"
# On a run a DurableRunSchedule created: the schedule's name (kubectl get dr -l durablerun.dev/schedule=<name>),
# and the tick it was created for (RFC 3339, UTC), as a CronJob's Jobs carry batch.kubernetes.io/cronjob-*.
LABEL_SCHEDULE = f"{GROUP}/schedule"
ANNOTATION_SCHEDULED_TIME = f"{GROUP}/scheduled-time"
# The most child runs one run may start (ctx.start_child refuses the next one; the API server refuses a
# status.childRequests or status.childrenCreated past it). Each child's request, name and compact outcome
# event live in the parent's DurableRun (its state is its own): 1,000 finished children make a ~255 KiB parent
# (bench/RESULTS.md); etcd refuses 1.5 MiB.
CHILDREN_MAX = 1000
# On a child run: its parent's trace id (status.traceID), so the operator links the two traces.
ANNOTATION_PARENT_TRACE = f"{GROUP}/parent-trace"
# Set by the operator on a child it suspended or aborted because its parent was suspended or ended; the
# operator lifts what it set (and only that) when the parent resumes or is retried.
ANNOTATION_SUSPENDED_BY_PARENT = f"{GROUP}/suspended-by-parent"
ANNOTATION_ABORTED_BY_PARENT = f"{GROUP}/aborted-by-parent"
# The operator's own marks on pods it made: one it deleted itself (any other deletion is a disruption), and
# the pod that deletes a run's journal (retention Delete).
ANNOTATION_DELETED_BY_OPERATOR = f"{GROUP}/deleted-by-operator"
LABEL_PURGE = f"{GROUP}/purge"
LABEL_UPGRADE_CHECK = f"{GROUP}/upgrade-check"  # the pod that replays a run's journal with an upgrade's image
# Kueue's own labels (its Job integration reads the same ones): a run with the first waits in that LocalQueue
# for admission when the operator runs with Kueue on; the second names a WorkloadPriorityClass.
LABEL_QUEUE_NAME = "kueue.x-k8s.io/queue-name"
LABEL_PRIORITY_CLASS = "kueue.x-k8s.io/priority-class"


class Phase(enum.StrEnum):
    """Where a run is, for humans and for ``kubectl get``."""

    PENDING = "Pending"
    QUEUED = "Queued"  # waiting for Kueue to admit the attempt (docs/install.md "Queues and quotas with Kueue")
    RUNNING = "Running"
    WAITING = "Waiting"
    SUSPENDED = "Suspended"
    BACKOFF = "Backoff"
    SUCCEEDED = "Succeeded"
    FAILED = "Failed"
    ABORTED = "Aborted"

    @property
    def finished(self) -> bool:
        return self in (Phase.SUCCEEDED, Phase.FAILED, Phase.ABORTED)


class ConditionType(enum.StrEnum):
    """status.conditions' types, as a Job's (kubectl wait --for=condition=Complete)."""

    PROGRESSING = "Progressing"
    SUSPENDED = "Suspended"
    COMPLETE = "Complete"
    FAILED = "Failed"
    #: Only once an upgrade was asked for: True when the image asked for replays the journal, else False.
    UPGRADE_REPLAYS = "UpgradeReplays"


class UpgradeState(enum.StrEnum):
    """status.upgradeCheck.state: the operator's replay check of an upgrade's image."""

    CHECKING = "Checking"
    REPLAYS = "Replays"  # the image replays the journal cleanly (the pin moved, unless it was a dry run)
    REFUSED = "Refused"  # it diverges, raises, cannot start, or the request itself cannot be honoured


class AbortReason(enum.StrEnum):
    USER_REQUESTED = "UserRequested"
    BUDGET_EXHAUSTED = "BudgetExhausted"
    MAX_DURATION_EXCEEDED = "MaxDurationExceeded"
    PROGRESS_TIMEOUT = "ProgressTimeout"
    RETRY_LIMIT_EXCEEDED = "RetryLimitExceeded"


class Outcome(enum.StrEnum):
    """How one runner attempt ended. Exactly one per attempt."""

    COMPLETED = "Completed"
    FAILED = "Failed"
    USAGE_ERROR = "UsageError"
    ABORTED = "Aborted"
    SUSPENDED = "Suspended"
    WAITING = "Waiting"
    FENCED = "Fenced"

    @property
    def exit_code(self) -> int:
        return _EXIT_CODES[self]

    @property
    def final_phase(self) -> Phase | None:
        """The phase a run ends in when an attempt ends so, or None when the run goes on (the one mapping: the
        operator's decisions and the SDK's local families both read it)."""
        return _FINAL_PHASES.get(self)


_FINAL_PHASES = {
    Outcome.COMPLETED: Phase.SUCCEEDED,
    Outcome.FAILED: Phase.FAILED,
    Outcome.USAGE_ERROR: Phase.FAILED,
    Outcome.ABORTED: Phase.ABORTED,
}

_EXIT_CODES = {
    Outcome.COMPLETED: 0,
    Outcome.FAILED: 1,
    Outcome.USAGE_ERROR: 2,
    Outcome.ABORTED: 3,
    Outcome.SUSPENDED: 4,
    Outcome.WAITING: 4,
    Outcome.FENCED: 5,
}


#: The reason of the Event the operator posts on a run it restarts; its message starts with the
#: RestartReason and a colon (``Crash: ...``). The timeline shows it on the restart's row.
EVENT_RESTARTING = "Restarting"


class RestartReason(enum.StrEnum):
    """Why the operator restarted a run (the ``reason`` label of durablerun_run_restarts_total)."""

    CRASH = "Crash"
    OOM_KILLED = "OOMKilled"
    LEASE_EXPIRED = "LeaseExpired"
    FENCED = "Fenced"  # an attempt superseded by a zombie write
    EVICTED = "Evicted"
    PREEMPTED = "Preempted"
    NODE_LOST = "NodeLost"
    POD_DELETED = "PodDeleted"

    @property
    def disruption(self) -> bool:
        """Infrastructure's doing: counts against policy.maxDisruptions, not maxRestarts."""
        return self not in (RestartReason.CRASH, RestartReason.OOM_KILLED, RestartReason.LEASE_EXPIRED,
                            RestartReason.FENCED)


class Env:
    """Environment variables of the runner container.

    The operator sets the first group; users may set the second in spec.template (or, for the CLI and
    local runs, in their shell).
    """

    NAMESPACE = "DURABLERUN_NAMESPACE"
    NAME = "DURABLERUN_NAME"
    UID = "DURABLERUN_UID"
    EPOCH = "DURABLERUN_EPOCH"
    POD_NAME = "DURABLERUN_POD_NAME"
    # The node the pod runs on (the downward API's spec.nodeName): an attribute of the attempt's span.
    NODE_NAME = "DURABLERUN_NODE_NAME"
    # Where the runner writes its outcome for the kubelet to report; equals
    # the container's terminationMessagePath.
    TERMINATION_MESSAGE_PATH = "DURABLERUN_TERMINATION_MESSAGE_PATH"
    # MODE_PURGE: delete the run's journal (retention Delete) instead of running it.
    MODE = "DURABLERUN_MODE"
    MODE_PURGE = "purge"
    # The cluster's name (the operator's own OperatorEnv.CLUSTER, the same variable), recorded in the store's
    # owner record of a run with spec.checkpoint.runId so that another cluster's run can say whom it waits for.
    CLUSTER = "DURABLERUN_CLUSTER"
    # The webhook ingress's public base URL (the chart's webhooks.url), set when the ingress is on:
    # ctx.webhook_url builds capability URLs under it, signed with the run's own key, which the runner gets
    # from the ingress by presenting the ServiceAccount token mounted at WEBHOOK_TOKEN_PATH.
    WEBHOOK_URL = "DURABLERUN_WEBHOOK_URL"
    # Seconds the steps in flight get to finish when the runner is stopped (SIGTERM, a suspension):
    # policy.stopGracePeriod, or the pod's grace less resource.STOP_MARGIN.
    STOP_GRACE_SECONDS = "DURABLERUN_STOP_GRACE_SECONDS"

    # "0": the runner does not keep its stdout and stderr in the store (logs/ in the run's root; on by default).
    SHIP_LOGS = "DURABLERUN_SHIP_LOGS"
    # Logging level of the runner (and of the operator: OperatorEnv.LOG_LEVEL), e.g. DEBUG.
    LOG_LEVEL = "DURABLERUN_LOG_LEVEL"
    # Durable sleeps up to this many seconds are slept in the pod instead of ending the attempt.
    INLINE_SLEEP_MAX_SECONDS = "DURABLERUN_INLINE_SLEEP_MAX_SECONDS"
    # Prices of LLM models, a JSON object or the path of a JSON file (docs/agents.md).
    LLM_PRICES = "DURABLERUN_LLM_PRICES"
    # Quotas of LLM models shared by this process's calls, a JSON object or the path of a JSON file
    # (docs/agents.md, "Model quotas").
    LLM_QUOTAS = "DURABLERUN_LLM_QUOTAS"
    # The Redis (redis://, rediss://, unix://) whose quota windows every runner shares, its password (from a
    # Secret; never in the URL a log could show), and what a call does while it cannot be reached: "wait"
    # (the default) or "proceed".
    LLM_QUOTA_REDIS = "DURABLERUN_LLM_QUOTA_REDIS"
    LLM_QUOTA_REDIS_PASSWORD = "DURABLERUN_LLM_QUOTA_REDIS_PASSWORD"
    LLM_QUOTA_UNAVAILABLE = "DURABLERUN_LLM_QUOTA_UNAVAILABLE"
    # The run's priority in the quotas' lines, 0 to QUOTA_PRIORITY_MAX (spec.policy.quotaPriority).
    LLM_QUOTA_PRIORITY = "DURABLERUN_LLM_QUOTA_PRIORITY"
    # The CLI's default --store.
    STORE = "DURABLERUN_STORE"
    # OpenTelemetry's standard variables (OTEL_EXPORTER_OTLP_ENDPOINT, OTEL_TRACES_SAMPLER...): the operator
    # hands its own on to runners (the chart's tracing values), except these, which are not the runners' to
    # share: its service name, and headers (they carry a backend's credentials: a Secret in spec.template).
    OTEL_PREFIX = "OTEL_"
    OTEL_NOT_SHARED = ("OTEL_SERVICE_NAME", "OTEL_EXPORTER_OTLP_HEADERS", "OTEL_EXPORTER_OTLP_TRACES_HEADERS")


# The webhook ingress (docs/web.md, docs/security.md). In each namespace it serves, the chart's Secret of
# signing keys for capability URLs (the ingress's alone: a runner gets a key derived for its run), and the
# user's Secret of per-source shared secrets (entries named <scheme>.<source>: github.ci, stripe.billing).
WEBHOOK_KEYS_SECRET = "durablerun-webhook-keys"
WEBHOOK_SOURCES_SECRET = "durablerun-webhook-sources"
#: The highest spec.policy.quotaPriority: calls of a run with a higher one go first in a ModelQuota's line.
QUOTA_PRIORITY_MAX = 1000
# The Secret in a run's namespace whose entry QUOTA_REDIS_SECRET_KEY runner pods get as Env.LLM_QUOTA_REDIS_PASSWORD
# (optional: a Redis with no password needs none). The chart writes it into the namespaces it serves.
QUOTA_REDIS_SECRET = "durablerun-quota-redis"
QUOTA_REDIS_SECRET_KEY = "password"
# Where runner pods of older operators had the namespace's keys mounted (an SDK still signs with them there).
WEBHOOK_KEYS_PATH = "/var/run/secrets/durablerun.dev/webhook-keys"
# A runner pod's ServiceAccount token for the ingress only (its audience), bound to the pod: the runner
# presents it to get its run's key.
WEBHOOK_TOKEN_AUDIENCE = "durablerun.dev/webhooks"
WEBHOOK_TOKEN_PATH = "/var/run/secrets/durablerun.dev/webhook-token/token"


class OperatorEnv:
    """Environment variables the operator reads (the chart sets them from its values)."""

    RUNNER_IMAGE = "DURABLERUN_RUNNER_IMAGE"
    METRICS_PORT = "DURABLERUN_METRICS_PORT"
    HEALTH_PORT = "DURABLERUN_HEALTH_PORT"
    RESYNC_SECONDS = "DURABLERUN_RESYNC_SECONDS"
    STUCK_TERMINATING_SECONDS = "DURABLERUN_STUCK_TERMINATING_SECONDS"
    # How long an attempt's pod may fail to pull its image before the run Fails (docs/operator.md).
    START_TIMEOUT_SECONDS = "DURABLERUN_START_TIMEOUT_SECONDS"
    LOG_LEVEL = Env.LOG_LEVEL
    # This cluster's name: one variable, the one the operator hands on to its runners (Env.CLUSTER).
    CLUSTER = Env.CLUSTER
    # CLUSTER's earlier name (the chart set it until CLUSTER replaced it): still read when CLUSTER is unset,
    # for operators whose environment users wrote by hand. Only the operator reads it.
    CLUSTER_OLD_NAME = "DURABLERUN_CLUSTER_NAME"

    # Its Kubernetes API client's sustained requests per second and burst (a token bucket, as client-go's).
    KUBE_QPS = "DURABLERUN_KUBE_QPS"
    KUBE_BURST = "DURABLERUN_KUBE_BURST"
    # Mass lease expiry: the share of active leases late at once, and the least number of them, that hold
    # lease-only restarts (docs/operator.md).
    MASS_EXPIRY_FRACTION = "DURABLERUN_MASS_EXPIRY_FRACTION"
    MASS_EXPIRY_MIN_RUNS = "DURABLERUN_MASS_EXPIRY_MIN_RUNS"
    # "true": runs labelled with a Kueue queue are admitted through Kueue (the chart's kueue.enabled).
    KUEUE = "DURABLERUN_KUEUE"
    # RUNNER_ACCESS_NAMESPACE (the default) or RUNNER_ACCESS_RUN: where runner pods get their rights.
    RUNNER_ACCESS = "DURABLERUN_RUNNER_ACCESS"
    # ModelQuotas on (the chart's quotas.enabled): watch them and hand runner pods the ones covering their namespace.
    MODEL_QUOTAS = "DURABLERUN_MODEL_QUOTAS"
    # More than one replica (docs/operator.md, "More than one operator"): the number of shards the runs are
    # split into (0: one replica, no shard Leases), the shard Leases' duration, and the replica's pod name
    # and namespace (the chart sets them from the downward API; the Leases live in that namespace).
    SHARDS = "DURABLERUN_SHARDS"
    SHARD_LEASE_SECONDS = "DURABLERUN_SHARD_LEASE_SECONDS"
    POD_NAME = Env.POD_NAME
    NAMESPACE = Env.NAMESPACE


# --- times and input hashes ---------------------------------------------------


def active_time(before: timedelta, attempt_start: datetime | None, at: datetime) -> timedelta:
    """What policy.maxDuration is held against, on Kubernetes and locally alike: the time the run had an attempt
    running, summed over its attempts (``before``: the earlier ones'; ``attempt_start``: the current one's, if
    one runs). The waits for events, durable sleeps, suspension and backoff between attempts never count."""
    return before + (max(at - attempt_start, timedelta(0)) if attempt_start else timedelta(0))


def now() -> datetime:
    """The current time, timezone-aware, in UTC: the one clock every part of durable-run reads."""
    return datetime.now(UTC)


def format_time(moment: datetime | float, *, precise: bool = False) -> str:
    """RFC 3339 in UTC with a Z: to the second, as Kubernetes writes times; ``precise``: to the microsecond.

    ``moment`` is an aware datetime or a Unix timestamp.
    """
    if isinstance(moment, float | int):
        moment = datetime.fromtimestamp(moment, UTC)
    moment = moment.astimezone(UTC)
    if precise:
        return moment.isoformat(timespec="microseconds").replace("+00:00", "Z")
    return moment.strftime("%Y-%m-%dT%H:%M:%SZ")


@overload
def parse_time(text: str) -> datetime: ...
@overload
def parse_time(text: None) -> None: ...
@overload
def parse_time(text: str | None) -> datetime | None: ...
def parse_time(text: str | None) -> datetime | None:
    """An RFC 3339 time (either precision) as an aware datetime; None for None or ''. ValueError if unreadable."""
    if not text:
        return None
    parsed = datetime.fromisoformat(text.replace("Z", "+00:00"))
    return parsed if parsed.tzinfo else parsed.replace(tzinfo=UTC)


def input_hash(value: Any) -> str:
    """sha256 of the canonical JSON (sorted keys, compact, no NaN) of a run's input: status.inputHash."""
    canonical = json.dumps(value, separators=(",", ":"), sort_keys=True, ensure_ascii=False, allow_nan=False)
    return hashlib.sha256(canonical.encode()).hexdigest()


# --- traces ------------------------------------------------------------------

#: The namespace part of a local run's key (``durablerun run --run-id``, and ``spec.checkpoint.runId``).
LOCAL_NAMESPACE = "_local"


def run_key(namespace: str, name: str, uid: str | None, run_id: str | None = None) -> str:
    """A run's stable identity: ``<namespace>/<name>/<uid>``, or ``_local/<run id>`` for a run that continues the
    journal of ``spec.checkpoint.runId`` (or a local run): the runner's ``RunRef.key``."""
    if run_id:
        return f"{LOCAL_NAMESPACE}/{run_id}"
    return f"{namespace}/{name}/{uid}" if uid else f"{namespace}/{name}"


def trace_id_of(key: str) -> int:
    """The OpenTelemetry trace id of run ``key`` (:func:`run_key`): every attempt of the run, in any pod or
    cluster, and the operator's decisions about it add to this one trace."""
    return int.from_bytes(hashlib.sha256(b"durablerun/trace/" + key.encode()).digest()[:16], "big") or 1


def trace_id(key: str) -> str:
    """:func:`trace_id_of` as tracing backends show it (32 hex digits): status.traceID."""
    return f"{trace_id_of(key):032x}"


#: OpenTelemetry's variables naming where traces go, the traces-only one first (it wins).
OTLP_TRACES_ENDPOINT_VARS = ("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "OTEL_EXPORTER_OTLP_ENDPOINT")
#: The samplers OTEL_TRACES_SAMPLER may name (OpenTelemetry's; a run's trace is sampled on its id).
OTEL_SAMPLERS = ("always_on", "always_off", "parentbased_always_on", "parentbased_always_off", "traceidratio",
                 "parentbased_traceidratio")


def otlp_traces_endpoint(env: Mapping[str, str]) -> str | None:
    """The OTLP/HTTP URL that OpenTelemetry's standard variables in ``env`` send traces to; None when none is
    set or traces are off (``OTEL_SDK_DISABLED=true``, ``OTEL_TRACES_EXPORTER=none``).

    The one reading of these settings for the runner and the operator: ValueError, naming the variable and
    the fix, on an endpoint that is not an http(s) URL (one with credentials is not repeated), an exporter
    other than otlp, a protocol other than http/protobuf, or a sampler or ratio OpenTelemetry does not know.
    """
    if env.get("OTEL_SDK_DISABLED", "").strip().lower() == "true":
        return None
    exporter = env.get("OTEL_TRACES_EXPORTER", "otlp").strip().lower()
    if exporter == "none":
        return None
    var = next((v for v in OTLP_TRACES_ENDPOINT_VARS if env.get(v, "").strip()), None)
    if var is None:
        return None
    value = env[var].strip()
    if exporter != "otlp":
        raise ValueError(f"OTEL_TRACES_EXPORTER={exporter!r}: traces are exported with otlp only (unset it, or set "
                         "it to otlp)")
    try:
        parts = urlsplit(value)
        parts.port  # noqa: B018 - raises ValueError on a port that is not a number
    except ValueError:
        parts = None
    if parts is None or parts.scheme not in ("http", "https") or not parts.hostname:
        shown = "<a URL with credentials>" if "@" in value else value
        raise ValueError(f"{var}={shown!r} is not an http(s) URL: set it to the collector's OTLP/HTTP address, "
                         "e.g. http://otel-collector:4318")
    for pvar in ("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL", "OTEL_EXPORTER_OTLP_PROTOCOL"):
        protocol = env.get(pvar, "").strip()
        if protocol:
            if protocol != "http/protobuf":
                raise ValueError(f"{pvar}={protocol!r}: traces are sent as OTLP over HTTP only: set it to "
                                 "http/protobuf and the endpoint to the collector's HTTP port (4318)")
            break
    sampler = env.get("OTEL_TRACES_SAMPLER", "parentbased_always_on").strip().lower()
    if sampler not in OTEL_SAMPLERS:
        raise ValueError(f"OTEL_TRACES_SAMPLER={sampler!r} is not a sampler OpenTelemetry knows: use one of "
                         f"{', '.join(OTEL_SAMPLERS)}")
    if "traceidratio" in sampler:
        arg = env.get("OTEL_TRACES_SAMPLER_ARG", "1.0")
        try:
            ratio = float(arg)
        except ValueError:
            ratio = -1.0
        if not 0.0 <= ratio <= 1.0:
            raise ValueError(f"OTEL_TRACES_SAMPLER_ARG={arg!r} is not a ratio between 0 and 1")
    return value


# --- durations ---------------------------------------------------------------

_DURATION_RE = re.compile(r"^(?:(\d+(?:\.\d+)?)(ms|s|m|h|d))+$")
_DURATION_PART_RE = re.compile(r"(\d+(?:\.\d+)?)(ms|s|m|h|d)")
_UNIT_SECONDS = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0}
DURATION_PATTERN = r"^([0-9]+(\.[0-9]+)?(ms|s|m|h|d))+$"


@functools.lru_cache(maxsize=256)
def parse_duration(text: str) -> timedelta:
    """Parse a Go-style duration such as ``90s``, ``10m`` or ``1h30m``.

    Cached: a spec's few durations are parsed once however often they are read (Policy's properties).
    """
    if not _DURATION_RE.match(text):
        raise ValueError(
            f"invalid duration {text!r}: use a number with a unit, e.g. 90s, 10m, 8h or 1h30m"
        )
    seconds = sum(
        float(value) * _UNIT_SECONDS[unit] for value, unit in _DURATION_PART_RE.findall(text)
    )
    return timedelta(seconds=seconds)


def format_duration(delta: timedelta) -> str:
    total = delta.total_seconds()
    if total and total == int(total):
        for unit in ("d", "h", "m"):
            size = int(_UNIT_SECONDS[unit])
            if int(total) % size == 0:
                return f"{int(total) // size}{unit}"
        return f"{int(total)}s"
    return f"{total:g}s"


def _duration_field(default: str, description: str, *, positive: bool = False) -> Any:
    extra: dict[str, Any] = {
        "x-kubernetes-validations": [{"rule": "self.matches('[1-9]')", "message": "must be longer than zero"}]}
    return Field(default=default, description=description, pattern=DURATION_PATTERN,
                 json_schema_extra=extra if positive else None)


USD_PATTERN = r"^[0-9]+(\.[0-9]+)?$"
#: A workflow function, as module:function (spec.workflow, a child request's workflow).
#: The keys of a run's store credentials Secret (spec.checkpoint.credentialsSecret): the two it must have, and
#: the optional ones (temporary credentials; the endpoint of an S3-compatible server when the spec names none).
#: The operator hands them to the runner, the plugin reads them with --credentials-from-secret: one list.
STORE_SECRET_KEYS = ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY")
STORE_SECRET_OPTIONAL_KEYS = ("AWS_SESSION_TOKEN", "AWS_ENDPOINT_URL_S3")

#: An event's name (``spec.events.<name>``, ``ctx.wait_for_event``, a webhook's event): a file name in the
#: store and a key of the run's spec, so one definition for the SDK, the CLI and the webhook ingress.
EVENT_NAME_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9._-]{0,252}$"


def check_event_name(name: str) -> str:
    """``name`` if it is a valid event name, else a ConfigError that says what one looks like."""
    if not re.match(EVENT_NAME_PATTERN, name):
        raise errors.ConfigError(
            f"invalid event name {name!r}: use 1-253 letters, digits, '.', '_' or '-', "
            "starting with a letter or digit"
        )
    return name


WORKFLOW_PATTERN = r"^[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*:[A-Za-z_][A-Za-z0-9_]*$"


class _Model(BaseModel):
    """The base of the resource's models (durablerun.resource, durablerun.relations)."""

    model_config = ConfigDict(populate_by_name=True, extra="ignore")


def image_digest(image_id: str) -> str | None:
    """A container status's imageID as an image reference a pod can name: ``name@sha256:...`` (a registry's
    digest), or ``sha256:...`` (the node's own image id, for an image imported without one); None if empty
    (a node that runs no images, like the test bed's process node) or not a digest."""
    _, sep, rest = image_id.partition("://")  # docker-pullable://name@sha256:..., an older runtime's form
    reference = rest if sep else image_id
    if "@sha256:" in reference or reference.startswith("sha256:"):
        return reference
    return None


#: Where runner pods get their rights (OperatorEnv.RUNNER_ACCESS, docs/security.md "What a runner may do"):
#: one ServiceAccount, Role and RoleBinding per namespace (the default: a start creates nothing but its pod),
#: or per run (a run's runner cannot even read the other runs of its namespace; three more objects a run).
RUNNER_ACCESS_NAMESPACE = "namespace"
RUNNER_ACCESS_RUN = "run"
#: The namespace's runner ServiceAccount and Role (a per-run name always has a suffix, so none is ever this).
RUNNER_ACCOUNT = "durablerun"
RUNNER_ROLE = "durablerun:runner"


def runner_binding(account: str) -> str:
    """The RoleBinding that gives a ServiceAccount the namespace's runner Role (no run name has a colon)."""
    return f"{RUNNER_ROLE}:{account}"


def runner_account(run_name: str) -> str:
    """The ServiceAccount (and Role) the operator makes for one run in RUNNER_ACCESS_RUN mode (and made for
    every run before RUNNER_ACCESS_NAMESPACE: a run started then keeps it until it is deleted)."""
    return f"durablerun-{run_name}"
