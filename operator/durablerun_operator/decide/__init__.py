"""The operator's decisions, as pure functions: (run, its pods, now) -> one Plan.

Nothing here talks to the API. ``decide`` makes one transition at a time; the
reconciler applies its plan (the status patch first, guarded by ``test`` ops so
a concurrent writer makes it fail and the decision is made again on fresh
facts), then asks again until nothing is left to do.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Mapping
from datetime import UTC, datetime, timedelta
from decimal import Decimal, InvalidOperation
from typing import Any

from durablerun import api
from durablerun_operator import builders
from durablerun_operator.decide import clocks, transition
from durablerun_operator.decide.clocks import CLOCK_SKEW_MARGIN, NEVER, quiet_until
from durablerun_operator.decide.facts import R, CreateFailure, Ending, PodView, RunView, retry_requested
from durablerun_operator.decide.transition import Plan

__all__ = ["CLOCK_SKEW_MARGIN", "NEVER", "CreateFailure", "Plan", "PodView", "RunView", "decide", "now_utc",
           "quiet_until", "related_names"]


def now_utc() -> datetime:
    return datetime.now(UTC)


def decide(run: RunView, pods: list[PodView], now: datetime, *, stuck_seconds: float = 60.0,
           related: Mapping[str, RunView | None] | None = None,
           create_failure: CreateFailure | None = None) -> Plan:
    """The next transition of ``run``, given every pod labelled with it (and the last failure to create one).

    ``related``: the runs, by name, its child requests and pending signals name (None: no such run).
    """
    related = related or {}
    children = _children(run, related)
    t = transition.Transition(run, now, related, children, _children_total(children))
    status, spec = run.status, run.spec
    purge = next((p for p in pods if p.name == builders.purge_pod_name(run.name)), None)
    pods = [p for p in pods if p is not purge]
    current = next((p for p in pods if p.name == status.pod and p.epoch == status.epoch), None)
    older = [p for p in pods if p is not current]

    if run.deleting:
        return _deleting(t, pods, purge)
    if api.RUN_FINALIZER not in run.finalizers:
        t.plan.add_run_finalizer = True

    # Pods no attempt owns any more: delete the live ones, release the ended ones.
    for pod in older:
        if pod.finished or (pod.deleting and pod.ending is not None):
            if pod.has_finalizer:
                t.plan.release_pods.append(pod.name)
                if pod.ending is not None and pod.ending.outcome == api.Outcome.FENCED:
                    t.event("Fenced", f"pod {pod.name} (epoch {pod.epoch}) stopped without writing: a newer "
                            f"attempt owns the run ({pod.ending.message})", warning=True)
            if not pod.deleting and not (status.phase and status.phase.finished and pod.name == status.pod):
                t.plan.delete_pods.append(pod.name)
        elif not pod.deleting:
            t.plan.delete_pods.append(pod.name)

    phase = status.phase
    if phase is None:
        _admit(t)
    elif phase == api.Phase.RUNNING:
        _running(t, current, create_failure)
    elif phase.finished:
        _finished(t)
    elif phase == api.Phase.PENDING and _finishing_abort(t):
        _start(t, older, stuck_seconds)  # the aborted attempt crashed: the next one finishes undoing its work
    elif _user_abort(t) or _limits_exceeded(t) or _abort_decided(t):
        pass
    elif spec.suspend:
        if phase != api.Phase.SUSPENDED:
            t.new.phase = api.Phase.SUSPENDED
            t.new.message = "suspended: spec.suspend is true"
            t.event("Suspended", "spec.suspend is true: no pod runs until it is false")
    elif phase == api.Phase.PENDING:
        _start(t, older, stuck_seconds)
    elif phase == api.Phase.BACKOFF:
        next_time = api.parse_time(status.nextAttemptTime)
        if next_time is None or now >= next_time:
            t.new.phase = api.Phase.PENDING
            t.new.nextAttemptTime = None
            t.new.message = "backoff over: starting the next attempt"
    elif phase == api.Phase.WAITING:
        _waiting(t)
    elif phase == api.Phase.SUSPENDED:
        t.new.phase = api.Phase.PENDING
        t.new.message = "resumed: spec.suspend is false"
        t.event("Resumed", "spec.suspend is false: resuming from the latest checkpoint")
    _family(t)
    return t.done()


def _admit(t: transition.Transition) -> None:
    t.new = api.DurableRunStatus(
        phase=api.Phase.PENDING, epoch=1, attempt=0,
        inputHash=api.input_hash(t.run.spec.input), startTime=api.format_time(t.now),
        message="admitted: starting the first attempt",
    )


def _start(t: transition.Transition, older: list[PodView], stuck_seconds: float) -> None:
    status = t.run.status
    if status.inputHash and status.inputHash != api.input_hash(t.run.spec.input):
        t.fence()
        t.finish(api.Phase.FAILED, "InputMismatch: spec.input changed after the first attempt "
                 f"(sha256 {api.input_hash(t.run.spec.input)[:12]} != {status.inputHash[:12]}). A run's input "
                 "is fixed: restore it, or create a new DurableRun for the new input")
        return
    # Every older pod must be gone (or presumed lost with its node) before the next one starts.
    blocking = [p for p in older if not p.finished and not (p.deleting and p.ending is not None)]
    if blocking:
        t.new.message = f"waiting for pod {blocking[0].name} to terminate before the next attempt"
        return
    epoch = status.epoch
    t.new.phase = api.Phase.RUNNING
    t.new.attempt = status.attempt + 1
    t.new.pod = builders.pod_name(t.run.name, epoch)
    t.new.lease = api.Lease()
    t.new.outcome = None
    t.new.waitingFor = None
    t.new.message = f"attempt {t.new.attempt} starting in pod {t.new.pod}"
    t.new.attemptStartTime = api.format_time(t.now)
    if t.new.startTime is None:
        t.new.startTime = api.format_time(t.now)
    t.plan.create_pod_epoch = epoch
    t.event("AttemptStarted", f"attempt {t.new.attempt} (epoch {epoch}) in pod {t.new.pod}")


def _running(t: transition.Transition, pod: PodView | None, create_failure: CreateFailure | None) -> None:
    status = t.run.status
    if pod is None:
        if status.lease.epoch == status.epoch:
            # It ran, and now it is gone without a trace: someone removed it.
            _ended(t, Ending(R.POD_DELETED, f"pod {status.pod} disappeared"), None)
        elif create_failure is not None and create_failure.epoch == status.epoch:
            _create_failed(t, create_failure)
        else:
            t.plan.create_pod_epoch = status.epoch  # its creation was interrupted: create it again
        return
    if pod.ending is not None:
        _ended(t, pod.ending, pod)
        return
    if (_user_abort(t, pod) or _limits_exceeded(t, pod)) and t.new.aborting is None:
        return  # finished Aborted; an attempt given time to end by itself still holds its lease
    validity = clocks.lease_validity(t.run)
    renewed = api.parse_time(status.lease.renewTime) if status.lease.epoch == status.epoch else None
    reference = renewed or pod.running_since
    if reference is not None and t.now - reference > validity:
        what = "renewed" if renewed else "acquired"
        t.guard["/status/lease"] = status.lease.model_dump(mode="json", exclude_none=True)
        t.event("LeaseExpired", f"pod {pod.name} has not {what} its lease for {api.format_duration(validity)} "
                f"(lease duration plus a {api.format_duration(clocks.CLOCK_SKEW_MARGIN)} clock-skew margin)",
                warning=True)
        _ended(t, Ending(R.LEASE_EXPIRED, f"lease expired: pod {pod.name} stopped renewing it (hung, paused "
                         "or partitioned)"), pod, delete=True)
        return
    if pod.waiting_reason in ("CreateContainerConfigError", "ErrImagePull", "ImagePullBackOff",
                              "CreateContainerError", "InvalidImageName"):
        message = f"pod {pod.name} cannot start: {pod.waiting_reason}: {pod.waiting_message or ''}".strip()
        if status.message != message:
            t.new.message = message
            t.event(pod.waiting_reason, message, warning=True)


def _create_failed(t: transition.Transition, failure: CreateFailure) -> None:
    """The attempt's pod could not be created: never a Running run without a pod."""
    message = f"FailedCreate: pod {t.run.status.pod} could not be created: {failure.message}"
    t.event("FailedCreate", message, warning=True)
    if failure.permanent:
        t.fence()
        t.finish(api.Phase.FAILED, f"{message}. Fix spec.template, then retry the run (kubectl durablerun retry "
                 f"{t.run.name})")
    else:  # a restart like a crash's: backoff, and bounded by maxRestarts
        _ended(t, Ending(R.CRASH, message), None)


