"""The attempt lifecycle: admit a run, start an attempt, watch it run, see it end, restart or finish.

One function per phase of the run (``decide`` picks it): ``start`` creates
the next attempt's pod once every older one is gone, ``running`` watches the
current one (its lease, its pod), ``ended`` fences it and decides what comes
next from how it ended (a result, a wait, a crash counted against
maxRestarts, a disruption against maxDisruptions), ``waiting`` resumes a run
whose event or time came, ``finished`` handles retries, a raised limit and the
TTL, and ``deleting`` stops the pods and applies the journal's retention.
"""

from __future__ import annotations

from dataclasses import replace
from datetime import datetime, timedelta

from durablerun import api, relations, resource
from durablerun_operator import builders, kueue
from durablerun_operator.decide import aborts, clocks, facts, transition


def admit(t: transition.Transition) -> None:
    t.new = resource.DurableRunStatus(
        phase=api.Phase.PENDING, epoch=1, attempt=0,
        inputHash=api.input_hash(t.run.spec.input), startTime=api.format_time(t.now),
        message="admitted: starting the first attempt", traceID=trace_id(t.run),
    )


def trace_id(run: facts.RunView) -> str:
    """The run's trace id: the one its runners derive from the journal they write (api.run_key)."""
    return api.trace_id(api.run_key(run.namespace, run.name, run.uid, run.spec.checkpoint.runId))


def start(t: transition.Transition, older: list[facts.PodView], stuck_seconds: float) -> None:
    status = t.new  # the run's, or a new run's as admit just wrote it
    if status.inputHash and status.inputHash != api.input_hash(t.run.spec.input):
        t.fence()
        t.finish(api.Phase.FAILED, "InputMismatch: spec.input changed after the first attempt "
                 f"(sha256 {api.input_hash(t.run.spec.input)[:12]} != {status.inputHash[:12]}). A run's input "
                 "is fixed: restore it, or create a new DurableRun for the new input", reason="InputMismatch")
        return
    # Every older pod must be gone (or presumed lost with its node) before the next one starts.
    blocking = [p for p in older if not p.finished and not (p.deleting and p.ending is not None)]
    if blocking:
        t.new.message = f"waiting for pod {blocking[0].name} to terminate before the next attempt"
        return
    check = t.new.upgradeCheck
    if check is not None and check.state == api.UpgradeState.CHECKING:  # the next attempt runs what it decides
        t.new.message = f"waiting for the check of {check.image} (an upgrade) to end before the next attempt"
        return
    if t.queueing is not None and not _admitted(t, t.queueing):
        return
    epoch = status.epoch
    t.new.phase = api.Phase.RUNNING
    t.new.attempt = status.attempt + 1
    t.new.pod = builders.pod_name(t.run.name, epoch)
    t.new.lease = resource.Lease()
    t.new.outcome = None
    t.new.waitingFor = None
    t.new.progress.inFlight = None  # the last attempt's: this one reports its own
    t.new.message = f"attempt {t.new.attempt} starting in pod {t.new.pod}"
    t.new.attemptStartTime = api.format_time(t.now)
    if t.new.startTime is None:
        t.new.startTime = api.format_time(t.now)
    if t.new.traceID is None:  # admitted by an operator that did not record it yet
        t.new.traceID = trace_id(t.run)
    t.plan.create_pod_epoch = epoch
    t.event("AttemptStarted", f"attempt {t.new.attempt} (epoch {epoch}) in pod {t.new.pod}")


def pin(t: transition.Transition, pod: facts.PodView | None) -> None:
    """Pin the run to the image digest its attempt ran (once): builders.runner_pod runs the pin."""
    status = t.run.status
    if status.pin is None and pod is not None and pod.digest is not None:
        t.new.pin = resource.ImagePin(image=pod.digest, since=api.format_time(t.now))
        t.event("Pinned", f"the run is pinned to {pod.digest}, the runner image its attempt {status.attempt} ran "
                f"(for {pod.image}): every later attempt runs it")


