"""The DurableRun custom resource's spec and status, the other half of the contract.

It is one module of over 400 lines because it is one schema: the CRD is
generated from the spec and status together, and each CEL rule sits beside the
fields it checks.

The CRD's OpenAPI schema is generated from these models (see
``durablerun_operator.crd``): the spec, its policy and checkpoint settings, the
status the operator and the runner write, and the CEL rules and messages the
schema carries. ``durablerun.api`` holds the names and encodings these models
use (group, labels, enums, durations, times), ``durablerun.relations`` the
child-run and signal requests and states the status carries; this module
imports both, never the reverse.
"""

from __future__ import annotations

import math
from datetime import timedelta
from decimal import Decimal
from typing import Any, Literal

from pydantic import ConfigDict, Field

from durablerun.api import (
    DURATION_PATTERN,
    GROUP,
    LABEL_QUEUE_NAME,
    PLURAL,
    QUOTA_PRIORITY_MAX,
    USD_PATTERN,
    WORKFLOW_PATTERN,
    AbortReason,
    Outcome,
    Phase,
    UpgradeState,
    _duration_field,
    _Model,
    parse_duration,
)
from durablerun.relations import ChildrenTotal, ChildRequest, ChildState, SignalRequest, SignalState

# --- spec ---------------------------------------------------------------------


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


class AskAt(_Model):
    """Soft budgets: where the run stops and asks a person before it spends more."""

    costUSD: str | None = Field(
        default=None, pattern=USD_PATTERN,
        description="Stop before the next step once the run's cost reaches this many US dollars (a decimal string "
                    'such as "4.00") and wait, with no pod, until it is raised or removed (kubectl durablerun '
                    "budget) or the run is aborted.")
    tokens: int | None = Field(
        default=None, ge=0,
        description="The same for the tokens the run has used.")


#: The reasons a run waits on its budget (status.waitingFor.budget): the policy.askAt field it reached.
ASK_COST, ASK_TOKENS = "costUSD", "tokens"


