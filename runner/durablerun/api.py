"""The DurableRun contract shared by the SDK, the runner pod and the operator.

One source for: the custom resource's spec and status (the CRD's OpenAPI
schema is generated from these models: see ``durablerun_operator.crd``), the
outcomes a runner attempt ends with and their exit codes, the restart reasons,
the labels, annotations and environment the operator hands to a runner pod, the
operator's own environment, the clock (``now()``), and the encodings both sides
must agree on (durations, times, the input hash). docs/design.md describes the
contract as a whole. The operator imports this module; this module imports
nothing of the operator. Every one of these names is written only here: the
runner, the operator, hack/, bench/ and tests/ import it
(tests/test_contract_literals.py fails on a copy).
"""

from __future__ import annotations

import enum
import functools
import hashlib
import json
import re
from datetime import UTC, datetime, timedelta
from typing import Any, Literal, overload

from pydantic import BaseModel, ConfigDict, Field

GROUP = "durablerun.dev"
VERSION = "v1alpha1"
API_VERSION = f"{GROUP}/{VERSION}"
KIND = "DurableRun"
PLURAL = "durableruns"
SINGULAR = "durablerun"
SHORT_NAME = "dr"
#: The CustomResourceDefinition's name.
CRD_NAME = f"{PLURAL}.{GROUP}"

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
# The label a child run carries: its parent DurableRun's name (kubectl durablerun tree).
LABEL_PARENT = f"{GROUP}/parent"
# Set by the operator on a child it suspended or aborted because its parent was suspended or ended; the
# operator lifts what it set (and only that) when the parent resumes or is retried.
ANNOTATION_SUSPENDED_BY_PARENT = f"{GROUP}/suspended-by-parent"
ANNOTATION_ABORTED_BY_PARENT = f"{GROUP}/aborted-by-parent"
# The operator's own marks on pods it made: one it deleted itself (any other deletion is a disruption), and
# the pod that deletes a run's journal (retention Delete).
ANNOTATION_DELETED_BY_OPERATOR = f"{GROUP}/deleted-by-operator"
LABEL_PURGE = f"{GROUP}/purge"


class Phase(enum.StrEnum):
    """Where a run is, for humans and for ``kubectl get``."""

    PENDING = "Pending"
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


_EXIT_CODES = {
    Outcome.COMPLETED: 0,
    Outcome.FAILED: 1,
    Outcome.USAGE_ERROR: 2,
    Outcome.ABORTED: 3,
    Outcome.SUSPENDED: 4,
    Outcome.WAITING: 4,
    Outcome.FENCED: 5,
}


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
    # ctx.webhook_url builds capability URLs under it, signed with the key mounted at WEBHOOK_KEYS_PATH.
    WEBHOOK_URL = "DURABLERUN_WEBHOOK_URL"

    # Logging level of the runner (and of the operator: OperatorEnv.LOG_LEVEL), e.g. DEBUG.
    LOG_LEVEL = "DURABLERUN_LOG_LEVEL"
    # Durable sleeps up to this many seconds are slept in the pod instead of ending the attempt.
    INLINE_SLEEP_MAX_SECONDS = "DURABLERUN_INLINE_SLEEP_MAX_SECONDS"
    # Prices of LLM models, a JSON object or the path of a JSON file (docs/agents.md).
    LLM_PRICES = "DURABLERUN_LLM_PRICES"
    # The CLI's default --store.
    STORE = "DURABLERUN_STORE"


# The webhook ingress (docs/web.md). In each namespace it serves, the chart's Secret of signing keys
# for capability URLs (mounted read-only into runner pods at WEBHOOK_KEYS_PATH), and the user's Secret
# of per-source shared secrets (entries named <scheme>.<source>: github.ci, stripe.billing, hmac.ocr).
WEBHOOK_KEYS_SECRET = "durablerun-webhook-keys"
WEBHOOK_SOURCES_SECRET = "durablerun-webhook-sources"
WEBHOOK_KEYS_PATH = "/var/run/secrets/durablerun.dev/webhook-keys"