#: How long an upgrade's check pod may take (to be scheduled, pull its image and replay the journal).
CHECK_TIMEOUT = timedelta(minutes=10)
_IMAGE_MISSING = ("ErrImagePull", "ImagePullBackOff", "ErrImageNeverPull")
#: The image cannot be had: past the start timeout the run Fails (ImagePullFailed). A pod that cannot start for
#: another reason (a Secret or ConfigMap it names is missing) waits for it, however long (docs/bad-input.md).
_PULL_FAILED = (*_IMAGE_MISSING, "InvalidImageName")
_CANNOT_START = (*_PULL_FAILED, "CreateContainerConfigError", "CreateContainerError")
#: How long an attempt's pod may fail to get its image before the run Fails: the operator's
#: DURABLERUN_START_TIMEOUT_SECONDS (config.Settings.start_timeout_seconds), this by default.
START_TIMEOUT = timedelta(minutes=10)


def upgrade(t: transition.Transition, check_pod: facts.PodView | None,
            create_failure: facts.CreateFailure | None = None) -> None:
    """Move the pin where a durablerun.dev/upgrade annotation asks, only once the operator's own check showed the
    image replays the run's journal: a one-off pod of that image replays it (builders.check_pod), whoever wrote
    the annotation and whatever it claims (docs/operator.md#upgrading-code-under-running-runs)."""
    status = t.run.status
    check = status.upgradeCheck
    if check is not None and check.state == api.UpgradeState.CHECKING:
        _checking(t, check, check_pod, create_failure)
        return
    if not facts.upgrade_requested(t.run):
        return  # an upgrade waits for the first pin: until then the next attempt runs the template's image
    value = t.run.annotations[api.ANNOTATION_UPGRADE]
    request = facts.upgrade_request(value)
    if isinstance(request, str):
        _refuse(t, resource.UpgradeCheck(request=value, image="", by="", state=api.UpgradeState.REFUSED),
                f"{api.ANNOTATION_UPGRADE} ignored: {request}. Use kubectl durablerun upgrade {t.run.name} --image "
                "IMAGE")
        return
    asked = resource.UpgradeCheck(request=value, image=request.image, by=request.by, dryRun=request.dry_run,
                                  state=api.UpgradeState.CHECKING, startTime=api.format_time(t.now))
    if status.phase == api.Phase.RUNNING:
        _refuse(t, asked, f"{t.run.name} is Running: its attempt is adding to the journal, which the check would "
                f"not cover. Suspend it first (kubectl durablerun suspend {t.run.name}), then upgrade it")
        return
    t.new.upgradeCheck = asked
    t.plan.create_check_pod = True
    t.event("UpgradeChecking", f"{request.by} asked to {'check' if request.dry_run else 'move the run to'} "
            f"{request.image}: pod {builders.check_pod_name(t.run.name, value)} replays its journal with it first")


def _checking(t: transition.Transition, check: resource.UpgradeCheck, pod: facts.PodView | None,
              create_failure: facts.CreateFailure | None) -> None:
    """The check pod ran, or cannot, or is still at it."""
    name = builders.check_pod_name(t.run.name, check.request)
    began = api.parse_time(check.startTime) or t.now
    if pod is None:
        if create_failure is not None and create_failure.pod == name and create_failure.permanent:
            _refuse(t, check, f"check pod {name} cannot be created: {create_failure.message}")
        elif t.now - began > CHECK_TIMEOUT:
            _refuse(t, check, f"check pod {name} could not be created in {api.format_duration(CHECK_TIMEOUT)}")
        else:
            t.plan.create_check_pod = True  # its creation was interrupted (a no-op if it exists after all)
        return
    if pod.waiting_reason in _CANNOT_START:
        _refuse(t, check, f"{check.image} cannot start: {pod.waiting_reason}: {pod.waiting_message or ''}".strip(),
                pod)
    elif pod.exit_code is not None:
        verdict = _last_line(pod.exit_message)
        if pod.exit_code != 0:
            what = "" if pod.exit_code in (1, 3) else f"the replayer exited {pod.exit_code}: "
            _refuse(t, check, f"{check.image} does not replay the journal: {what}{verdict}", pod)
        elif pod.digest is None:
            _refuse(t, check, f"{check.image} replays the journal, but the node reported no digest for it (a node "
                    "that runs no images): the run cannot be pinned to it", pod)
        else:
            _replays(t, check, pod, pod.digest, verdict)
    elif pod.ending is not None or t.now - began > CHECK_TIMEOUT:
        _refuse(t, check, f"check pod {name} did not finish in {api.format_duration(CHECK_TIMEOUT)}"
                if pod.ending is None else f"check pod {name} ended without a verdict: {pod.ending.message}", pod)


