"""What the operator observes of a run: its pods (how an attempt ended), the run itself, and requests.

Plain views built from API objects once per decision, so the rest of ``decide``
reads typed facts: ``PodView.from_pod`` turns a pod (its runner's termination
message, its disruption conditions, a node gone silent) into an ``Ending``;
``RunView.from_body`` reads the DurableRun. The last section answers whether
someone asked for something the operator has not acted on yet (a retry, a
child run, a signal): such a run is decided at once, whatever the clock says.
"""

from __future__ import annotations

import json
import signal
from dataclasses import dataclass, replace
from datetime import datetime, timedelta
from decimal import Decimal
from typing import Any

from durablerun import api, relations, resource
from durablerun_operator import builders

R = api.RestartReason
_DISRUPTION_REASONS = {
    "EvictionByEvictionAPI": R.EVICTED,
    "TerminationByKubelet": R.EVICTED,
    "PreemptionByScheduler": R.PREEMPTED,
    "PreemptionByKubeScheduler": R.PREEMPTED,
    "DeletionByTaintManager": R.NODE_LOST,
    "DeletionByPodGC": R.NODE_LOST,
}

@dataclass(frozen=True)
class Ending:
    """How an attempt's pod ended, as far as the run is concerned."""

    reason: str  # an Outcome value, or an api.RestartReason
    message: str
    outcome: api.Outcome | None = None
    abort_reason: api.AbortReason | None = None
    waiting_for: dict[str, Any] | None = None
    finished_at: datetime | None = None

    @property
    def disruption(self) -> bool:
        return self.outcome is None and R(self.reason).disruption


@dataclass(frozen=True)
class PodView:
    name: str
    uid: str
    epoch: int
    phase: str
    deleting: bool
    deletion_time: datetime | None
    deleted_by_operator: bool
    has_finalizer: bool
    running_since: datetime | None
    waiting_reason: str | None
    waiting_message: str | None
    ending: Ending | None
    memory_limit: str | None
    #: Who is removing the pod, when someone other than the operator is (an eviction, the taint manager, a
    #: user's delete): a lapsed lease then means the pod is going, not that the runner hung.
    disruption: api.RestartReason | None = None
    #: spec.terminationGracePeriodSeconds: the time its runner gets to stop when the pod is deleted.
    grace_seconds: int = 30
    #: The runner container's image as the pod names it, and the digest the node ran for it (None: not
    #: started yet, or a node that runs no images, like the test bed's process node).
    image: str | None = None
    digest: str | None = None
    #: The runner container's exit code and termination message (the kubelet's: its file, or its log's tail on an
    #: error), once it ended: an upgrade's check pod reports through them.
    exit_code: int | None = None
    exit_message: str = ""

    @property
    def finished(self) -> bool:
        return self.ending is not None

    @classmethod
    def from_pod(cls, pod: dict[str, Any], now: datetime, stuck_seconds: float) -> PodView:
        meta, status = pod["metadata"], pod.get("status") or {}
        labels, annotations = meta.get("labels") or {}, meta.get("annotations") or {}
        runner = _runner_status(pod)
        state = (runner or {}).get("state") or {}
        deleting = meta.get("deletionTimestamp") is not None
        deletion_time = api.parse_time(meta.get("deletionTimestamp"))
        limit = builders.memory_limit(pod)
        terminated = state.get("terminated") or {}
        view = cls(
            name=meta["name"], uid=meta["uid"], epoch=int(labels.get(api.LABEL_EPOCH, "0")),
            phase=status.get("phase") or "Pending",  # literal-ok: the pod's phase, Kubernetes' word
            deleting=deleting, deletion_time=deletion_time,
            deleted_by_operator=api.ANNOTATION_DELETED_BY_OPERATOR in annotations,
            has_finalizer=api.POD_FINALIZER in (meta.get("finalizers") or []),
            running_since=api.parse_time((state.get("running") or {}).get("startedAt")),
            waiting_reason=(state.get("waiting") or {}).get("reason"),
            waiting_message=(state.get("waiting") or {}).get("message"),
            ending=None, memory_limit=limit,
            grace_seconds=int((pod.get("spec") or {}).get("terminationGracePeriodSeconds", 30)),
            image=builders.runner_image(pod), digest=api.image_digest(str((runner or {}).get("imageID") or "")),
            exit_code=int(terminated.get("exitCode", -1)) if terminated else None,
            exit_message=str(terminated.get("message") or ""),
        )
        return _with_ending(view, pod, state, now, stuck_seconds)