class OperatorEnv:
    """Environment variables the operator reads (the chart sets them from its values)."""

    RUNNER_IMAGE = "DURABLERUN_RUNNER_IMAGE"
    METRICS_PORT = "DURABLERUN_METRICS_PORT"
    HEALTH_PORT = "DURABLERUN_HEALTH_PORT"
    RESYNC_SECONDS = "DURABLERUN_RESYNC_SECONDS"
    STUCK_TERMINATING_SECONDS = "DURABLERUN_STUCK_TERMINATING_SECONDS"
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


# --- times and input hashes ---------------------------------------------------


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

# --- spec ---------------------------------------------------------------------


class _Model(BaseModel):
    model_config = ConfigDict(populate_by_name=True, extra="ignore")


class Backoff(_Model):
    """Delay before restarting a crashed attempt; doubles each restart."""

    initial: str = _duration_field("10s", "Delay before the first restart after a crash.")
    max: str = _duration_field("5m", "Upper bound of the doubling restart delay.")

    @property
    def initial_delay(self) -> timedelta:
        return parse_duration(self.initial)

    @property
    def max_delay(self) -> timedelta:
        return parse_duration(self.max)

    def delay(self, restarts: int) -> timedelta:
        """The delay before restart number ``restarts`` (1 = first restart)."""
        doubled = self.initial_delay * float(2 ** max(restarts - 1, 0))
        return min(doubled, self.max_delay)


class Policy(_Model):
    """Limits the run is held to. Counters survive restarts: they are journaled."""

    maxDuration: str = _duration_field(
        "8h",
        "Time the run may have a pod, summed over its attempts, before it is Aborted "
        "(MaxDurationExceeded). Waits for events, durable sleeps, suspension and backoff do not "
        "count: a run may wait for a human for days (a wait's own timeout bounds it).",
        positive=True,
    )
    costCeilingUSD: str | None = Field(
        default=None,
        description=(
            "Abort (BudgetExhausted) once the run's cost reaches this many US dollars. A decimal "
            'string such as "5.00". Raise it with kubectl patch to resume an aborted run.'
        ),
        pattern=USD_PATTERN,
    )
    maxTokens: int | None = Field(
        default=None, ge=0, description="Abort (BudgetExhausted) once the run has used this many tokens."
    )
    maxSteps: int | None = Field(
        default=None, ge=1, description="Abort (BudgetExhausted) before executing more than this many steps."
    )
    maxRetries: int = Field(
        default=3, ge=0, le=100,
        description="Default retries of a failing step (per step; a step may override it).",
    )
    maxRestarts: int = Field(
        default=3, ge=0, le=1000,
        description=(
            "Restarts allowed after crashes, OOM kills and expired leases before the run is "
            "Aborted (RetryLimitExceeded)."
        ),
    )
    maxDisruptions: int = Field(
        default=20, ge=0, le=10000,
        description=(
            "Restarts allowed after evictions, preemptions, lost nodes and pods deleted by "
            "someone else. Infrastructure failures do not consume maxRestarts."
        ),
    )
    backoff: Backoff = Field(default_factory=Backoff, description=Backoff.__doc__)
    progressTimeout: str = _duration_field(
        "10m", "Abort (ProgressTimeout) when no step completes for this long while running.", positive=True
    )
    leaseDuration: str = _duration_field(
        "3m",
        "How long a runner's lease is valid without renewal: the time to replace a hung or cut-off runner (a "
        "crashed one is seen at once from its pod). The runner renews every third of it, carrying its progress: "
        "the default costs one status write a minute per running run.",
        positive=True,
    )
    abortGracePeriod: str = _duration_field(
        "30s",
        "How long a running attempt gets to end by itself when the run is aborted from outside (the "
        "durablerun.dev/abort annotation, maxDuration, the child runs' cost): it stops at its next operation, "
        "its Sagas undo their work, and it ends Aborted. After this the operator fences the attempt and "
        "deletes its pod. 0s: at once, without undoing anything.",
    )

    # The durations as timedeltas: read these, never parse the strings again.
    @property
    def max_duration(self) -> timedelta:
        return parse_duration(self.maxDuration)

    @property
    def progress_timeout(self) -> timedelta:
        return parse_duration(self.progressTimeout)

    @property
    def lease_duration(self) -> timedelta:
        return parse_duration(self.leaseDuration)

    @property
    def abort_grace_period(self) -> timedelta:
        return parse_duration(self.abortGracePeriod)