def _replays(t: transition.Transition, check: resource.UpgradeCheck, pod: facts.PodView, digest: str,
             verdict: str) -> None:
    status = t.run.status
    assert status.pin is not None
    assert t.new.pin is not None
    t.new.upgradeCheck = check.model_copy(update={
        "state": api.UpgradeState.REPLAYS, "digest": digest, "message": verdict,
        "finishTime": api.format_time(t.now)})
    t.plan.delete_pods.append(pod.name)
    checked = f"{check.image} ({digest}) replayed the journal cleanly in pod {pod.name}: {verdict}"
    if check.dryRun or digest == status.pin.image:
        t.new.pin.request = check.request
        t.event("UpgradeChecked", f"{check.by} asked for a check only: {checked}" if check.dryRun
                else f"{checked}; the run already runs it")
        return
    t.new.pin = resource.ImagePin(image=digest, since=api.format_time(t.now), by=check.by,
                                  previous=status.pin.image, request=check.request)
    t.plan.upgraded = True
    t.event("Upgraded", f"{check.by} moved the run from {status.pin.image} to {digest}: {checked}. The next attempt "
            "runs it")


def _refuse(t: transition.Transition, check: resource.UpgradeCheck, why: str, pod: facts.PodView | None = None) -> None:
    """The pin stays; the request is answered (each value is acted on once), in the status and an Event."""
    t.new.upgradeCheck = check.model_copy(update={
        "state": api.UpgradeState.REFUSED, "message": why[:2048], "finishTime": api.format_time(t.now)})
    if pod is not None and not pod.deleting:
        t.plan.delete_pods.append(pod.name)
    asker = f"{check.by} asked for {check.image}: " if check.by else ""
    stays = t.run.status.pin.image if t.run.status.pin else "its image"
    t.event("UpgradeRefused", f"{asker}{why}; the run stays on {stays}", warning=True)


def _last_line(message: str) -> str:
    """The replayer's verdict: the last line it printed (the kubelet keeps its log's tail as the message)."""
    lines = [line.strip() for line in message.strip().splitlines() if line.strip()]
    return lines[-1][:1024] if lines else "no verdict printed"