#: A runner pod's terminationGracePeriodSeconds when its template sets none (Kubernetes' default).
DEFAULT_POD_GRACE_SECONDS = 30
#: Of a stopped runner's grace, what it keeps for itself after its steps: journal them, end the attempt.
STOP_MARGIN = timedelta(seconds=10)
#: The steps in flight's time to finish when the policy says none and the pod's grace gives no more.
DEFAULT_STOP_GRACE = timedelta(seconds=20)


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
    askAt: AskAt | None = Field(
        default=None,
        description="Soft budgets: where the run stops before its next step and waits, with no pod, for a person "
                    "to raise them (or end the run). costCeilingUSD and maxTokens still abort.")
    quotaPriority: int | None = Field(
        default=None, ge=0, le=QUOTA_PRIORITY_MAX,
        description="Urgent runs first: under contention for a ModelQuota, a call of a run with a higher "
                    "quotaPriority goes before every call of a lower one (weights share the room among the "
                    "namespaces of one priority). Unset: 0.")
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
    stopGracePeriod: str | None = Field(
        default=None,
        pattern=DURATION_PATTERN,
        description=(
            "How long the steps in flight get to finish when the runner is stopped from outside: the run "
            "suspended, preempted by Kueue, its pod evicted, its node drained or the pod deleted. The runner "
            "starts no new step, lets those running finish and journals them, then exits; a step still running "
            "after this is cancelled and runs again in the next attempt. Unset: 20s, or the pod's "
            "terminationGracePeriodSeconds less 10s where that is longer. Set: the pod's "
            "terminationGracePeriodSeconds is raised to this plus 10s where it is lower (the 10s journal the "
            "steps and end the attempt)."
        ),
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

    def asks(self, usd: Decimal, tokens: int) -> str | None:
        """The policy.askAt field (ASK_COST, ASK_TOKENS) that a run at this cost and these tokens has reached, or
        None: it may start its next step without asking."""
        ask = self.askAt
        if ask is None:
            return None
        if ask.costUSD is not None and usd >= Decimal(ask.costUSD):
            return ASK_COST
        if ask.tokens is not None and tokens >= ask.tokens:
            return ASK_TOKENS
        return None

    def pod_grace_seconds(self, template_grace: int | None) -> int:
        """The runner pod's terminationGracePeriodSeconds: the template's (30 s if it sets none), raised to
        stopGracePeriod + STOP_MARGIN if that is longer."""
        own = DEFAULT_POD_GRACE_SECONDS if template_grace is None else template_grace
        if self.stopGracePeriod is None:
            return own
        return max(own, math.ceil((parse_duration(self.stopGracePeriod) + STOP_MARGIN).total_seconds()))

    def stop_grace(self, pod_grace_seconds: int) -> timedelta:
        """The steps in flight's time to finish when the runner is stopped, in a pod of that grace period."""
        if self.stopGracePeriod is not None:
            return parse_duration(self.stopGracePeriod)
        return max(DEFAULT_STOP_GRACE, timedelta(seconds=pod_grace_seconds) - STOP_MARGIN)


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
QUEUE_LABEL_FIXED = (
    f"metadata.labels['{LABEL_QUEUE_NAME}'] cannot be added, changed or removed while the run is Queued or "
    "Running (Kueue holds or is deciding on its quota); change it while the run waits, is suspended or is "
    "finished, or abort the run"
)


def _queue_label(obj: str) -> str:
    return (f"(has({obj}.metadata.labels) && '{LABEL_QUEUE_NAME}' in {obj}.metadata.labels ? "
            f"{obj}.metadata.labels['{LABEL_QUEUE_NAME}'] : '')")


QUEUE_LABEL_RULE = (
    f"!(has(oldObject.status) && has(oldObject.status.phase) && oldObject.status.phase in "
    f"['{Phase.QUEUED.value}', '{Phase.RUNNING.value}']) || "
    f"{_queue_label('oldObject')} == {_queue_label('object')}"
)
EVENTS_RULE = (
    "!has(oldObject.spec.events) || oldObject.spec.events.all(name, has(object.spec.events) && "
    "name in object.spec.events && object.spec.events[name] == oldObject.spec.events[name])"
)

SECRET_NAME_PATTERN = r"^[a-z0-9]([-a-z0-9.]{0,251}[a-z0-9])?$"


class WebhookSource(_Model):
    """How the webhook ingress checks a signed POST to this run (docs/web.md): a source scheme and the Secret
    entry holding its shared secret. It wins over the namespace's durablerun-webhook-sources Secret."""

    scheme: Literal["github", "stripe", "hmac"] = Field(
        description=(
            "github (X-Hub-Signature-256), stripe (Stripe-Signature, timestamped) or hmac (X-Durablerun-Timestamp "
            "and X-Durablerun-Signature): how the sender signs its requests."
        ),
    )
    secret: str = Field(
        description=(
            "Secret in the run's namespace holding the shared secret. The ingress reads only the Secrets its "
            "chart names (webhooks.sourceSecrets, and durablerun-webhook-sources): name one of those."
        ),
        pattern=SECRET_NAME_PATTERN, max_length=253,
    )
    key: str = Field(
        default="secret", description="The entry of that Secret holding the shared secret.",
        pattern=r"^[-._a-zA-Z0-9]+$", max_length=253,
    )


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
    webhook: WebhookSource | None = Field(
        default=None,
        description=(
            "A signed-webhook source of this run's own (scheme and Secret): a POST to the ingress's "
            "/v1/namespaces/<ns>/runs/<name>/events/<event> is checked against it, whatever ?source= says."
        ),
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


class StepInFlight(_Model):
    """The step the runner was executing at its last lease renewal (cleared when it is journaled)."""

    name: str = Field(description="The step's name.")
    position: str = Field(description="Its position in the workflow (as `durablerun inspect` shows).")
    attempt: int = Field(default=1, description="Its attempt: 2 and up are retries.")
    startTime: str = Field(description="When this attempt of the step started.")


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
    inFlight: StepInFlight | None = Field(default=None, description=StepInFlight.__doc__)


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
    budget: str | None = Field(
        default=None,
        description="The policy.askAt limit the run reached (costUSD or tokens): it waits for a person to raise "
                    "or remove it (kubectl durablerun budget), or to abort the run.")
    quota: str | None = Field(
        default=None,
        description="The model quota a call found no room in: the run waits with no pod until wakeTime, when the "
                    "room is due, and runs the step that asked again from its start.")
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

    type: str = Field(description="Progressing, Suspended, Complete, Failed, or UpgradeReplays.", max_length=316,
                      pattern=r"^([a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*/)?"
                              r"(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])$")
    status: Literal["True", "False", "Unknown"] = Field(description="True, False or Unknown.")
    reason: str | None = Field(
        default=None, description="Why, in CamelCase: status.reason when set (a pod that cannot start, why the run "
        "Failed or was Aborted), else the phase.", min_length=1,
        max_length=1024, pattern=r"^[A-Za-z]([A-Za-z0-9_,:]*[A-Za-z0-9_])?$",
    )
    message: str | None = Field(default=None, description="Details for humans.", max_length=32768)
    lastTransitionTime: str | None = Field(
        default=None, description="When the status last changed.", json_schema_extra={"format": "date-time"},
    )
    observedGeneration: int | None = Field(
        default=None, ge=0, description="The .metadata.generation the condition was set for.",
    )


class ImagePin(_Model):
    """The runner image the run is pinned to: every attempt after the first runs this digest, whatever the
    template's tag names later (docs/operator.md#upgrading-code-under-running-runs)."""

    image: str = Field(description="The image by digest (name@sha256:..., or the node's image id sha256:...).",
                       max_length=1024)
    since: str | None = Field(default=None, description="When the run was pinned to it.")
    by: str | None = Field(
        default=None, description="Who moved the run to it (kubectl durablerun upgrade); none: its first attempt.")
    previous: str | None = Field(default=None, description="The image it was pinned to before.", max_length=1024)
    request: str | None = Field(
        default=None, description="The durablerun.dev/upgrade annotation value last acted on.", max_length=4096)


class UpgradeCheck(_Model):
    """The operator's replay check of the image a durablerun.dev/upgrade annotation asks for: a one-off pod of that
    image replays the run's journal, and only a clean replay moves ``pin``
    (docs/operator.md#upgrading-code-under-running-runs)."""

    request: str = Field(description="The durablerun.dev/upgrade annotation value checked.", max_length=4096)
    image: str = Field(description="The image asked for, as asked (a tag or a digest).", max_length=1024)
    by: str = Field(description="Who asked, as the annotation says (the API server's audit log has the writer).",
                    max_length=256)
    dryRun: bool = Field(default=False, description="Check only: the pin stays, whatever the result.")
    state: UpgradeState = Field(description="Checking, Replays or Refused.")
    digest: str | None = Field(default=None, description="The digest the check pod ran (name@sha256:...).",
                               max_length=1024)
    message: str | None = Field(default=None, description="The replayer's verdict, or why there was none: the first "
                                "divergent step, the error, an image that cannot start.", max_length=2048)
    startTime: str | None = Field(default=None, description="When the check began.")
    finishTime: str | None = Field(default=None, description="When it ended.")


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
    reason: str | None = Field(
        default=None, description="Why the run is not going as it should, in one CamelCase word (kubectl get -o "
        "wide: Reason): while Running, why its pod cannot start (ImagePullBackOff, ErrImagePull, "
        "CreateContainerConfigError, ...); once Failed or Aborted, why (ImagePullFailed, PinnedImageMissing, the "
        "abort reason, ...). Unset otherwise.", max_length=128)
    aborting: Aborting | None = Field(default=None, description=Aborting.__doc__)
    outcome: Outcome | None = Field(default=None, description="How the last attempt ended.")
    message: str | None = Field(default=None, description="Human-readable detail of the current phase.")
    inputHash: str | None = Field(default=None, description="sha256 of spec.input at the first attempt.")
    traceID: str | None = Field(
        default=None, description="The run's OpenTelemetry trace id (32 hex digits): every attempt and the operator's "
        "decisions add to this one trace when tracing is on (docs/metrics.md, Traces).")
    pin: ImagePin | None = Field(default=None, description=ImagePin.__doc__)
    upgradeCheck: UpgradeCheck | None = Field(default=None, description=UpgradeCheck.__doc__)
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
        description="Child runs the workflow asked for, by child name (written by the runner).",
        # Only the runner writes it, a whole request at a time: one managedFields entry, not one per leaf.
        json_schema_extra={"x-kubernetes-map-type": "atomic"})
    childrenCreated: list[str] | None = Field(
        default=None, description="The child runs the operator created whose outcome is not in spec.events yet, "
        "by child name (sorted): one deleted before it finished is never created again. Each child's state is "
        "its own DurableRun (label durablerun.dev/parent).")
    children: dict[str, ChildState] | None = Field(
        default=None, description="Written by operators before childrenCreated (a state per child); an operator "
        "now moves its names to childrenCreated and removes it.")
    childrenTotal: ChildrenTotal | None = Field(
        default=None, description="The children's count and cost (kubectl get: Children, Child Cost).")
    signalRequests: dict[str, SignalRequest] = Field(
        default_factory=dict,
        description="Events the workflow sends to other runs, by id (written by the runner).")
    signals: dict[str, SignalState] = Field(
        default_factory=dict, description="What became of each signal request, by id.")


#: Status fields only the runner writes (the operator never patches them, so no write of its can drop one).
RUNNER_REQUEST_FIELDS = ("childRequests", "signalRequests")


# --- what a runner may write, held by the API server -------------------------------------------------------
# A workflow runs in its runner's process, with its runner's token: whatever the runner may write, the workflow
# may. RBAC lets a runner patch the status of its namespace's runs (or of its own run only, in per-run access);
# a second ValidatingAdmissionPolicy (durablerun_operator.crd.admission_policy) holds each write to the run whose
# current attempt is the writer's own pod, and never the fields that fence attempts, count restarts, bound
# active time or pin code. So a workflow cannot write another run, finish its own run, outlive its fence or move
# its pin (docs/security.md, "Threat model").

#: The extra a pod-bound ServiceAccount token carries (Kubernetes 1.32+): the pod it was issued for.
POD_NAME_EXTRA = "authentication.kubernetes.io/pod-name"
#: The status fields the operator alone decides; a runner's write must leave each as it was.
OPERATOR_ONLY_FIELDS = ("epoch", "pod", "attempt", "phase", "restarts", "disruptions", "activeSeconds", "pin",
                        "upgradeCheck")
#: The writer is a runner: a ServiceAccount that may write a run's status but not the run itself. The operator,
#: people and controllers that may change runs are not matched; any runner ServiceAccount, the namespace's, a
#: template's or a per-run one, is, whichever run it writes.
RUNNER_WRITER = (
    "request.userInfo.username.startsWith('system:serviceaccount:') && "
    f"!authorizer.group('{GROUP}').resource('{PLURAL}').namespace(request.namespace).name(request.name)"
    ".check('patch').allowed()"
)
#: A runner writes only through its pod's own token, and only while its pod is the run's current attempt.
CURRENT_ATTEMPT_RULE = (
    f"has(request.userInfo.extra) && '{POD_NAME_EXTRA}' in request.userInfo.extra && "
    "has(oldObject.status) && has(oldObject.status.pod) && "
    f"request.userInfo.extra['{POD_NAME_EXTRA}'][0] == oldObject.status.pod"
)
CURRENT_ATTEMPT_ONLY = (
    "status: only the run's current attempt (the pod status.pod names, with its own pod-bound token) may write "
    "it; this pod is another run's, its attempt is over or never began"
)


def operator_only_rule(field: str) -> str:
    """A runner's write leaves status.<field> as it was (absent stays absent)."""
    new = f"has(object.status) && has(object.status.{field})"
    old = f"has(oldObject.status) && has(oldObject.status.{field})"
    return f"({new}) == ({old}) && (!({new}) || object.status.{field} == oldObject.status.{field})"


def operator_only_message(field: str) -> str:
    return (f"status.{field} is the operator's: a runner writes only its lease, progress, cost, checkpoint, outcome, "
            "result and requests")


# --- a child's spec (the rest of child runs and signals: durablerun.relations) ------------------

#: Budgets a child may only narrow: its value may not be above its parent's.
_NARROW_ONLY = ("costCeilingUSD", "maxTokens", "maxSteps", "maxDuration")


def child_spec(parent: DurableRunSpec, request: ChildRequest) -> DurableRunSpec:
    """The child's spec: the parent's template, checkpoint store and policy narrowed (``child_policy``)."""
    return DurableRunSpec(
        workflow=request.workflow, input=request.input, template=parent.template,
        checkpoint=parent.checkpoint, policy=child_policy(parent.policy, request), suspend=parent.suspend,
    )


def child_policy(parent: Policy, request: ChildRequest) -> Policy:
    """The parent's policy narrowed by the request; ValueError naming the field when the request would
    widen a budget (a child's cost also counts toward its parent's ceiling: a wider one could never hold)."""
    base = parent.model_dump(mode="json", exclude_none=True)
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
    return Policy.model_validate({**base, **request.policy})