#: A run id: names a journal in a store (``durablerun run --run-id`` and ``spec.checkpoint.runId``).
RUN_ID_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$"
RUN_ID_IMMUTABLE = (
    "spec.checkpoint.runId is immutable: it names the journal the run continues; set it when the "
    "DurableRun is created (create a new DurableRun to continue another journal)"
)


class Checkpoint(_Model):
    """Where the run's journal, snapshots and events are stored."""

    model_config = ConfigDict(populate_by_name=True, extra="ignore", json_schema_extra={
        "x-kubernetes-validations": [{
            "rule": "!has(self.kmsKeyId) || (has(self.serverSideEncryption) && self.serverSideEncryption == 'aws:kms')",
            "message": "kmsKeyId needs serverSideEncryption: aws:kms",
        }, {
            # A transition rule: neither added, removed nor changed after creation.
            "rule": "has(self.runId) == has(oldSelf.runId) && (!has(self.runId) || self.runId == oldSelf.runId)",
            "message": RUN_ID_IMMUTABLE,
        }],
    })

    uri: str = Field(
        description=(
            "s3://bucket/prefix for S3 or an S3-compatible server, or file:///path on a volume "
            "that every attempt mounts."
        ),
        json_schema_extra={
            "x-kubernetes-validations": [
                {
                    "rule": "self.matches('^s3://[a-z0-9][a-z0-9.-]{1,61}[a-z0-9](/.*)?$') || "
                    "self.matches('^file:///.+$')",
                    "message": "must be s3://<bucket>[/prefix] or file:///<absolute path>",
                }
            ]
        },
    )
    endpoint: str | None = Field(
        default=None,
        description="Endpoint URL of an S3-compatible server, e.g. http://minio.storage:9000.",
        pattern=r"^https?://.+$",
    )
    region: str | None = Field(default=None, description="S3 region, e.g. us-east-1.")
    credentialsSecret: str | None = Field(
        default=None,
        description=(
            "Secret in the run's namespace with keys AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY "
            "(optional: AWS_SESSION_TOKEN, and AWS_ENDPOINT_URL_S3 when endpoint is not set). "
            "Omit it to use workload identity."
        ),
    )
    runId: str | None = Field(
        default=None,
        description=(
            "A run id naming the journal this run continues, in the store at uri: "
            "<prefix>/_local/<runId>/, the same journal `durablerun run --run-id` opens. Set it to move "
            "a run between clusters, or to resume a deleted run whose journal was retained: the same "
            "manifest applied anywhere continues where the journal ends. Only one runner writes a run "
            "id's journal at a time (an owner record in the store, renewed every leaseDuration/3); "
            "another one waits until that record is released or expires. Omitted (the default), the "
            "journal is the DurableRun's own (<prefix>/<namespace>/<name>/<uid>/): a re-created run "
            "never adopts an old journal. 1-128 letters, digits, '.', '_' or '-', starting with a letter "
            "or digit; immutable."
        ),
        pattern=RUN_ID_PATTERN, max_length=128,
    )
    snapshotEvery: int = Field(
        default=100, ge=1, le=100000,
        description="Write a snapshot of the replay state every this many steps (resume reads O(1) objects).",
    )
    retention: Literal["Retain", "Delete"] = Field(
        default="Retain",
        description="What happens to the journal when the DurableRun is deleted: Retain or Delete.",
    )
    serverSideEncryption: Literal["AES256", "aws:kms"] | None = Field(
        default=None,
        description=(
            "S3 server-side encryption of every object the runner writes: AES256 (SSE-S3) or aws:kms "
            "(SSE-KMS, with kmsKeyId or the account's default key). The server must support it: MinIO "
            "needs a KMS. Omit it for the bucket's default encryption."
        ),
    )
    kmsKeyId: str | None = Field(
        default=None,
        description="KMS key id or ARN for serverSideEncryption aws:kms (and only with it).",
    )