def _admitted(t: transition.Transition, queueing: kueue.Queueing) -> bool:
    """Kueue's gate before an attempt starts: True once its Workload is admitted; until then the run is Queued
    and its Workload is created (or a stale one, evicted or finished, deleted first)."""
    workload = queueing.workload
    if workload is not None and workload.deleting:
        return False  # its deletion wakes the run, which then queues a new one
    if workload is not None and not workload.usable:
        t.plan.delete_workload = workload.name  # it cannot admit this attempt: queue a new one once it is gone
        return False
    if workload is not None and workload.admitted:
        t.plan.flavors = workload.flavors
        return True
    missing = queueing.missing_priority_class if workload is None else None
    if workload is None and missing is None:
        t.plan.create_workload = True
    message = f"queued in LocalQueue {queueing.queue}: waiting for Kueue to admit the attempt"
    if workload is not None and workload.pending:
        message += f": {workload.pending}"
    if missing is not None:
        message = (f"queued in LocalQueue {queueing.queue}, but no Kueue Workload can be created: "
                   f"WorkloadPriorityClass {missing!r} (its {api.LABEL_PRIORITY_CLASS} label) does not exist")
    if t.run.status.phase != api.Phase.QUEUED:
        t.new.phase = api.Phase.QUEUED
        t.event(api.Phase.QUEUED.value, f"queued in LocalQueue {queueing.queue}: no pod until Kueue admits it")
    if t.run.status.message != message:
        t.new.message = message
        if workload is not None and workload.inadmissible:
            t.event("Inadmissible", f"{message}. Kueue cannot admit it as it stands: create the missing queue, fix "
                    f"the run's {api.LABEL_QUEUE_NAME} label, or ask for resources a flavor has", warning=True)
        if missing is not None:
            t.event("PriorityClassNotFound", f"{message}. Create the WorkloadPriorityClass (kubectl get "
                    "workloadpriorityclasses lists those there are), or fix or remove the run's label; the run is "
                    "queued as soon as either is done", warning=True)
    return False


def release_workload(t: transition.Transition) -> None:
    """A run that needs no pod now (waiting, in backoff, suspended, finished) holds no quota: delete its Workload."""
    workload = t.queueing.workload if t.queueing is not None else None
    if workload is None or workload.deleting or t.plan.delete_workload or t.plan.create_workload:
        return
    if t.new.phase not in (api.Phase.QUEUED, api.Phase.RUNNING) or t.run.deleting:
        t.plan.delete_workload = workload.name


def _eviction(t: transition.Transition) -> str | None:
    """Why Kueue took the attempt's quota back (preempted, its queue stopped, its Workload deleted), or None."""
    if t.queueing is None:
        return None
    workload = t.queueing.workload
    if workload is not None and workload.evicted:
        return f"Kueue evicted its Workload ({workload.evicted})"
    if workload is None or workload.deleting:
        return "its Kueue Workload was deleted"
    return None


def _evicted(t: transition.Transition, pod: facts.PodView) -> bool:
    """Kueue took the attempt's quota back: stop it as a disruption, and queue the run again.

    As a suspended run stops: a runner holding its lease is asked to stop at its next step boundary (its pod
    deleted with its own grace period, which holds policy.stopGracePeriod), so the steps in flight can finish
    and be journaled; it is fenced once it has ended (``running`` counts that ending as the preemption). One
    that cannot (not started, or a stop grace of 0s) is fenced and stopped at once.
    """
    why = _eviction(t)
    if why is None:
        return False
    if pod.deleting and pod.deleted_by_operator:
        return True  # stopping within its grace: its ending decides
    grace = t.run.spec.policy.stop_grace(pod.grace_seconds)
    if aborts.holds_its_lease(t, pod) and grace > timedelta(0):
        t.plan.delete_pods.append(pod.name)
        t.new.message = (f"stopping attempt {t.run.status.attempt}: {why}; the runner lets its steps in flight "
                         f"finish within {api.format_duration(grace)} (policy.stopGracePeriod) and stops at its "
                         "next step boundary, then the run is queued again")
        t.event(api.RestartReason.PREEMPTED.value, t.new.message, warning=True)
        return True
    t.event(api.RestartReason.PREEMPTED.value, f"attempt {t.run.status.attempt} in pod {pod.name} stopped: {why}",
            warning=True)
    _ended(t, facts.Ending(api.RestartReason.PREEMPTED, f"pod {pod.name} was preempted: {why}"), pod, delete=True)
    return True