def _ended(t: transition.Transition, ending: Ending, pod: PodView | None, delete: bool = False) -> None:
    """The current attempt is over: fence it, record why, and decide what comes next."""
    status, policy = t.run.status, t.run.spec.policy
    t.fence()
    t.new.lastPodEndTime = api.format_time(ending.finished_at or t.now)
    t.new.outcome = ending.outcome
    if pod is not None:
        if pod.has_finalizer:
            t.plan.release_pods.append(pod.name)
        keep = ending.outcome in (api.Outcome.COMPLETED, api.Outcome.FAILED, api.Outcome.USAGE_ERROR,
                                  api.Outcome.ABORTED)
        if (delete or not keep) and not pod.deleting:
            t.plan.delete_pods.append(pod.name)
    outcome = ending.outcome
    if outcome == api.Outcome.COMPLETED:
        t.finish(api.Phase.SUCCEEDED, ending.message)
    elif outcome in (api.Outcome.FAILED, api.Outcome.USAGE_ERROR):
        t.finish(api.Phase.FAILED, ending.message)
    elif outcome == api.Outcome.ABORTED:
        t.finish(api.Phase.ABORTED, ending.message, ending.abort_reason or api.AbortReason.BUDGET_EXHAUSTED)
    elif outcome == api.Outcome.WAITING:
        waiting = ending.waiting_for or {}
        t.new.phase = api.Phase.WAITING
        t.new.waitingFor = api.WaitingFor(
            event=waiting.get("event"), wakeTime=waiting.get("wakeTime"),
            since=waiting.get("since") or api.format_time(t.now), deadline=waiting.get("deadline"),
            holder=waiting.get("holder"), compensations=waiting.get("compensations") or None,
        )
        event = str(waiting.get("event") or "")
        t.new.message = (f"waiting for child run {t.run.name}-{event[len(api.CHILD_EVENT_PREFIX):]} to finish (no pod)"
                         if event.startswith(api.CHILD_EVENT_PREFIX) else ending.message)
        t.event("Waiting", t.new.message)
    elif outcome == api.Outcome.SUSPENDED:
        if t.run.spec.suspend:
            t.new.phase = api.Phase.SUSPENDED
            t.new.message = "suspended at a step boundary: spec.suspend is true"
            t.event("Suspended", t.new.message)
        else:
            t.new.phase = api.Phase.PENDING
            t.new.message = f"the runner stopped cleanly ({ending.message}); resuming"
    elif ending.disruption:
        t.new.disruptions = status.disruptions + 1
        t.plan.restart_reason = ending.reason
        if t.new.disruptions > policy.maxDisruptions:
            t.finish(api.Phase.ABORTED, f"{ending.message}; {t.new.disruptions} disruptions exceed "
                     f"policy.maxDisruptions={policy.maxDisruptions}", api.AbortReason.RETRY_LIMIT_EXCEEDED)
        else:
            t.new.phase = api.Phase.PENDING
            t.new.message = f"{ending.message}: restarting (disruption {t.new.disruptions} of " \
                            f"{policy.maxDisruptions}; does not count against maxRestarts)"
            t.event("Restarting", f"{ending.reason}: {t.new.message}", warning=True)
    else:  # a crash, an OOM kill, an expired lease, or an attempt fenced by a zombie write
        t.new.restarts = status.restarts + 1
        t.plan.restart_reason = ending.reason
        if t.new.restarts > policy.maxRestarts:
            t.finish(api.Phase.ABORTED, f"{ending.message}; {t.new.restarts} restarts exceed "
                     f"policy.maxRestarts={policy.maxRestarts}", api.AbortReason.RETRY_LIMIT_EXCEEDED)
        elif _finishing_abort(t):
            t.new.phase = api.Phase.PENDING
            t.new.message = f"{ending.message}: restarting at once to finish aborting (restart " \
                            f"{t.new.restarts} of {policy.maxRestarts})"
            t.event("Restarting", f"{ending.reason}: {t.new.message}", warning=True)
        else:
            delay = policy.backoff.delay(t.new.restarts)
            t.new.phase = api.Phase.BACKOFF
            t.new.nextAttemptTime = api.format_time(t.now + delay)
            t.new.message = f"{ending.message}: restart {t.new.restarts} of {policy.maxRestarts} in " \
                            f"{api.format_duration(delay)}"
            t.event("Restarting", f"{ending.reason}: {t.new.message}", warning=True)