# Immutable parts of the spec, refused at the API server. The CRD's own rules (x-kubernetes-validations)
# see a schemaless object (input, events: any JSON) only as a whole, and their equality misses a key
# renamed in an object of the same size; so a ValidatingAdmissionPolicy, which sees plain JSON, holds
# both exactly (durablerun_operator.crd.admission_policy). The CRD rule on spec.input stays for
# clusters where only the CRD is installed.
INPUT_IMMUTABLE = (
    "spec.input is immutable: a run's input is fixed when it is created; create a new DurableRun "
    "(a new name) for a new input"
)
INPUT_RULE = "!has(oldObject.spec.input) || (has(object.spec.input) && object.spec.input == oldObject.spec.input)"
EVENTS_IMMUTABLE = (
    "spec.events: an event already set cannot be changed or removed (the workflow may have read it); "
    "send new events under new names"
)
EVENTS_RULE = (
    "!has(oldObject.spec.events) || oldObject.spec.events.all(name, has(object.spec.events) && "
    "name in object.spec.events && object.spec.events[name] == oldObject.spec.events[name])"
)

WORKFLOW_PATTERN = r"^[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*:[A-Za-z_][A-Za-z0-9_]*$"


class DurableRunSpec(_Model):
    """The desired state of a durable run."""

    workflow: str = Field(
        description="The workflow function the runner executes, as module:function (e.g. agents.research:run).",
        pattern=WORKFLOW_PATTERN,
    )
    input: dict[str, Any] = Field(
        default_factory=dict,
        description=(
            "JSON object passed to the workflow. Immutable: the API server refuses a change; "
            "create a new DurableRun for a new input."
        ),
        json_schema_extra={
            "x-kubernetes-preserve-unknown-fields": True,
            # Defaulted, so the transition rule also sees an input that is added or removed.
            "default": {},
            "x-kubernetes-validations": [{"rule": "self == oldSelf", "message": INPUT_IMMUTABLE}],
        },
    )
    template: dict[str, Any] = Field(
        default_factory=dict,
        description=(
            "Pod template for the runner (image, resources, env, serviceAccountName, "
            "nodeSelector, tolerations, ...): a PodTemplateSpec, whose metadata holds labels and "
            "annotations only; containers may be omitted (the operator then adds one named runner). "
            "The operator adds its own env, labels, owner reference and restartPolicy Never."
        ),
        # The CRD gives it the PodTemplateSpec schema of the Kubernetes OpenAPI (durablerun_operator.crd).
        json_schema_extra={"x-kubernetes-preserve-unknown-fields": True},
    )
    checkpoint: Checkpoint = Field(description=Checkpoint.__doc__)
    policy: Policy = Field(default_factory=Policy, description=Policy.__doc__)
    suspend: bool = Field(
        default=False,
        description="true: the runner stops cleanly at the next step boundary and no pod runs until false.",
    )
    events: dict[str, Any] = Field(
        default_factory=dict,
        description=(
            "Events for ctx.wait_for_event, by name, each any JSON value. Add new names at any "
            "time; the API server refuses a change to or the removal of a name already set."
        ),
        json_schema_extra={"x-kubernetes-preserve-unknown-fields": True},
    )
    ttlSecondsAfterFinished: int | None = Field(
        default=None, ge=0,
        description="Delete the DurableRun this many seconds after it finishes (as Jobs do).",
    )


# --- status -------------------------------------------------------------------


class Lease(_Model):
    holder: str | None = Field(default=None, description="Pod holding the lease.")
    epoch: int | None = Field(default=None, description="Epoch the holder was started with.")
    acquireTime: str | None = Field(default=None, description="When the holder acquired the lease.")
    renewTime: str | None = Field(default=None, description="When the holder last renewed the lease.")
    durationSeconds: int | None = Field(default=None, description="Lease validity without renewal.")


class Progress(_Model):
    step: int | None = Field(default=None, description="Journal position of the current step.")
    stepName: str | None = Field(default=None, description="Name of the current step.")
    completedSteps: int = Field(default=0, description="Steps journaled so far.")
    totalSteps: int | None = Field(default=None, description="Total steps, when the workflow declares it.")
    fraction: str | None = Field(default=None, description="completedSteps / totalSteps, as a decimal string.")
    summary: str | None = Field(
        default=None, description='Progress for humans: "5/12" when totalSteps is known, else "5 steps".'
    )
    lastProgressTime: str | None = Field(default=None, description="When a step last completed.")