def _preempted(t: transition.Transition, ending: facts.Ending, pod: facts.PodView) -> facts.Ending:
    """An attempt that ended while its Workload was evicted: stopped (or killed) for the eviction, it is the
    preemption, a disruption; one that completed, failed or began to wait first ended by itself."""
    why = _eviction(t)
    if why is None or ending.outcome not in (None, api.Outcome.SUSPENDED, api.Outcome.FENCED) or ending.disruption:
        return ending
    return facts.Ending(api.RestartReason.PREEMPTED, f"pod {pod.name} was preempted: {why}",
                        finished_at=ending.finished_at)


def running(t: transition.Transition, pod: facts.PodView | None, create_failure: facts.CreateFailure | None,
            start_timeout: timedelta = START_TIMEOUT) -> None:
    status = t.run.status
    if pod is None:
        if status.lease.epoch == status.epoch:
            # It ran, and now it is gone without a trace: someone removed it.
            _ended(t, facts.Ending(api.RestartReason.POD_DELETED, f"pod {status.pod} disappeared"), None)
        elif create_failure is not None and create_failure.pod == status.pod:
            _create_failed(t, create_failure)
        else:
            t.plan.create_pod_epoch = status.epoch  # its creation was interrupted: create it again
        return
    if pod.ending is not None:
        _ended(t, _preempted(t, pod.ending, pod), pod)
        return
    if _evicted(t, pod):
        return
    if (aborts.user_abort(t, pod) or aborts.limits_exceeded(t, pod)) and t.new.aborting is None:
        return  # finished Aborted; an attempt given time to end by itself still holds its lease
    validity = clocks.lease_validity(t.run)
    renewed = api.parse_time(status.lease.renewTime) if status.lease.epoch == status.epoch else None
    reference = renewed or pod.running_since
    if reference is not None and t.now - reference > validity:
        if pod.disruption is not None:
            # Someone is removing the pod (the taint manager from a NotReady node, an eviction): its runner
            # cannot renew (a deleted pod's token is refused), and the removal is what ended the attempt.
            _ended(t, facts.Ending(pod.disruption, f"pod {pod.name} was being removed ({pod.disruption.value}) "
                                   "and stopped renewing its lease"), pod, delete=True)
            return
        what = "renewed" if renewed else "acquired"
        t.guard["/status/lease"] = status.lease.model_dump(mode="json", exclude_none=True)
        t.event("LeaseExpired", f"pod {pod.name} has not {what} its lease for {api.format_duration(validity)} "
                f"(lease duration plus a {api.format_duration(clocks.CLOCK_SKEW_MARGIN)} clock-skew margin)",
                warning=True)
        _ended(t, facts.Ending(api.RestartReason.LEASE_EXPIRED, f"lease expired: pod {pod.name} stopped renewing "
                               "it (hung, paused or partitioned)"), pod, delete=True)
        return
    pinned = status.pin.image if status.pin else None
    if pinned is not None and pod.image == pinned and pod.waiting_reason in _IMAGE_MISSING:
        # The code that wrote the journal is gone from the node (collected, or the node is new): running another
        # image silently is what pinning prevents, so the run stops until a user moves it deliberately.
        t.fence()
        t.plan.delete_pods.append(pod.name)
        t.finish(api.Phase.FAILED, f"PinnedImageMissing: the run is pinned to {pinned}, which pod {pod.name} "
                 f"cannot get ({pod.waiting_reason}: {pod.waiting_message or 'no message'}). Put that image back "
                 f"on the node and retry (kubectl durablerun retry {t.run.name}), or move the run to code that "
                 f"replays its journal: kubectl durablerun upgrade {t.run.name} --image IMAGE, then retry it",
                 reason="PinnedImageMissing")
        return
    if pod.waiting_reason in _CANNOT_START:
        if _start_timed_out(t, pod, start_timeout):
            return
        t.new.reason = pod.waiting_reason  # kubectl get -o wide's Reason, and the conditions' reason
        message = f"pod {pod.name} cannot start: {pod.waiting_reason}: {pod.waiting_message or ''}".strip()
        if status.message != message:
            t.new.message = message
            t.event(pod.waiting_reason, message, warning=True)
    elif pod.running_since is not None:
        t.new.reason = None  # it started after all