def _user_abort(t: transition.Transition, pod: PodView | None = None) -> bool:
    reason = t.run.annotations.get(api.ANNOTATION_ABORT)
    if reason is None:
        return False
    _abort(t, api.AbortReason.USER_REQUESTED, f"aborted by request: {reason or 'no reason given'}", pod)
    return True


def _abort(t: transition.Transition, reason: api.AbortReason, message: str, pod: PodView | None) -> None:
    """Abort the run. A live attempt holding its lease first gets policy.abortGracePeriod to end Aborted by
    itself (its Sagas undo their work meanwhile); then, or at once for one that cannot, it is fenced."""
    status = t.run.status
    aborting = status.aborting
    grace = api.parse_duration(t.run.spec.policy.abortGracePeriod)
    if aborting is None and grace > timedelta(0) and reason != api.AbortReason.PROGRESS_TIMEOUT:
        deadline = api.format_time(t.now + grace)
        if _holds_its_lease(t, pod):
            t.new.aborting = api.Aborting(reason=reason, message=message, deadline=deadline)
            t.new.message = (f"aborting: {message}; the runner stops at its next operation and undoes its work "
                             f"(Sagas) until {deadline} (policy.abortGracePeriod)")
            t.event("Aborting", t.new.message)
            return
        if _undo_the_wait(t, api.Aborting(reason=reason, message=message, deadline=deadline)):
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
    if pod is not None and not pod.deleting:
        t.plan.delete_pods.append(pod.name)
    t.finish(api.Phase.ABORTED, message, reason)