class Cost(_Model):
    usd: str = Field(default="0", description="Cost so far in US dollars, a decimal string.")
    tokens: int = Field(default=0, description="Tokens used so far.")


class CheckpointStatus(_Model):
    position: int | None = Field(default=None, description="Latest journal position written.")
    key: str | None = Field(default=None, description="Object key of the latest journal entry or snapshot.")
    time: str | None = Field(default=None, description="When it was written.")


class WaitingFor(_Model):
    event: str | None = Field(default=None, description="Event name the run waits for.")
    wakeTime: str | None = Field(default=None, description="When a durable sleep ends.")
    since: str | None = Field(default=None, description="When the wait began.")
    deadline: str | None = Field(default=None, description="When the wait times out.")
    holder: str | None = Field(
        default=None,
        description="Who holds the run's journal (spec.checkpoint.runId) in the store: the run waits until that "
                    "holder releases it or its store lease expires, then takes it over.",
    )
    compensations: int | None = Field(
        default=None, ge=1,
        description="Saga compensations registered and not run when the wait began: an abort while the run waits "
                    "starts an attempt to run them (policy.abortGracePeriod).",
    )


class Aborting(_Model):
    """An abort from outside that the running attempt is given policy.abortGracePeriod to carry out itself."""

    reason: AbortReason = Field(description="The abort's reason; the run ends Aborted with it.")
    message: str = Field(description="Why, for humans.")
    deadline: str = Field(description="When the operator fences the attempt if it has not ended by then.")


#: A Succeeded run's result goes into status.result.inline up to this many bytes of JSON.
RESULT_INLINE_MAX = 4096


class RunResult(_Model):
    """Where a Succeeded run's result lives, and the result itself when it is small."""

    inline: str | None = Field(
        default=None,
        description=f"The workflow's return value as JSON text, when it is at most {RESULT_INLINE_MAX} "
                    "bytes; absent for a bigger result (read it through ref).",
    )
    ref: str = Field(
        description="Where the full result lives in the run's store: the journal record holding it (or, "
                    "for a big result, its own object). durablerun inspect --kubernetes NAMESPACE/NAME "
                    "--result prints it.",
    )
    size: int = Field(description="Bytes of the result's JSON.")
    sha256: str = Field(description="sha256 of the result's JSON.")


class Condition(_Model):
    """A condition in the standard Kubernetes shape (metav1.Condition), one per type."""

    model_config = ConfigDict(populate_by_name=True, extra="ignore", json_schema_extra={
        "required": ["type", "status", "reason", "message", "lastTransitionTime"],
    })

    type: str = Field(description="Progressing, Suspended, Complete or Failed.", max_length=316,
                      pattern=r"^([a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*/)?"
                              r"(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])$")
    status: Literal["True", "False", "Unknown"] = Field(description="True, False or Unknown.")
    reason: str | None = Field(
        default=None, description="Why, in CamelCase: the phase, or the abort reason.", min_length=1,
        max_length=1024, pattern=r"^[A-Za-z]([A-Za-z0-9_,:]*[A-Za-z0-9_])?$",
    )
    message: str | None = Field(default=None, description="Details for humans.", max_length=32768)
    lastTransitionTime: str | None = Field(
        default=None, description="When the status last changed.", json_schema_extra={"format": "date-time"},
    )
    observedGeneration: int | None = Field(
        default=None, ge=0, description="The .metadata.generation the condition was set for.",
    )