def start_deadline(run: facts.RunView, pod: facts.PodView | None, start_timeout: timedelta) -> datetime | None:
    """When the current attempt fails for an image its pod cannot get (None: its pod is not failing to pull)."""
    began = api.parse_time(run.status.attemptStartTime)
    if pod is None or began is None or pod.running_since is not None or pod.waiting_reason not in _PULL_FAILED:
        return None
    return began + start_timeout


def _start_timed_out(t: transition.Transition, pod: facts.PodView, start_timeout: timedelta) -> bool:
    """The attempt's pod has not got its image within the start timeout: the run Fails, naming the image."""
    deadline = start_deadline(t.run, pod, start_timeout)
    if deadline is None or t.now < deadline:
        return False
    t.fence()
    if not pod.deleting:
        t.plan.delete_pods.append(pod.name)
    t.finish(api.Phase.FAILED, f"ImagePullFailed: pod {pod.name} could not get its image {pod.image or '(none)'} in "
             f"{api.format_duration(start_timeout)} ({pod.waiting_reason}: {pod.waiting_message or 'no message'}). "
             f"Fix the image in spec.template (its name, or the registry's credentials in imagePullSecrets), then "
             f"retry the run (kubectl durablerun retry {t.run.name})", reason="ImagePullFailed")
    return True


def _create_failed(t: transition.Transition, failure: facts.CreateFailure) -> None:
    """The attempt's pod could not be created: never a Running run without a pod."""
    message = f"FailedCreate: pod {t.run.status.pod} could not be created: {failure.message}"
    t.event("FailedCreate", message, warning=True)
    if failure.permanent:
        t.fence()
        t.finish(api.Phase.FAILED, f"{message}. Fix spec.template, then retry the run (kubectl durablerun retry "
                 f"{t.run.name})", reason="FailedCreate")
    else:  # a restart like a crash's: backoff, and bounded by maxRestarts
        _ended(t, facts.Ending(api.RestartReason.CRASH, message), None)