def _undo_the_wait(t: transition.Transition, aborting: api.Aborting) -> bool:
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


def _abort_decided(t: transition.Transition) -> bool:
    """An abort given to the runner whose attempt is over: it ends the run now (no pod, no more time)."""
    aborting = t.run.status.aborting
    if aborting is None:
        return False
    _abort(t, aborting.reason, aborting.message, None)
    return True


def _finishing_abort(t: transition.Transition) -> bool:
    """An abort the runner was given time to carry out, still within it."""
    return t.new.aborting is not None and _within_grace(t, t.new.aborting)


def _within_grace(t: transition.Transition, aborting: api.Aborting) -> bool:
    return t.now < (api.parse_time(aborting.deadline) or t.now)


def _holds_its_lease(t: transition.Transition, pod: PodView | None) -> bool:
    """Whether the attempt's runner is up and can carry an abort out (one not started yet has done nothing)."""
    status = t.run.status
    return (pod is not None and not pod.deleting and status.lease.epoch == status.epoch
            and status.lease.renewTime is not None)


def _limits_exceeded(t: transition.Transition, pod: PodView | None = None) -> bool:
    """maxDuration and progressTimeout hold even when the runner is hung."""
    status, policy = t.run.status, t.run.spec.policy
    if clocks.active_time(status, t.now) > api.parse_duration(policy.maxDuration):
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
        timeout = api.parse_duration(policy.progressTimeout)
        if reference is not None and t.now - reference > timeout:
            t.guard["/status/progress"] = status.progress.model_dump(mode="json", exclude_none=True)
            _abort(t, api.AbortReason.PROGRESS_TIMEOUT,
                   f"no step completed for policy.progressTimeout={policy.progressTimeout}", pod)
            return True
    return False


def _waiting(t: transition.Transition) -> None:
    waiting = t.run.status.waitingFor or api.WaitingFor()
    if waiting.event and waiting.event in t.run.spec.events:
        t.new.phase = api.Phase.PENDING
        t.new.message = f"event {waiting.event!r} arrived: resuming"
        t.event("EventReceived", t.new.message)
        return
    for moment, why in ((waiting.wakeTime, "wake time reached"), (waiting.deadline, "wait deadline passed")):
        when = api.parse_time(moment)
        if when is not None and t.now >= when:
            t.new.phase = api.Phase.PENDING
            t.new.message = f"{why}: resuming"
            t.event("Resumed", t.new.message)
            return