def _runner_status(pod: dict[str, Any]) -> dict[str, Any] | None:
    statuses = (pod.get("status") or {}).get("containerStatuses") or []
    for entry in statuses:
        if entry.get("name") == api.RUNNER_CONTAINER:
            return dict(entry)
    return dict(statuses[0]) if statuses else None


def _disruption(pod: dict[str, Any], view: PodView) -> api.RestartReason | None:
    for condition in (pod.get("status") or {}).get("conditions") or []:
        if condition.get("type") == "DisruptionTarget" and condition.get("status") == "True":
            return _DISRUPTION_REASONS.get(condition.get("reason", ""), R.POD_DELETED)
    if (pod.get("status") or {}).get("reason") == "Evicted":
        return R.EVICTED
    if view.deleting and not view.deleted_by_operator:
        return R.POD_DELETED
    return None


def _with_ending(
    view: PodView, pod: dict[str, Any], state: dict[str, Any], now: datetime, stuck_seconds: float
) -> PodView:
    disruption = _disruption(pod, view)
    view = replace(view, disruption=disruption)
    terminated = state.get("terminated")
    if terminated:
        ending = _terminated_ending(terminated, view, disruption)
    elif view.phase in ("Failed", "Succeeded"):  # literal-ok: the pod's phases, Kubernetes' words
        # The pod ended without a container status: evicted by its kubelet, say.
        ending = Ending(disruption or R.CRASH, f"pod {view.name} ended: {pod.get('status', {}).get('message', '')}")
    elif view.deleting and view.deletion_time is not None and (
        (pod["metadata"].get("deletionGracePeriodSeconds") == 0)
        or now > view.deletion_time + timedelta(seconds=stuck_seconds)
    ):
        # Force-deleted or stuck Terminating: its node is gone and will report nothing.
        ending = Ending(disruption or R.NODE_LOST, f"pod {view.name} was lost with its node before it could report")
    else:
        return view
    return replace(view, ending=ending)


def _terminated_ending(terminated: dict[str, Any], view: PodView, disruption: api.RestartReason | None) -> Ending:
    code = int(terminated.get("exitCode", -1))
    finished = api.parse_time(terminated.get("finishedAt"))
    raw = terminated.get("message") or ""
    if terminated.get("reason") == "OOMKilled":
        limit = f" (memory limit {view.memory_limit})" if view.memory_limit else ""
        return Ending(R.OOM_KILLED, f"the runner was OOMKilled{limit}: raise spec.template's runner container "
                      "resources.limits.memory", finished_at=finished)
    report = _parse_termination_message(raw)
    outcome = None
    if report is not None and code == api.Outcome(report["outcome"]).exit_code:
        outcome = api.Outcome(report["outcome"])
    if outcome is not None and report is not None:
        if disruption and outcome in (api.Outcome.SUSPENDED, api.Outcome.FENCED):
            # It stopped because its pod was deleted or evicted under it.
            return Ending(disruption, _disruption_message(disruption, view.name), finished_at=finished)
        reason = report.get("abortReason")
        return Ending(
            outcome.value, str(report.get("message") or outcome.value), outcome=outcome,
            abort_reason=api.AbortReason(reason) if reason else None,
            waiting_for=report.get("waitingFor"), finished_at=finished,
        )
    if disruption:
        return Ending(disruption, _disruption_message(disruption, view.name), finished_at=finished)
    # Not its last log line (the kubelet's fallback termination message): what the run was doing is the step in
    # flight, which the transition names from the runner's last report (transition.in_flight).
    return Ending(R.CRASH, f"the runner crashed with exit code {code}{_signal_of(code)}", finished_at=finished)


def _signal_of(code: int) -> str:
    """" (killed by SIGKILL)" for exit code 137: a shell's and the kubelet's 128 + signal number."""
    try:
        return f" (killed by {signal.Signals(code - 128).name})" if code > 128 else ""
    except ValueError:
        return ""


def _parse_termination_message(raw: str) -> dict[str, Any] | None:
    try:
        report = json.loads(raw)
        api.Outcome(report["outcome"])
    except (ValueError, KeyError, TypeError):
        return None
    return dict(report)


def _disruption_message(reason: api.RestartReason, pod: str) -> str:
    return {
        R.EVICTED: f"pod {pod} was evicted",
        R.PREEMPTED: f"pod {pod} was preempted",
        R.NODE_LOST: f"pod {pod} was lost with its node",
    }.get(reason, f"pod {pod} was deleted by someone other than the operator")