def _ended(t: transition.Transition, ending: facts.Ending, pod: facts.PodView | None, delete: bool = False) -> None:
    """The current attempt is over: fence it, record why, and decide what comes next."""
    status, policy = t.run.status, t.run.spec.policy
    t.fence()
    t.new.lastPodEndTime = api.format_time(ending.finished_at or t.now)
    t.new.outcome = ending.outcome
    if pod is not None:
        if pod.has_finalizer:
            t.plan.release_pods.append(pod.name)
        keep = ending.outcome is not None and ending.outcome.final_phase is not None  # the run's last pod
        if (delete or not keep) and not pod.deleting:
            t.plan.delete_pods.append(pod.name)
    outcome = ending.outcome
    ran = pod is not None or status.lease.epoch == status.epoch
    if ran and (outcome is None or outcome == api.Outcome.FENCED):  # it did not end by itself: say what it did
        doing = transition.in_flight(status, ending.finished_at or t.now)
        ending = replace(ending, message=f"{ending.message} {doing}")
    final = outcome.final_phase if outcome is not None else None
    if final == api.Phase.ABORTED:
        t.finish(final, ending.message, ending.abort_reason or api.AbortReason.BUDGET_EXHAUSTED)
    elif final is not None:
        t.finish(final, ending.message)
    elif outcome == api.Outcome.WAITING:
        waiting = ending.waiting_for or {}
        t.new.phase = api.Phase.WAITING
        t.new.waitingFor = resource.WaitingFor(
            event=waiting.get("event"), wakeTime=waiting.get("wakeTime"),
            since=waiting.get("since") or api.format_time(t.now), deadline=waiting.get("deadline"),
            holder=waiting.get("holder"), compensations=waiting.get("compensations") or None,
            budget=waiting.get("budget"), quota=waiting.get("quota"),
        )
        event = str(waiting.get("event") or "")
        prefix = relations.CHILD_EVENT_PREFIX
        t.new.message = (f"waiting for child run {t.run.name}-{event[len(prefix):]} to finish (no pod)"
                         if event.startswith(prefix) else ending.message)
        if waiting.get("budget"):  # someone must act: the runner's message says what was spent and how to go on
            t.event("BudgetReached", t.new.message, warning=True)
        else:
            t.event(api.Phase.WAITING.value, t.new.message)
    elif outcome == api.Outcome.SUSPENDED:
        if t.run.spec.suspend:
            t.new.phase = api.Phase.SUSPENDED
            t.new.message = "suspended at a step boundary: spec.suspend is true"
            t.event(api.Phase.SUSPENDED.value, t.new.message)
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
            t.event(api.EVENT_RESTARTING, f"{ending.reason}: {t.new.message}", warning=True)
    else:  # a crash, an OOM kill, an expired lease, or an attempt fenced by a zombie write
        t.new.restarts = status.restarts + 1
        t.plan.restart_reason = ending.reason
        if t.new.restarts > policy.maxRestarts:
            t.finish(api.Phase.ABORTED, f"{ending.message}; {t.new.restarts} restarts exceed "
                     f"policy.maxRestarts={policy.maxRestarts}", api.AbortReason.RETRY_LIMIT_EXCEEDED)
        elif aborts.finishing_abort(t):
            t.new.phase = api.Phase.PENDING
            t.new.message = f"{ending.message}: restarting at once to finish aborting (restart " \
                            f"{t.new.restarts} of {policy.maxRestarts})"
            t.event(api.EVENT_RESTARTING, f"{ending.reason}: {t.new.message}", warning=True)
        else:
            delay = policy.backoff.delay(t.new.restarts)
            t.new.phase = api.Phase.BACKOFF
            t.new.nextAttemptTime = api.format_time(t.now + delay)
            t.new.message = f"{ending.message}: restart {t.new.restarts} of {policy.maxRestarts} in " \
                            f"{api.format_duration(delay)}"
            t.event(api.EVENT_RESTARTING, f"{ending.reason}: {t.new.message}", warning=True)



def waiting(t: transition.Transition) -> None:
    waiting = t.run.status.waitingFor or resource.WaitingFor()
    if facts.budget_lifted(t.run):
        t.new.phase = api.Phase.PENDING
        t.new.message = f"policy.askAt.{waiting.budget} raised or removed: resuming"
        t.event("BudgetRaised", t.new.message)
        return
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


def finished(t: transition.Transition) -> None:
    status, spec = t.run.status, t.run.spec
    if facts.retry_requested(t.run):
        _retry(t)
        return
    policy_changed = (status.observedGeneration or 0) < t.run.generation
    if status.phase == api.Phase.ABORTED and policy_changed and aborts.abort_lifted(t):
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



def retry_while_active(t: transition.Transition) -> None:
    """A retry asked of a run that has not finished is recorded as seen and does nothing, so that it cannot
    start a run again once it ends: retry clicked twice would otherwise run a Succeeded run a second time.
    An abort in progress keeps it: retrying is what a user does once the abort has ended the run."""
    status, value = t.run.status, t.run.annotations.get(api.ANNOTATION_RETRY)
    if (status.phase is None or status.phase.finished or value is None or value == status.retry
            or status.aborting is not None or api.ANNOTATION_ABORT in t.run.annotations):
        return
    t.new.retry = value
    t.event("RetryIgnored", f"{api.ANNOTATION_RETRY}={value!r} ignored: the run is {status.phase}, and retry "
            "starts only a Failed, Aborted or Succeeded run again")


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



def deleting(t: transition.Transition, pods: list[facts.PodView], purge: facts.PodView | None) -> transition.Plan:
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
    release_workload(t)
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
