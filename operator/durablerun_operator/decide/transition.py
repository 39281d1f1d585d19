"""One transition of a run: the ``Plan`` it produces and the ``Transition`` every step writes into.

A step of ``decide`` (in ``lifecycle``, ``aborts``, ``family``) reads the
run's facts from ``Transition.run`` and writes the next status into
``Transition.new``, Events and pod actions into ``Transition.plan``;
``Transition.done`` turns that into the guarded status patch.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from durablerun import api, relations, resource
from durablerun_operator import kueue
from durablerun_operator.decide import clocks, facts


@dataclass
class Plan:
    """One transition: a guarded status patch, then pod actions, Events and metrics."""

    patch: list[dict[str, Any]] = field(default_factory=list)
    create_pod_epoch: int | None = None
    # Kueue (the kueue module): queue the run's Workload, delete it (releasing its quota), and the flavors its
    # admission assigned, whose nodes the pod created with this plan must go to.
    create_workload: bool = False
    delete_workload: str | None = None
    flavors: tuple[str, ...] = ()
    create_purge_pod: bool = False
    create_check_pod: bool = False  # an upgrade's check (builders.check_pod, from status.upgradeCheck)
    delete_pods: list[str] = field(default_factory=list)
    release_pods: list[str] = field(default_factory=list)
    add_run_finalizer: bool = False
    remove_run_finalizer: bool = False
    delete_run: bool = False
    events: list[tuple[str, str, str]] = field(default_factory=list)  # (type, reason, message)
    restart_reason: str | None = None
    abort_reason: str | None = None
    completion: str | None = None
    upgraded: bool = False  # an upgrade's check passed and moved the run's pin (counted in metrics)
    # Child runs and signals (after the status patch): this run's own new spec.events (child outcomes),
    # DurableRuns to create (children), merge patches of other runs by name (signals, suspend, abort).
    add_events: dict[str, Any] = field(default_factory=dict)
    create_runs: list[dict[str, Any]] = field(default_factory=list)
    patch_runs: list[tuple[str, dict[str, Any]]] = field(default_factory=list)

    @property
    def touches_workload(self) -> bool:
        return self.create_workload or self.delete_workload is not None

    @property
    def touches_runs(self) -> bool:
        return bool(self.create_runs or self.patch_runs)

    @property
    def touches_pods(self) -> bool:
        return bool(self.create_pod_epoch is not None or self.create_purge_pod or self.create_check_pod
                    or self.delete_pods or self.release_pods)

    @property
    def only_starts_a_pod(self) -> bool:
        """The plan's only pod action is creating the attempt's pod."""
        return bool(self.create_pod_epoch is not None and not (self.create_purge_pod or self.create_check_pod
                                                               or self.delete_pods or self.release_pods))

    @property
    def empty(self) -> bool:
        return not (self.patch or self.touches_pods or self.add_run_finalizer or self.remove_run_finalizer
                    or self.delete_run or self.add_events or self.touches_runs or self.touches_workload)


def status_patch(
    old: dict[str, Any] | None, new: resource.DurableRunStatus, *, guard: dict[str, Any]
) -> list[dict[str, Any]]:
    """A JSON patch from ``old`` to ``new`` whose ``test`` ops pin ``guard`` (path -> value).

    A concurrent change to any guarded field makes the API server refuse the
    whole patch: the decision is then made again on fresh facts.
    """
    new_doc = new.model_dump(mode="json", exclude_none=True)
    if old is None:
        return [*guard_ops(guard), {"op": "add", "path": "/status", "value": new_doc}]
    ops = guard_ops(guard)
    for key in sorted(set(old) | set(new_doc)):
        if key in resource.RUNNER_REQUEST_FIELDS:
            continue  # the runner's alone: a stale copy written back could drop a request it just added
        if key not in new_doc:
            ops.append({"op": "remove", "path": f"/status/{key}"})
        elif old.get(key) != new_doc[key]:
            ops.append({"op": "add", "path": f"/status/{key}", "value": new_doc[key]})
    return ops


def guard_ops(guard: dict[str, Any]) -> list[dict[str, Any]]:
    """The JSON patch ``test`` ops that pin ``guard`` (path -> value)."""
    return [{"op": "test", "path": path, "value": value} for path, value in guard.items()]


def conditions(status: resource.DurableRunStatus, now: datetime, generation: int) -> list[resource.Condition]:
    """Job-style conditions derived from the phase: Progressing, Suspended, Complete, Failed."""
    phase = status.phase
    wanted = {
        api.ConditionType.PROGRESSING: phase in (api.Phase.PENDING, api.Phase.QUEUED, api.Phase.RUNNING,
                                                 api.Phase.BACKOFF,
                                                 api.Phase.WAITING),
        api.ConditionType.SUSPENDED: phase == api.Phase.SUSPENDED,
        api.ConditionType.COMPLETE: phase == api.Phase.SUCCEEDED,
        api.ConditionType.FAILED: phase in (api.Phase.FAILED, api.Phase.ABORTED),
    }
    old = {c.type: c for c in status.conditions}
    reason = (status.reason if status.reason
              else status.abortReason.value if phase == api.Phase.ABORTED and status.abortReason
              else "JournalHeld" if phase == api.Phase.WAITING and status.waitingFor and status.waitingFor.holder
              else (phase.value if phase else "Unknown"))
    out = []
    stamp = api.format_time(now)
    for kind, true in wanted.items():
        value = "True" if true else "False"
        previous = old.get(kind)
        changed = previous is None or previous.status != value
        out.append(resource.Condition(
            type=kind.value, status=value, reason=reason, message=(status.message or "")[:1024],
            lastTransitionTime=(stamp if changed or not previous else previous.lastTransitionTime) or stamp,
            observedGeneration=generation,
        ))
    check = status.upgradeCheck
    if check is not None:  # only once an upgrade was asked for: whether the image asked for replays the journal
        value = {api.UpgradeState.REPLAYS: "True", api.UpgradeState.REFUSED: "False"}.get(check.state, "Unknown")
        previous = old.get(api.ConditionType.UPGRADE_REPLAYS)
        out.append(resource.Condition(
            type=api.ConditionType.UPGRADE_REPLAYS.value, status=value, reason=check.state.value,
            message=(check.message or f"checking {check.image}")[:1024],
            lastTransitionTime=(previous.lastTransitionTime if previous and previous.status == value else None)
            or stamp, observedGeneration=generation,
        ))
    return out


def in_flight(status: resource.DurableRunStatus, at: datetime) -> str:
    """What the current attempt was doing at ``at``, from its runner's last report (status.progress): the step
    in flight (name, position, attempt, how long it had run), else the last step it journaled."""
    progress = status.progress
    step = progress.inFlight
    if step is not None:
        began = api.parse_time(step.startTime)
        ran = f", running for {_how_long(at - began)}" if began else ""
        return f"during step {step.name!r} (position {step.position}, attempt {step.attempt}{ran})"
    if progress.stepName:
        return f"between steps, after {progress.stepName!r} ({progress.completedSteps} journaled)"
    if progress.completedSteps:
        return f"between steps ({progress.completedSteps} journaled)"
    return "before its first step"


def _how_long(delta: timedelta) -> str:
    """``1h2m``, ``2m30s``, ``45s``: for people (api.format_duration is for the API's fields)."""
    seconds = max(0, int(delta.total_seconds()))
    hours, minutes, seconds = seconds // 3600, seconds // 60 % 60, seconds % 60
    if hours:
        return f"{hours}h{minutes}m" if minutes else f"{hours}h"
    if minutes:
        return f"{minutes}m{seconds}s" if seconds else f"{minutes}m"
    return f"{seconds}s"


class Transition:
    """Builds the next status from the current one, with guards and side effects."""

    def __init__(self, run: facts.RunView, now: datetime, related: Mapping[str, facts.RunView | None],
                 children: Mapping[str, facts.RunView], children_total: relations.ChildrenTotal | None,
                 queueing: kueue.Queueing | None = None) -> None:
        self.run, self.now = run, now
        self.queueing = queueing  # None: the run is not admitted through Kueue
        self.new = run.status.model_copy(deep=True)
        self.plan = Plan()
        self.related = related  # the runs decide was given, by name (None: no such run)
        self.children = children  # this run's children that exist, by child name (family.children)
        self.children_total = children_total
        self.guard: dict[str, Any] = {}
        if run.raw_status is not None:
            self.guard["/status/epoch"] = run.status.epoch
            if run.raw_status.get("phase") is not None:
                self.guard["/status/phase"] = run.raw_status["phase"]
        else:
            self.guard["/metadata/resourceVersion"] = run.body["metadata"]["resourceVersion"]

    def event(self, reason: str, message: str, warning: bool = False) -> None:
        self.plan.events.append(("Warning" if warning else "Normal", reason, message))

    def fence(self) -> None:
        """Leave the current attempt: bump the epoch, so its pod can no longer write."""
        self.new.epoch = self.run.status.epoch + 1
        self.new.lease = resource.Lease()

    def finish(self, phase: api.Phase, message: str, abort: api.AbortReason | None = None,
               reason: str | None = None) -> None:
        """End the run. ``reason``: why it Failed, one CamelCase word for status.reason (an abort's is its own)."""
        self.new.phase = phase
        self.new.message = message
        self.new.abortReason = abort
        self.new.reason = abort.value if abort is not None else reason
        self.new.completionTime = api.format_time(self.now)
        self.new.waitingFor = None
        self.new.nextAttemptTime = None
        self.new.aborting = None
        self.plan.completion = phase.value  # Succeeded, Failed or Aborted: the Event's reason too
        if phase == api.Phase.ABORTED:
            assert abort is not None
            self.plan.abort_reason = abort.value
            message = f"{abort.value}: {message}"
        self.event(phase.value, message, warning=phase != api.Phase.SUCCEEDED)

    def done(self) -> Plan:
        old = self.run.status
        if old.phase == api.Phase.RUNNING and self.new.phase != api.Phase.RUNNING:
            # The attempt is over: add its time with a pod (until the pod ended, if we know when).
            ended = (api.parse_time(self.new.lastPodEndTime) if self.new.lastPodEndTime != old.lastPodEndTime
                     else None) or self.now
            self.new.activeSeconds = int(clocks.active_time(old, ended).total_seconds())
            self.new.attemptStartTime = None
        if self.new.phase != api.Phase.RUNNING and not (self.new.phase and self.new.phase.finished):
            self.new.reason = None  # only a Running run's pod that cannot start, or a finished run, has one
        if self.new != self.run.status or self.run.raw_status is None:
            self.new.observedGeneration = self.run.generation
            self.new.conditions = conditions(self.new, self.now, self.run.generation)
            self.plan.patch = status_patch(self.run.raw_status, self.new, guard=self.guard)
        elif self.plan.touches_pods or self.plan.touches_workload:
            # Pod and Workload actions that change no status (a pod created again after an interrupted create,
            # pods no attempt owns deleted or released, a queued run's Workload made again) still act on what
            # was read. Another operator may have moved the run on since: a stale read must neither bring back
            # the pod of an attempt that is over nor delete the pod of one begun after it. The guard alone,
            # tested by the API server just before, refuses them then.
            self.plan.patch = guard_ops(self.guard)
        return self.plan