class DurableRunStatus(_Model):
    """Observed state of the run, written by the operator and the runner."""

    phase: Phase | None = Field(
        default=None, description="Pending, Running, Waiting, Suspended, Backoff, Succeeded, Failed or Aborted."
    )
    attempt: int = Field(default=0, description="Number of pods started for this run.")
    epoch: int = Field(
        default=0, description="Fencing token: bumped before every new pod; only the pod of this epoch may write."
    )
    pod: str | None = Field(default=None, description="The current attempt's pod.")
    restarts: int = Field(default=0, description="Restarts after crashes, OOM kills and expired leases.")
    disruptions: int = Field(
        default=0, description="Restarts after evictions, preemptions, lost nodes and deleted pods."
    )
    lease: Lease = Field(default_factory=Lease)
    progress: Progress = Field(default_factory=Progress)
    cost: Cost = Field(default_factory=Cost)
    checkpoint: CheckpointStatus = Field(default_factory=CheckpointStatus)
    waitingFor: WaitingFor | None = Field(default=None, description="What a Waiting run waits for.")
    abortReason: AbortReason | None = Field(default=None, description="Why the run was Aborted.")
    aborting: Aborting | None = Field(default=None, description=Aborting.__doc__)
    outcome: Outcome | None = Field(default=None, description="How the last attempt ended.")
    message: str | None = Field(default=None, description="Human-readable detail of the current phase.")
    inputHash: str | None = Field(default=None, description="sha256 of spec.input at the first attempt.")
    startTime: str | None = Field(default=None, description="When the first attempt started.")
    completionTime: str | None = Field(default=None, description="When the run finished.")
    result: RunResult | None = Field(default=None, description=RunResult.__doc__)
    nextAttemptTime: str | None = Field(default=None, description="When a Backoff run starts its next attempt.")
    lastPodEndTime: str | None = Field(default=None, description="When the previous attempt's pod ended.")
    attemptStartTime: str | None = Field(default=None, description="When the current attempt started (Running only).")
    retry: str | None = Field(default=None, description="The durablerun.dev/retry annotation value last acted on.")
    retryTime: str | None = Field(
        default=None, description="When the last retry started: steps that failed before it are executed again."
    )
    activeSeconds: int = Field(
        default=0, description="Seconds the run had a pod in its finished attempts: maxDuration counts these."
    )
    conditions: list[Condition] = Field(
        default_factory=list,
        description=(
            "Progressing, Suspended, Complete and Failed, as a Job's (kubectl wait "
            "--for=condition=Complete)."
        ),
        json_schema_extra={"x-kubernetes-list-type": "map", "x-kubernetes-list-map-keys": ["type"]},
    )
    observedGeneration: int | None = Field(
        default=None, description="The .metadata.generation the operator last acted on."
    )
    childRequests: dict[str, ChildRequest] = Field(
        default_factory=dict,
        description="Child runs the workflow asked for, by child name (written by the runner).")
    children: dict[str, ChildState] = Field(
        default_factory=dict, description="Child runs the operator created, by child name.")
    childrenTotal: ChildrenTotal | None = Field(
        default=None, description="The children's count and cost (kubectl get: Children, Child Cost).")
    signalRequests: dict[str, SignalRequest] = Field(
        default_factory=dict,
        description="Events the workflow sends to other runs, by id (written by the runner).")
    signals: dict[str, SignalState] = Field(
        default_factory=dict, description="What became of each signal request, by id.")


# --- child runs and signals (docs/operator.md#child-runs-and-signals) ----------------------
#
# A runner never creates or patches another run: it asks through its own status (childRequests,
# signalRequests; written with its lease's epoch guard), and the operator acts and reports back:
# a child's outcome arrives as the parent's event CHILD_EVENT_PREFIX + <child>, first value wins.

#: Event names the operator writes into a parent's spec.events: one per child, its outcome.
CHILD_EVENT_PREFIX = "durablerun.child."
#: A run's name is the value of its pods' durablerun.dev/run label: at most 63 characters.
RUN_NAME_MAX = 63
_DNS_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
#: Budgets a child may only narrow: its value may not be above its parent's.
_NARROW_ONLY = ("costCeilingUSD", "maxTokens", "maxSteps", "maxDuration")


def child_event(child: str) -> str:
    """The event in the parent's spec.events that carries child ``child``'s outcome."""
    return CHILD_EVENT_PREFIX + child


def child_run_name(parent: str, child: str) -> str:
    """The child's DurableRun name, ``<parent>-<child>``; ValueError naming the fix if it cannot be one."""
    if not isinstance(child, str) or not _DNS_LABEL.match(child):
        raise ValueError(f"child name {child!r}: use lowercase letters, digits and '-', starting and ending "
                         "with a letter or digit (it becomes part of a DurableRun's name)")
    full = f"{parent}-{child}"
    if len(full) > RUN_NAME_MAX:
        raise ValueError(f"child name {child!r}: the child's DurableRun would be {full!r}, {len(full)} "
                         f"characters; a run's name may have at most {RUN_NAME_MAX} (it labels the run's "
                         f"pods): use a child name of at most {RUN_NAME_MAX - len(parent) - 1} characters")
    return full


