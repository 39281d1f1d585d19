"""Clocks: how long a run has had a pod, when its lease runs out, and when to look at it again.

Times come in as arguments (``now``), never from the clock: these are the
sums behind every deadline ``decide`` holds (maxDuration against active time,
the lease against its renewal, the progress timeout), and ``quiet_until``
turns them into the moment the reconciler must come back to a steady run.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from durablerun import api, resource
from durablerun_operator.decide import facts

# The runner stamps renewTime with its clock, the operator compares it with its own: a lease counts as
# expired only this long after it ran out, so a runner clock a little behind is not taken for a hang.
CLOCK_SKEW_MARGIN = timedelta(seconds=2)

# quiet_until's answer for a run the clock alone will never change (finished without a TTL, suspended).
NEVER = datetime.max.replace(tzinfo=UTC)


def attempt_start(status: resource.DurableRunStatus) -> datetime | None:
    """When the current attempt (if Running) started; the lease's acquisition for a status without it."""
    if status.phase != api.Phase.RUNNING:
        return None
    if status.attemptStartTime:
        return api.parse_time(status.attemptStartTime)
    return api.parse_time(status.lease.acquireTime) if status.lease.epoch == status.epoch else None


def active_time(status: resource.DurableRunStatus, now: datetime) -> timedelta:
    """The time the run has had a pod, over all its attempts: what maxDuration is held against."""
    return api.active_time(timedelta(seconds=status.activeSeconds), attempt_start(status), now)


def lease_validity(run: facts.RunView) -> timedelta:
    """How long after its last renewal (or its pod's start) the current lease counts as expired.

    The runner renews on the duration it published in status.lease.durationSeconds, so that is the
    one to judge it by (the policy may have been edited since the pod started); the policy's only
    until the lease is held. Plus the clock-skew margin.
    """
    lease = run.status.lease
    published = lease.durationSeconds if lease.epoch == run.status.epoch else None
    duration = timedelta(seconds=published) if published else run.spec.policy.lease_duration
    return duration + CLOCK_SKEW_MARGIN


def quiet_until(run: facts.RunView) -> datetime | None:
    """Before when ``decide`` has nothing to do for this run, if its pods stay as they are; None: decide now.

    The clock is the only thing that changes a run's decision without a new
    version of the run or of one of its pods: a lease, a progress timeout, a
    maxDuration, a backoff, a wake time or a TTL running out. The reconciler
    uses this to leave steady runs alone (every lease renewal is a new version
    of the run) and to come back exactly when the earliest of them passes.
    """
    status, spec, policy = run.status, run.spec, run.spec.policy
    phase = status.phase
    if run.deleting or phase is None or api.RUN_FINALIZER not in run.finalizers:
        return None
    if phase != api.Phase.RUNNING and status.aborting:
        return None  # the aborting attempt is over: the run is Aborted now, or its next attempt starts
    if api.ANNOTATION_ABORT in run.annotations and not status.aborting:
        return None
    if facts.pending_requests(run) or facts.upgrade_requested(run):
        return None
    max_duration = policy.max_duration
    if phase.finished:
        if (status.observedGeneration or 0) < run.generation or facts.retry_requested(run):
            return None  # the user changed the spec (an aborted run may resume) or asked for a retry
        completed = api.parse_time(status.completionTime)
        if spec.ttlSecondsAfterFinished is None or completed is None:
            return NEVER
        return completed + timedelta(seconds=spec.ttlSecondsAfterFinished)
    if phase == api.Phase.RUNNING:
        renewed = api.parse_time(status.lease.renewTime) if status.lease.epoch == status.epoch else None
        if renewed is None:
            return None  # the lease is not held yet: its deadline counts from the pod's start
        acquired = api.parse_time(status.lease.acquireTime)
        progress = max((m for m in (api.parse_time(status.progress.lastProgressTime), acquired) if m), default=renewed)
        began = attempt_start(status)
        used_up = began + max_duration - timedelta(seconds=status.activeSeconds) if began else NEVER
        if status.aborting:  # maxDuration may be what it is aborting for: the grace's deadline comes instead
            used_up = api.parse_time(status.aborting.deadline) or NEVER
        return min(renewed + lease_validity(run), progress + policy.progress_timeout, used_up)
    if timedelta(seconds=status.activeSeconds) > max_duration:
        return None  # out of active time (a retried run, a lowered maxDuration): abort it now
    if spec.suspend != (phase == api.Phase.SUSPENDED):
        return None
    if phase in (api.Phase.SUSPENDED, api.Phase.QUEUED):
        return NEVER  # no pod, so no active time: nothing on the clock (a Workload's change wakes a Queued run)
    if phase == api.Phase.BACKOFF:
        return api.parse_time(status.nextAttemptTime)
    if phase == api.Phase.WAITING:
        waiting = status.waitingFor or resource.WaitingFor()
        if (waiting.event and waiting.event in spec.events) or facts.budget_lifted(run):
            return None
        moments = [m for m in (api.parse_time(waiting.wakeTime), api.parse_time(waiting.deadline)) if m]
        return min(moments, default=NEVER)
    return None  # Pending: start the next attempt
