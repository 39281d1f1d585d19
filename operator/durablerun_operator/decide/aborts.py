"""Aborts: a user's request, the limits a run is held to, and the grace an attempt gets to undo its work.

An abort of a live attempt holding its lease first gives the runner
policy.abortGracePeriod to end Aborted by itself (its Sagas compensate
meanwhile, ``status.aborting`` says until when); past it, or at once for an
attempt that cannot carry it out, the attempt is fenced and the run ends
Aborted. ``abort_lifted`` answers the reverse: whether a raised limit lets an
Aborted run resume.
"""

from __future__ import annotations

from datetime import timedelta
from decimal import Decimal, InvalidOperation

from durablerun import api, resource
from durablerun_operator.decide import clocks, facts, transition


def user_abort(t: transition.Transition, pod: facts.PodView | None = None) -> bool:
    reason = t.run.annotations.get(api.ANNOTATION_ABORT)
    if reason is None:
        return False
    _abort(t, api.AbortReason.USER_REQUESTED, f"aborted by request: {reason or 'no reason given'}", pod)
    return True


def _abort(t: transition.Transition, reason: api.AbortReason, message: str, pod: facts.PodView | None) -> None:
    """Abort the run. A live attempt holding its lease first gets policy.abortGracePeriod to end Aborted by
    itself (its Sagas undo their work meanwhile); then, or at once for one that cannot, it is fenced."""
    status = t.run.status
    aborting = status.aborting
    grace = t.run.spec.policy.abort_grace_period
    if aborting is None and grace > timedelta(0) and reason != api.AbortReason.PROGRESS_TIMEOUT:
        deadline = api.format_time(t.now + grace)
        if holds_its_lease(t, pod):
            t.new.aborting = resource.Aborting(reason=reason, message=message, deadline=deadline)
            t.new.message = (f"aborting: {message}; the runner stops at its next operation and undoes its work "
                             f"(Sagas) until {deadline} (policy.abortGracePeriod)")
            t.event("Aborting", t.new.message)
            return
        if _undo_the_wait(t, resource.Aborting(reason=reason, message=message, deadline=deadline)):
            return
    if aborting is not None:
        if _within_grace(t, aborting):
            if pod is not None:
                return  # the runner is ending by itself
            if _undo_the_wait(t, aborting):
                return  # it began to wait before it read the abort
        reason, message = aborting.reason, aborting.message
        if pod is not None:
            message += (f"; pod {pod.name} did not end within policy.abortGracePeriod="
                        f"{t.run.spec.policy.abortGracePeriod}, so it was stopped")
    t.fence()
    if pod is not None:
        message += f"; it was stopped {transition.in_flight(status, t.now)}"
        if not pod.deleting:
            t.plan.delete_pods.append(pod.name)
    t.finish(api.Phase.ABORTED, message, reason)


def _undo_the_wait(t: transition.Transition, aborting: resource.Aborting) -> bool:
    """A run waiting inside a Saga (no pod): start an attempt that aborts at the wait and compensates."""
    status = t.run.status
    undo = status.waitingFor.compensations if status.phase == api.Phase.WAITING and status.waitingFor else None
    if not undo:
        return False
    t.new.aborting = aborting
    t.new.phase = api.Phase.PENDING
    t.new.message = (f"aborting: {aborting.message}; starting an attempt to run the {undo} Saga compensation(s) "
                     f"registered before the wait, until {aborting.deadline} (policy.abortGracePeriod)")
    t.event("Aborting", t.new.message)
    return True


def abort_decided(t: transition.Transition) -> bool:
    """An abort given to the runner whose attempt is over: it ends the run now (no pod, no more time)."""
    aborting = t.run.status.aborting
    if aborting is None:
        return False
    _abort(t, aborting.reason, aborting.message, None)
    return True


def finishing_abort(t: transition.Transition) -> bool:
    """An abort the runner was given time to carry out, still within it."""
    return t.new.aborting is not None and _within_grace(t, t.new.aborting)


def _within_grace(t: transition.Transition, aborting: resource.Aborting) -> bool:
    return t.now < (api.parse_time(aborting.deadline) or t.now)


def holds_its_lease(t: transition.Transition, pod: facts.PodView | None) -> bool:
    """Whether the attempt's runner is up and can carry an abort out (one not started yet has done nothing)."""
    status = t.run.status
    return (pod is not None and not pod.deleting and status.lease.epoch == status.epoch
            and status.lease.renewTime is not None)


def limits_exceeded(t: transition.Transition, pod: facts.PodView | None = None) -> bool:
    """maxDuration and progressTimeout hold even when the runner is hung."""
    status, policy = t.run.status, t.run.spec.policy
    if clocks.active_time(status, t.now) > policy.max_duration:
        _abort(t, api.AbortReason.MAX_DURATION_EXCEEDED,
               f"the run has had a pod for longer than policy.maxDuration={policy.maxDuration} (waits, "
               "sleeps, suspension and backoff do not count); raise it to resume", pod)
        return True
    ceiling = policy.costCeilingUSD
    children_usd = Decimal(t.children_total.usd) if t.children_total else Decimal(0)
    if ceiling is not None and children_usd > 0 and Decimal(status.cost.usd) + children_usd >= Decimal(ceiling):
        _abort(t, api.AbortReason.BUDGET_EXHAUSTED,
               f"the run's cost ${status.cost.usd} and its child runs' ${children_usd} reach "
               f"policy.costCeilingUSD ${ceiling}; raise it to resume", pod)
        return True
    if status.phase == api.Phase.RUNNING and pod is not None:
        progress = api.parse_time(status.progress.lastProgressTime)
        acquired = api.parse_time(status.lease.acquireTime) if status.lease.epoch == status.epoch else None
        reference = max((m for m in (progress, acquired) if m is not None), default=None)
        timeout = policy.progress_timeout
        if reference is not None and t.now - reference > timeout:
            t.guard["/status/progress"] = status.progress.model_dump(mode="json", exclude_none=True)
            _abort(t, api.AbortReason.PROGRESS_TIMEOUT,
                   f"no step completed for policy.progressTimeout={policy.progressTimeout}", pod)
            return True
    return False



def abort_lifted(t: transition.Transition) -> bool:
    """Whether the policy now allows what made the run abort (the user raised a limit)."""
    status, policy = t.run.status, t.run.spec.policy
    reason = status.abortReason
    if reason == api.AbortReason.BUDGET_EXHAUSTED:
        try:
            cost = Decimal(status.cost.usd) + (Decimal(t.children_total.usd) if t.children_total else 0)
            ceiling = Decimal(policy.costCeilingUSD) if policy.costCeilingUSD else None
        except InvalidOperation:
            return False
        return ((ceiling is None or cost < ceiling)
                and (policy.maxTokens is None or status.cost.tokens < policy.maxTokens)
                and (policy.maxSteps is None or status.progress.completedSteps < policy.maxSteps))
    if reason == api.AbortReason.MAX_DURATION_EXCEEDED:
        return clocks.active_time(status, t.now) < policy.max_duration
    if reason == api.AbortReason.RETRY_LIMIT_EXCEEDED:
        return status.restarts <= policy.maxRestarts and status.disruptions <= policy.maxDisruptions
    return reason == api.AbortReason.PROGRESS_TIMEOUT