def _finished(t: transition.Transition) -> None:
    status, spec = t.run.status, t.run.spec
    if retry_requested(t.run):
        _retry(t)
        return
    policy_changed = (status.observedGeneration or 0) < t.run.generation
    if status.phase == api.Phase.ABORTED and policy_changed and _abort_lifted(t):
        t.new.phase = api.Phase.PENDING
        t.new.abortReason = None
        t.new.completionTime = None
        t.new.message = f"policy raised past {status.abortReason}: resuming from the latest checkpoint"
        t.event("Resumed", t.new.message)
        return
    if spec.ttlSecondsAfterFinished is not None:
        completed = api.parse_time(status.completionTime)
        if completed is not None and t.now >= completed + timedelta(seconds=spec.ttlSecondsAfterFinished):
            t.plan.delete_run = True


def _retry(t: transition.Transition) -> None:
    """Start the run again from its journal: completed steps replay, failed ones run again."""
    status, value = t.run.status, t.run.annotations[api.ANNOTATION_RETRY]
    t.new.retry = value
    if api.ANNOTATION_ABORT in t.run.annotations:
        t.event("RetryRefused", f"{api.ANNOTATION_RETRY}={value!r} ignored: the run still carries "
                f"{api.ANNOTATION_ABORT}. Remove it with the retry: kubectl annotate dr {t.run.name} "
                f"{api.ANNOTATION_ABORT}- {api.ANNOTATION_RETRY}=<a new value>", warning=True)
        return
    t.new.phase = api.Phase.PENDING
    t.new.abortReason = None
    t.new.outcome = None
    t.new.completionTime = None
    # A fresh restart budget, so a RetryLimitExceeded run can run again; the journal's counters (cost,
    # tokens, steps) and the active time carry over, so every other budget still holds.
    t.new.restarts = 0
    t.new.disruptions = 0
    # To the microsecond: the runner compares it with when each failure was journaled, maybe the same second.
    t.new.retryTime = api.format_time(t.now, precise=True)
    t.new.message = (f"retry {value!r} of the {status.phase} run: a new attempt replays the journal; completed "
                     "steps are not executed again, failed ones are")
    t.event("Retrying", t.new.message)


def _abort_lifted(t: transition.Transition) -> bool:
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
        return clocks.active_time(status, t.now) < api.parse_duration(policy.maxDuration)
    if reason == api.AbortReason.RETRY_LIMIT_EXCEEDED:
        return status.restarts <= policy.maxRestarts and status.disruptions <= policy.maxDisruptions
    return reason == api.AbortReason.PROGRESS_TIMEOUT


def _deleting(t: transition.Transition, pods: list[PodView], purge: PodView | None) -> transition.Plan:
    """The DurableRun is being deleted: stop its pods, apply the retention policy, then let it go."""
    if t.run.raw_status is not None and t.run.status.phase and not t.run.status.phase.finished \
            and t.run.status.lease.epoch == t.run.status.epoch:
        t.fence()  # the runner stops at its next renewal
    for pod in pods:
        if not pod.deleting and not pod.finished:
            t.plan.delete_pods.append(pod.name)
        if pod.has_finalizer and (pod.finished or pod.deleting):
            t.plan.release_pods.append(pod.name)
    settled = all(p.finished or (p.deleting and p.ending is not None) for p in pods)
    if not settled or api.RUN_FINALIZER not in t.run.finalizers:
        return t.done()
    if t.run.spec.checkpoint.retention == "Delete" and t.run.raw_status is not None:
        if purge is None:
            t.plan.create_purge_pod = True
            t.event("DeletingJournal", f"retention Delete: deleting the journal under {t.run.spec.checkpoint.uri}")
            return t.done()
        if purge.ending is None:
            return t.done()  # still deleting
        if purge.has_finalizer:
            t.plan.release_pods.append(purge.name)
        if purge.ending.outcome == api.Outcome.COMPLETED:
            t.event("JournalDeleted", purge.ending.message)
        else:
            t.event("JournalKept", f"the journal could not be deleted and is kept: {purge.ending.message}",
                    warning=True)
    t.plan.remove_run_finalizer = True
    return t.done()


