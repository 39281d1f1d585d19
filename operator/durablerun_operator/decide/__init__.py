"""The operator's decisions, as pure functions: (run, its pods, now) -> one Plan.

Nothing here talks to the API. ``decide`` makes one transition at a time; the
reconciler applies its plan (the status patch first, guarded by ``test`` ops so
a concurrent writer makes it fail and the decision is made again on fresh
facts), then asks again until nothing is left to do. ``quiet_until`` tells it
when to ask again if nothing else changes.

Start here: ``decide`` below picks the step for the run's phase. Where each
concern lives, lowest first (each module imports only the ones listed before it):

- ``facts``: what the operator observes. ``PodView`` and how an attempt's pod
  ended (``Ending``: a result, a crash, an OOM kill, an eviction, a lost node),
  ``RunView``, a failed pod creation, and requests not acted on yet.
- ``clocks``: active time (what maxDuration counts), the lease's validity, and
  ``quiet_until``, the next moment the clock alone changes the decision.
- ``transition``: the ``Plan`` a decision returns and the ``Transition`` every
  step writes the next status into (its guards, fencing, finishing).
- ``aborts``: a user's abort, the limits (maxDuration, cost, progressTimeout),
  the grace an attempt gets to undo its work, and an abort a raised limit lifts.
- ``family``: child runs and signals between runs.
- ``lifecycle``: admit, start, running, ended (restart, backoff, wait, finish),
  waiting, finished (retry, TTL) and deleting.

None of them imports a Kubernetes client, kopf or anything that does IO, nor
reads the clock (tests/operator/test_boundaries.py): only ``kube`` talks to the
API server.
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import datetime, timedelta

from durablerun import api
from durablerun_operator import builders, kueue
from durablerun_operator.decide import aborts, family, lifecycle, transition
from durablerun_operator.decide.clocks import CLOCK_SKEW_MARGIN, NEVER, quiet_until
from durablerun_operator.decide.facts import CreateFailure, Ending, PodView, RunView
from durablerun_operator.decide.family import related_names
from durablerun_operator.decide.transition import Plan

__all__ = ["CLOCK_SKEW_MARGIN", "NEVER", "CreateFailure", "Ending", "Plan", "PodView", "RunView", "decide",
           "quiet_until", "related_names"]


def decide(run: RunView, pods: list[PodView], now: datetime, *, stuck_seconds: float = 60.0,
           start_timeout: timedelta = lifecycle.START_TIMEOUT,
           related: Mapping[str, RunView | None] | None = None,
           create_failure: CreateFailure | None = None, queueing: kueue.Queueing | None = None) -> Plan:
    """The next transition of ``run``, given every pod labelled with it (and the last failure to create one).

    ``related``: the runs, by name, its child requests and pending signals name (None: no such run).
    ``queueing``: for a run admitted through Kueue, its queue and Workload; None, today's behaviour.
    ``start_timeout``: how long an attempt's pod may fail to get its image before the run Fails.
    """
    related = related or {}
    children = family.children(run, related)
    t = transition.Transition(run, now, related, children, family.children_total(children), queueing)
    status, spec = run.status, run.spec
    purge = next((p for p in pods if p.name == builders.purge_pod_name(run.name)), None)
    # An upgrade's check pod is no attempt: the one of the request being checked, and older ones to delete.
    checks = [p for p in pods if p.name.startswith(builders.check_pod_prefix(run.name))]
    checking = status.upgradeCheck
    check = next((p for p in checks if checking and p.name == builders.check_pod_name(run.name, checking.request)),
                 None)
    pods = [p for p in pods if p is not purge and not any(p is c for c in checks)]
    current = next((p for p in pods if p.name == status.pod and p.epoch == status.epoch), None)
    older = [p for p in pods if p is not current]

    if run.deleting:
        return lifecycle.deleting(t, [*pods, *checks], purge)
    if api.RUN_FINALIZER not in run.finalizers:
        t.plan.add_run_finalizer = True

    # Pods no attempt owns any more: delete the live ones, release the ended ones.
    for pod in older:
        if pod.finished or (pod.deleting and pod.ending is not None):
            if pod.has_finalizer:
                t.plan.release_pods.append(pod.name)
                if pod.ending is not None and pod.ending.outcome == api.Outcome.FENCED:
                    t.event(api.Outcome.FENCED.value, f"pod {pod.name} (epoch {pod.epoch}) stopped without writing: "
                            f"a newer attempt owns the run ({pod.ending.message})", warning=True)
            if not pod.deleting and not (status.phase and status.phase.finished and pod.name == status.pod):
                t.plan.delete_pods.append(pod.name)
        elif not pod.deleting:
            t.plan.delete_pods.append(pod.name)

    for pod in checks:
        if pod is not check and not pod.deleting:
            t.plan.delete_pods.append(pod.name)
    lifecycle.pin(t, current)
    lifecycle.upgrade(t, check, create_failure)
    lifecycle.retry_while_active(t)
    phase = status.phase
    if phase is None:
        lifecycle.admit(t)
        if t.queueing is None and not spec.suspend and api.ANNOTATION_ABORT not in run.annotations:
            lifecycle.start(t, older, stuck_seconds)  # in the same write: a start costs one status write, not two
    elif phase == api.Phase.RUNNING:
        lifecycle.running(t, current, create_failure, start_timeout)
    elif phase.finished:
        lifecycle.finished(t)
    elif phase == api.Phase.PENDING and aborts.finishing_abort(t):
        lifecycle.start(t, older, stuck_seconds)  # the aborted attempt crashed: the next one finishes undoing its work
    elif aborts.user_abort(t) or aborts.limits_exceeded(t) or aborts.abort_decided(t):
        pass
    elif spec.suspend:
        if phase != api.Phase.SUSPENDED:
            t.new.phase = api.Phase.SUSPENDED
            t.new.message = "suspended: spec.suspend is true"
            t.event(api.Phase.SUSPENDED.value, "spec.suspend is true: no pod runs until it is false")
    elif phase in (api.Phase.PENDING, api.Phase.QUEUED):
        lifecycle.start(t, older, stuck_seconds)
    elif phase == api.Phase.BACKOFF:
        next_time = api.parse_time(status.nextAttemptTime)
        if next_time is None or now >= next_time:
            t.new.phase = api.Phase.PENDING
            t.new.nextAttemptTime = None
            t.new.message = "backoff over: starting the next attempt"
    elif phase == api.Phase.WAITING:
        lifecycle.waiting(t)
    elif phase == api.Phase.SUSPENDED:
        t.new.phase = api.Phase.PENDING
        t.new.message = "resumed: spec.suspend is false"
        t.event("Resumed", "spec.suspend is false: resuming from the latest checkpoint")
    family.act(t)
    lifecycle.release_workload(t)
    return t.done()
