"""When a settled run must be decided again: its next wake-up, as pure functions of what the operator saw.

A run the operator has done everything for costs nothing until either a watch
event (a new version of it or of one of its pods) or the clock changes what
``decide`` would do. ``decide.quiet_until`` knows the run's own clock (lease,
progress timeout, maxDuration, backoff, wake time, wait deadline, TTL); its pods
add three more: a pod Terminating past ``stuck_seconds`` counts as lost with its
node, a pod that runs without having acquired its lease loses the attempt
one lease after it started, and a pod that cannot get its image fails the run
at the start timeout. The reconciler keeps one timer per run at the
earliest of them (docs/operator.md, "Waiting costs nothing").
"""

from __future__ import annotations

from datetime import datetime, timedelta

from durablerun import api
from durablerun_operator import decide
from durablerun_operator.decide import clocks, lifecycle

NEVER = decide.NEVER
# A settled run whose clock none of the functions below can read (none is known) is looked at again after
# this long anyway, so a case they miss costs one decide a minute rather than a run left alone for good.
FALLBACK = timedelta(seconds=60)


def pods_until(pods: list[decide.PodView], stuck_seconds: float) -> datetime:
    """Before when the clock changes nothing about these pods (NEVER: only a new version of one does)."""
    stuck = timedelta(seconds=stuck_seconds)
    moments = [p.deletion_time + stuck for p in pods
               if p.deleting and p.ending is None and p.deletion_time is not None]
    return min(moments, default=NEVER)


def unheld_lease_until(run: decide.RunView, pods: list[decide.PodView],
                       start_timeout: timedelta = lifecycle.START_TIMEOUT) -> datetime | None:
    """A Running run whose lease is not held yet: when its attempt's clock runs out (None: not such a run).

    ``decide`` takes the lease as expired one lease validity after the pod's
    container started; maxDuration counts from the attempt's start; an abort
    in its grace ends at its deadline; a pod that cannot get its image fails
    the run ``start_timeout`` after the attempt started.
    """
    status = run.status
    if status.phase != api.Phase.RUNNING or (status.lease.epoch == status.epoch and status.lease.renewTime):
        return None
    moments = []
    current = next((p for p in pods if p.name == status.pod and p.epoch == status.epoch), None)
    if current is not None and current.running_since is not None:
        moments.append(current.running_since + clocks.lease_validity(run))
    if (deadline := lifecycle.start_deadline(run, current, start_timeout)) is not None:
        moments.append(deadline)
    began = clocks.attempt_start(status)
    if began is not None:
        max_duration = api.parse_duration(run.spec.policy.maxDuration)
        moments.append(began + max_duration - timedelta(seconds=status.activeSeconds))
    if status.aborting and (deadline := api.parse_time(status.aborting.deadline)):
        moments.append(deadline)
    return min(moments, default=NEVER)


def check_until(run: decide.RunView) -> datetime:
    """An upgrade's check in flight: when it times out (its pod's changes wake the run before that)."""
    check = run.status.upgradeCheck
    began = api.parse_time(check.startTime) if check and check.state == api.UpgradeState.CHECKING else None
    return began + lifecycle.CHECK_TIMEOUT if began else NEVER


def combine(run_until: datetime | None, pod_until: datetime | None) -> datetime | None:
    """The earlier of the run's and its pods' moments; None (decide now) if the run's is None."""
    if run_until is None:
        return None
    return min(run_until, pod_until or NEVER)


def next_wakeup(run: decide.RunView, pods: list[decide.PodView], now: datetime, stuck_seconds: float,
                start_timeout: timedelta = lifecycle.START_TIMEOUT) -> datetime:
    """When to decide a run again for which ``decide`` just had nothing to do, if no watch event comes first."""
    pod_until = min(pods_until(pods, stuck_seconds), check_until(run))
    run_until = decide.quiet_until(run)
    if run_until is None:
        run_until = unheld_lease_until(run, pods, start_timeout)
    if run_until is not None:
        return min(run_until, pod_until)
    if pod_until != NEVER:
        return pod_until  # Pending behind a pod that is still terminating: its moment (or its deletion) counts
    return now + FALLBACK  # a state no clock above is known for