@dataclass(frozen=True)
class CreateFailure:
    """The operator could not create the pod named ``pod`` (an attempt's or an upgrade's check pod): what the
    reconciler saw, for decide to act on."""

    pod: str
    message: str
    # The API server refused the pod as invalid or forbidden, or it could not be built from the template:
    # trying again cannot help. Otherwise (quota, throttling, the API server unreachable) it may.
    permanent: bool


@dataclass(frozen=True)
class RunView:
    namespace: str
    name: str
    uid: str
    generation: int
    deleting: bool
    finalizers: tuple[str, ...]
    annotations: dict[str, str]
    spec: resource.DurableRunSpec
    status: resource.DurableRunStatus
    raw_status: dict[str, Any] | None
    body: dict[str, Any]

    @classmethod
    def from_body(cls, body: dict[str, Any]) -> RunView:
        meta = body["metadata"]
        return cls(
            namespace=meta["namespace"], name=meta["name"], uid=meta["uid"],
            generation=int(meta.get("generation") or 0),
            deleting=meta.get("deletionTimestamp") is not None,
            finalizers=tuple(meta.get("finalizers") or ()),
            annotations=dict(meta.get("annotations") or {}),
            spec=resource.DurableRunSpec.model_validate(body["spec"]),
            status=resource.DurableRunStatus.model_validate(body.get("status") or {}),
            raw_status=body.get("status"),
            body=body,
        )


# --- requests not acted on yet ------------------------------------------------------------


def budget_lifted(run: RunView) -> bool:
    """A run waiting on its budget (policy.askAt) whose policy now lets it go on: the limit it reached was raised
    past its cost, or removed."""
    waiting = run.status.waitingFor
    if run.status.phase != api.Phase.WAITING or waiting is None or not waiting.budget:
        return False
    cost = run.status.cost
    return run.spec.policy.asks(Decimal(cost.usd), cost.tokens) is None


def retry_requested(run: RunView) -> bool:
    """A finished run whose retry annotation holds a value not acted on yet (``kubectl durablerun rerun`` retries a
    Succeeded run whose journal it cut back; a Succeeded run whose journal is whole just completes again)."""
    value = run.annotations.get(api.ANNOTATION_RETRY)
    return (run.status.phase in (api.Phase.FAILED, api.Phase.ABORTED, api.Phase.SUCCEEDED) and value is not None
            and value != run.status.retry)


def upgrade_requested(run: RunView) -> bool:
    """A pinned run whose durablerun.dev/upgrade annotation holds a value not acted on yet."""
    value = run.annotations.get(api.ANNOTATION_UPGRADE)
    status = run.status
    return (status.pin is not None and value is not None and value != status.pin.request
            and (status.upgradeCheck is None or value != status.upgradeCheck.request))


@dataclass(frozen=True)
class UpgradeRequest:
    """A durablerun.dev/upgrade annotation, read: the image to check (a tag or a digest), who asked, and
    whether only to check."""

    image: str
    by: str
    dry_run: bool


def upgrade_request(value: str) -> UpgradeRequest | str:
    """A durablerun.dev/upgrade annotation's request, or what is wrong with it."""
    try:
        request = json.loads(value)
        image, by, dry_run = request["image"], request.get("by") or "someone", request.get("dryRun", False)
    except (ValueError, KeyError, TypeError, AttributeError):
        return 'not a JSON object {"image": "<image>", "by": "<who>", "dryRun": false}'
    if not isinstance(image, str) or not image or len(image) > 1024 or any(c.isspace() for c in image):
        return f"image {image!r} is not an image reference"
    if not isinstance(dry_run, bool):
        return f"dryRun {dry_run!r} is not true or false"
    return UpgradeRequest(image, str(by)[:256], dry_run)


def children_created(status: resource.DurableRunStatus) -> set[str]:
    """The children the operator created: ``childrenCreated``, and an older operator's ``children``."""
    return set(status.childrenCreated or ()) | set(status.children or {})


def pending_requests(run: RunView) -> bool:
    """Whether the runner asked for a child or a signal the operator has not acted on yet."""
    status, events, created = run.status, run.spec.events, children_created(run.status)
    return (any(c not in created and relations.child_event(c) not in events for c in status.childRequests)
            or any(s not in status.signals for s in status.signalRequests))