# --- child runs and signals ----------------------------------------------------------------


def related_names(run: RunView) -> set[str]:
    """The runs ``decide`` needs to see besides this one: its requested children, its pending signals' targets."""
    names = set()
    for child in run.status.childRequests:
        with contextlib.suppress(ValueError):  # refused by decide, naming why
            names.add(api.child_run_name(run.name, child))
    names.update(r.run for key, r in run.status.signalRequests.items() if key not in run.status.signals)
    return names


def owner_uid(run: RunView) -> str | None:
    for ref in run.body["metadata"].get("ownerReferences") or []:
        if ref.get("kind") == api.KIND and ref.get("controller"):
            return str(ref.get("uid"))
    return None


def _children(run: RunView, related: Mapping[str, RunView | None]) -> dict[str, RunView]:
    """This run's children that exist, by child name (the name its workflow gave)."""
    out = {}
    for child in run.status.childRequests:
        try:
            found = related.get(api.child_run_name(run.name, child))
        except ValueError:
            continue
        if found is not None and owner_uid(found) == run.uid:
            out[child] = found
    return out


def _children_total(children: Mapping[str, RunView]) -> api.ChildrenTotal | None:
    if not children:
        return None
    usd, tokens, finished = Decimal(0), 0, 0
    for child in children.values():
        grand = child.status.childrenTotal
        with contextlib.suppress(InvalidOperation):
            usd += Decimal(child.status.cost.usd) + (Decimal(grand.usd) if grand else 0)
        tokens += child.status.cost.tokens + (grand.tokens if grand else 0)
        finished += bool(child.status.phase and child.status.phase.finished)
    return api.ChildrenTotal(runs=len(children), finished=finished, summary=f"{finished}/{len(children)}",
                             usd=f"{usd:f}", tokens=tokens)


def child_outcome(child: RunView) -> dict[str, Any]:
    """What a finished child's parent receives as event ``api.child_event(<child>)``."""
    status = child.status
    assert status.phase is not None
    out: dict[str, Any] = {"phase": status.phase.value, "run": child.name, "uid": child.uid,
                           "cost": status.cost.model_dump(mode="json")}
    if status.phase == api.Phase.SUCCEEDED:
        if status.result is not None and status.result.inline is not None:
            out["result"] = json.loads(status.result.inline)  # a bigger one: the parent reads the child's journal
    else:
        out["message"] = status.message or status.phase.value
        if status.abortReason is not None:
            out["abortReason"] = status.abortReason.value
    return out


def _family(t: transition.Transition) -> None:
    """Create requested children, report their outcomes, pass suspension and endings on, deliver signals."""
    run, status, new = t.run, t.run.status, t.new
    phase = new.phase or status.phase
    ended = bool(phase and phase.finished)
    for child, request in status.childRequests.items():
        event = api.child_event(child)
        found = t.children.get(child)
        if found is None:
            _missing_child(t, child, request, ended)
            continue
        state = api.ChildState(run=found.name, uid=found.uid, phase=found.status.phase)
        if status.children.get(child) != state:
            new.children = {**new.children, child: state}
        active = not (found.status.phase and found.status.phase.finished)
        by_parent = api.ANNOTATION_ABORTED_BY_PARENT in found.annotations
        if not active and not by_parent and not ended and event not in run.spec.events:
            outcome = child_outcome(found)
            t.plan.add_events[event] = outcome
            t.event("ChildSucceeded" if outcome["phase"] == api.Phase.SUCCEEDED else "ChildFailed",
                    f"child run {found.name} {outcome['phase']}" + (f": {outcome['message']}" if "message" in outcome
                                                                   else ""),
                    warning=outcome["phase"] != api.Phase.SUCCEEDED)
        _propagate(t, found, active, ended)
    if t.children_total != status.childrenTotal:
        new.childrenTotal = t.children_total
    _signals(t)