def valid_run_name(name: str) -> str:
    """A DurableRun's name in the same namespace (a signal's target); ValueError naming the fix."""
    if not isinstance(name, str) or not _DNS_LABEL.match(name) or len(name) > RUN_NAME_MAX:
        raise ValueError(f"run name {name!r}: a DurableRun's name is 1-{RUN_NAME_MAX} lowercase letters, "
                         "digits and '-', starting and ending with a letter or digit")
    return name


class ChildRequest(_Model):
    """A child run the workflow asked for (ctx.start_child); written by the runner, acted on by the operator."""

    workflow: str = Field(description="The child's workflow, module:function.", pattern=WORKFLOW_PATTERN)
    input: dict[str, Any] = Field(
        default_factory=dict, description="The child's input.",
        json_schema_extra={"x-kubernetes-preserve-unknown-fields": True})
    policy: dict[str, Any] = Field(
        default_factory=dict,
        description="Policy fields that differ from the parent's (budgets may only be lowered).",
        json_schema_extra={"x-kubernetes-preserve-unknown-fields": True})


def child_spec(parent: DurableRunSpec, request: ChildRequest) -> DurableRunSpec:
    """The child's spec: the parent's template, checkpoint store and policy, narrowed by the request.

    ValueError naming the field when the request would widen a budget of the parent's (a child's
    cost also counts toward its parent's ceiling, so a wider one could never be honoured).
    """
    base = parent.policy.model_dump(mode="json", exclude_none=True)
    unknown = sorted(set(request.policy) - set(Policy.model_fields))
    if unknown:
        raise ValueError(f"policy.{unknown[0]}: not a policy field (fields: {', '.join(Policy.model_fields)})")
    for field_name in _NARROW_ONLY:
        mine, theirs = request.policy.get(field_name), base.get(field_name)
        if mine is None or theirs is None:
            continue
        if field_name == "maxDuration":
            wider = parse_duration(str(mine)) > parse_duration(str(theirs))
        else:
            wider = float(mine) > float(theirs)
        if wider:
            raise ValueError(f"policy.{field_name}: {mine} is above the parent's {theirs}: a child may only "
                             "narrow its parent's budgets")
    policy = Policy.model_validate({**base, **request.policy})
    return DurableRunSpec(
        workflow=request.workflow, input=request.input, template=parent.template,
        checkpoint=parent.checkpoint, policy=policy, suspend=parent.suspend,
    )


class ChildState(_Model):
    run: str = Field(description="The child's DurableRun (same namespace).")
    uid: str = Field(description="The child's uid: a child that disappears is not created again.")
    phase: Phase | None = Field(default=None, description="The child's phase, as last seen.")


class ChildrenTotal(_Model):
    runs: int = Field(default=0, description="Child runs created.")
    finished: int = Field(default=0, description="Child runs that have finished.")
    summary: str = Field(default="", description='For kubectl get: "3/5" (finished of created).')
    usd: str = Field(default="0", description="The children's cost, their own children's included.")
    tokens: int = Field(default=0, description="The children's tokens.")


class SignalRequest(_Model):
    """An event the workflow sends to another run (ctx.signal); written by the runner."""

    run: str = Field(description="The DurableRun (same namespace) to send it to.")
    event: str = Field(description="The event's name in the target's spec.events.")
    value: str = Field(default="null", description="The payload, as JSON text.")


class SignalState(_Model):
    state: Literal["Delivered", "Ignored", "NotFound"] = Field(
        description="Delivered; Ignored (the target already had another value: the first one wins); "
                    "NotFound (no such run).")
    message: str | None = Field(default=None, description="Details for humans.")


#: Status fields only the runner writes (the operator never patches them, so no write of its can drop one).
RUNNER_REQUEST_FIELDS = ("childRequests", "signalRequests")

DurableRunStatus.model_rebuild()