def _missing_child(t: transition.Transition, child: str, request: api.ChildRequest, ended: bool) -> None:
    run = t.run
    event = api.child_event(child)
    if ended or event in run.spec.events:
        return
    try:
        name = api.child_run_name(run.name, child)
        manifest = builders.child_run(run.body, child, request)
    except ValueError as error:
        t.plan.add_events[event] = {"phase": api.Phase.FAILED.value, "run": f"{run.name}-{child}", "uid": "",
                                    "message": f"refused: {error}"}
        t.event("ChildRefused", f"child {child!r} not created: {error}", warning=True)
        return
    known = run.status.children.get(child)
    other = t.related.get(name)
    if known is not None:
        # Created once and gone (deleted by someone): never started again, its parent hears it failed.
        t.plan.add_events[event] = {"phase": api.Phase.FAILED.value, "run": name, "uid": known.uid,
                                    "message": f"child run {name} was deleted before it finished"}
        t.event("ChildFailed", f"child run {name} was deleted before it finished", warning=True)
    elif other is not None:
        t.plan.add_events[event] = {"phase": api.Phase.FAILED.value, "run": name, "uid": other.uid,
                                    "message": f"a DurableRun {name} exists that is not a child of {run.name}"}
        t.event("ChildRefused", f"child {child!r} not created: DurableRun {name} exists and is not this "
                "run's child", warning=True)
    else:
        t.plan.create_runs.append(manifest)
        t.event("ChildStarted", f"child run {name} ({request.workflow})")


def _propagate(t: transition.Transition, child: RunView, active: bool, ended: bool) -> None:
    """A suspended parent suspends its running children; an ended one aborts them; both are lifted with it.

    Each patch carries the child's resourceVersion: had the child changed since it was read (it just
    finished, say), the patch is refused and the decision made again on what it is now.
    """
    annotations, name = child.annotations, child.name

    def patch(marks: dict[str, str | None], spec: dict[str, Any] | None = None) -> None:
        meta = {"resourceVersion": child.body["metadata"].get("resourceVersion"), "annotations": marks}
        t.plan.patch_runs.append((name, {"metadata": meta, **({"spec": spec} if spec else {})}))

    if t.run.spec.suspend and active and not child.spec.suspend:
        patch({api.ANNOTATION_SUSPENDED_BY_PARENT: "true"}, {"suspend": True})
    elif not t.run.spec.suspend and api.ANNOTATION_SUSPENDED_BY_PARENT in annotations:
        patch({api.ANNOTATION_SUSPENDED_BY_PARENT: None}, {"suspend": False})
    if ended and active and api.ANNOTATION_ABORT not in annotations:
        phase = (t.new.phase or t.run.status.phase or api.Phase.ABORTED).value
        patch({api.ANNOTATION_ABORT: f"its parent {t.run.name} {phase}", api.ANNOTATION_ABORTED_BY_PARENT: t.run.name})
        t.event("ChildAborted", f"child run {name} aborted: this run {phase}")
    elif not ended and api.ANNOTATION_ABORTED_BY_PARENT in annotations:
        lift: dict[str, str | None] = {api.ANNOTATION_ABORT: None, api.ANNOTATION_ABORTED_BY_PARENT: None}
        if child.status.phase == api.Phase.ABORTED:
            lift[api.ANNOTATION_RETRY] = f"parent-{api.format_time(t.now, precise=True)}"
        patch(lift)
        t.event("ChildResumed", f"child run {name} resumes with this run")


def _signals(t: transition.Transition) -> None:
    status = t.run.status
    for key, request in status.signalRequests.items():
        if key in status.signals:
            continue
        target = t.related.get(request.run)
        if target is None or target.deleting:
            state = api.SignalState(state="NotFound", message=f"no DurableRun {request.run} in {t.run.namespace}")
            t.event("SignalNotDelivered", f"event {request.event!r} for {request.run}: {state.message}", warning=True)
        elif request.event not in target.spec.events:
            t.plan.patch_runs.append((request.run, {"spec": {"events": {request.event: json.loads(request.value)}}}))
            continue  # recorded once the target holds it
        elif target.spec.events[request.event] == json.loads(request.value):
            state = api.SignalState(state="Delivered")
            t.event("SignalDelivered", f"event {request.event!r} delivered to {request.run}")
        else:
            state = api.SignalState(state="Ignored", message=f"{request.run} already had another value for "
                                    f"event {request.event!r}: the first value wins")
            t.event("SignalIgnored", f"event {request.event!r} for {request.run}: {state.message}")
        t.new.signals = {**t.new.signals, key: state}
