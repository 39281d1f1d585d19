"""One pass over one run: read its facts, decide (pure), guard, apply the plan, and again until it settles.

:class:`Executor` reads what ``decide`` needs (the run, its pods, the runs it names, and what each
integration contributes, :mod:`durablerun_operator.integrations`), holds a lease-only restart during a mass
expiry (:mod:`durablerun_operator.holds`), checks the run is still this replica's before it acts, and carries
out a ``Plan``: the guarded status write first, then the integrations' objects, pods, child runs and Events.
When the run is looked at again is not its business: it says how the pass ended, and
:mod:`durablerun_operator.reconciler` tells :mod:`durablerun_operator.schedule`.
"""

from __future__ import annotations

import contextlib
import enum
import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any

from durablerun import api
from durablerun_operator import builders, decide, quotas, wakeups
from durablerun_operator.config import Settings
from durablerun_operator.holds import LeaseHolds
from durablerun_operator.integrations import Contribution, Integration
from durablerun_operator.integrations.kueue import KueueIntegration
from durablerun_operator.integrations.quotas import QuotaIntegration
from durablerun_operator.kube import Conflict, Kube
from durablerun_operator.workqueue import Calls, Key

if TYPE_CHECKING:
    from durablerun_operator.metrics import RunMetrics
    from durablerun_operator.tracing import DecisionTracer

log = logging.getLogger("durablerun.operator")

MAX_TRANSITIONS = 12  # per pass; a run needs at most a handful to settle

# One integration and its state for the pass under way.
_Engaged = tuple[Integration[Any], Any]


class Dropped(enum.Enum):
    """A pass that ended with the run no longer this replica's to decide."""

    GONE = "gone"  # the run does not exist any more
    NOT_MINE = "not mine"  # its shard is another replica's


@dataclass(frozen=True)
class Settled:
    """A pass that ended with nothing to do before ``until`` (or a watch event)."""

    run: decide.RunView
    views: list[decide.PodView]
    until: datetime
    now: datetime
    #: An integration asked to look again although nothing watched changes (Contribution.recheck).
    recheck: bool


class PodCache:
    """Each run's pods as the pod watch delivered them (managedFields dropped), and an attempt's pod as the API
    server answered its creation: what a decision reads instead of a LIST. A pass settles on them only when
    they ask for nothing; a plan that would act is decided again on a fresh LIST, which also replaces the run's
    entry. So a pod the watch has not delivered yet, or a deletion it missed, never moves a run, and a run whose
    pods changed as the operator expects costs no read (a start: one LIST, before it acts)."""

    def __init__(self) -> None:
        self._pods: dict[Key, dict[str, dict[str, Any]]] = {}

    def seen(self, key: Key, pod: dict[str, Any], deleted: bool) -> None:
        name = pod["metadata"]["name"]
        if deleted:
            pods = self._pods.get(key, {})
            pods.pop(name, None)
            if not pods:
                self._pods.pop(key, None)
            return
        meta = {k: v for k, v in pod["metadata"].items() if k != "managedFields"}
        self._pods.setdefault(key, {})[name] = {**pod, "metadata": meta}

    def listed(self, key: Key, pods: list[dict[str, Any]]) -> None:
        self._pods.pop(key, None)
        for pod in pods:
            self.seen(key, pod, deleted=False)

    def get(self, key: Key) -> list[dict[str, Any]]:
        return list(self._pods.get(key, {}).values())

    def forget(self, key: Key) -> None:
        self._pods.pop(key, None)


class Executor:
    def __init__(self, kube: Kube, settings: Settings, call: Calls, holds: LeaseHolds,
                 mine: Callable[[Key, str | None], bool], metrics: RunMetrics | None = None,
                 tracer: DecisionTracer | None = None) -> None:
        """``mine``: whether this replica decides the run (its key, its uid), asked again just before acting."""
        self._kube, self._settings, self._call, self._holds = kube, settings, call, holds
        self._mine, self._metrics, self._tracer = mine, metrics, tracer
        # Every integration, driven alike; each is inert for a run that does not involve it.
        #: The ModelQuotas as watched (settings.model_quotas), for the pods QuotaIntegration places.
        self.quota_index = quotas.Index()
        self.integrations: Sequence[Integration[Any]] = (KueueIntegration(kube, settings, call),
                                                         QuotaIntegration(self.quota_index, settings))
        self._resumes_seen: set[tuple[str, int]] = set()
        # The runner RoleBindings made, by (namespace, name): their owner run's uid, or "" for a namespace's.
        self._rbac_ready: dict[Key, str] = {}
        # The last failure to create a run's pod (an attempt's or a check's), for decide (the run's status cannot
        # hold it: it is written before the pod is created). One per run; decide reads it for the pod it names.
        self._create_failures: dict[Key, decide.CreateFailure] = {}
        #: The runs' pods from the pod watch (the reconciler tells it), read before a LIST (PodCache).
        self.pods = PodCache()

    def involves_integration(self, body: dict[str, Any]) -> bool:
        """Whether deciding the run reads an integration's objects."""
        return any(integration.involves(body) for integration in self.integrations)

    def forget(self, key: Key) -> None:
        self._rbac_ready.pop((key[0], builders.runner_account(key[1])), None)  # per-run access's
        self._create_failures.pop(key, None)
        self.pods.forget(key)

    # --- reading and deciding ------------------------------------------------------------

    def plan_for(self, key: Key, run: decide.RunView, views: list[decide.PodView], now: datetime,
               related: dict[str, decide.RunView | None], facts: Contribution | None = None) -> decide.Plan:
        return decide.decide(run, views, now, stuck_seconds=self._settings.stuck_terminating_seconds,
                             start_timeout=timedelta(seconds=self._settings.start_timeout_seconds),
                             related=related, create_failure=self._create_failures.get(key),
                             queueing=facts.queueing if facts else None)

    def next_wakeup(self, run: decide.RunView, views: list[decide.PodView], now: datetime) -> datetime:
        return wakeups.next_wakeup(run, views, now, self._settings.stuck_terminating_seconds,
                                   timedelta(seconds=self._settings.start_timeout_seconds))

    def observe(self, run: decide.RunView, now: Any, pods: list[decide.PodView] | None = None) -> None:
        """Keep the run's lease for the mass-expiry judgement, and its metrics. ``pods``: read with it (the
        watch has none), for the start of an attempt that has not acquired its lease yet."""
        self._holds.observe(run, pods)
        status = run.status
        if not self._metrics or run.raw_status is None:
            return
        self._metrics.observe_run(run.namespace, run.name, run.status, run.spec.policy, now)
        lease = status.lease
        # Resume latency: previous pod's end -> the new attempt holding the lease.
        if lease.epoch == status.epoch and lease.acquireTime and status.lastPodEndTime:
            key = (run.uid, status.epoch)
            if key not in self._resumes_seen:
                self._resumes_seen.add(key)
                acquired, ended = api.parse_time(lease.acquireTime), api.parse_time(status.lastPodEndTime)
                if acquired and ended and acquired >= ended:
                    self._metrics.observe_resume_latency((acquired - ended).total_seconds())

    async def _related(self, run: decide.RunView) -> dict[str, decide.RunView | None]:
        """The runs decide needs besides this one: its children (one LIST by label), its signals' targets."""
        names = decide.related_names(run)
        if not names:  # no child requests (children are only ever made from one) and no signals
            return {}
        found: dict[str, decide.RunView | None] = {
            child["metadata"]["name"]: decide.RunView.from_body(child)
            for child in await self._call(self._kube.list_children, run.namespace, run.name)}
        for name in names - set(found):
            body = await self._call(self._kube.get_run, run.namespace, name)
            found[name] = decide.RunView.from_body(body) if body is not None else None
        return found

    # --- one pass ----------------------------------------------------------------------

    async def converge(self, key: Key, first_look: dict[str, Any] | None = None) -> Settled | Dropped | None:
        """Decide and act until the run settles; None if it did not within MAX_TRANSITIONS. ``first_look``: the
        watched body of a run with no pod known, decided alone first (read afresh only if it would act)."""
        namespace, name = key
        body: dict[str, Any] | None = None  # the run as the last write left it: no need to read it again
        pods: list[dict[str, Any]] | None = None  # None: read them (again)
        # Deciding on the watch's body and no pods, unread (the first look): settle, or read and decide again.
        # A look is only taken with no pod known, and a pod seen since drops it (Schedule.pod_seen).
        if first_look is not None:
            body, pods = first_look, []
        cached = first_look is None  # the first decision may read the watch's pods; one that acts, a LIST
        related: dict[str, decide.RunView | None] | None = None  # children and signal targets, by name
        engaged: list[_Engaged] = [(integration, integration.begin()) for integration in self.integrations]
        for _ in range(MAX_TRANSITIONS):
            if body is None:
                body = await self._call(self._kube.get_run, namespace, name)
            if body is None:
                return Dropped.GONE
            if not self._mine(key, body["metadata"].get("uid")):
                return Dropped.NOT_MINE
            if pods is None and cached:
                pods = self.pods.get(key)
            elif pods is None:
                pods = await self._call(self._kube.list_pods, namespace, name)
                self.pods.listed(key, pods)
            now = api.now()
            views = [decide.PodView.from_pod(p, now, self._settings.stuck_terminating_seconds) for p in pods]
            run = decide.RunView.from_body(body)
            self.observe(run, now, views)
            if related is None:
                related = await self._related(run)
            facts = Contribution.combine([await i.observe(state, run, body) for i, state in engaged])
            plan = self.plan_for(key, run, views, now, related, facts)
            if first_look is not None and not plan.empty:
                first_look = body = pods = related = None  # it would act: on fresh reads only
                for i, state in engaged:
                    i.stale(state)
                continue
            if cached and not plan.empty:
                cached, pods = False, None  # it would act: on a fresh LIST of its pods only
                continue
            first_look, cached = None, False
            held = await self._holds.hold(run, plan, now)
            # Renewals first: while they fall behind, a first attempt waits for its paced turn, decided again then.
            if held is None and (wait := self._holds.pace(run, plan, now)):
                held = now + timedelta(seconds=wait)
            if plan.empty or held is not None:
                until = held or self.next_wakeup(run, views, now)
                if facts.recheck is not None:
                    until = min(until, now + facts.recheck)
                return Settled(run, views, until, now, facts.recheck is not None)
            if not self._mine(key, run.uid):  # fencing: the shard was lost while we decided
                return Dropped.NOT_MINE
            if plan.touches_pods and not plan.add_run_finalizer:  # a finalizer is applied alone (apply)
                # A plan that only started the attempt's pod left it in the cache as created: settle on the
                # cache if that asks for nothing; any other change to pods is read afresh.
                pods, cached = None, plan.only_starts_a_pod
            if (plan.touches_runs or plan.add_events) and not plan.add_run_finalizer:
                related = None
            for i, state in engaged:
                i.stale(state, plan)
            try:
                body = await self.apply(run, plan, engaged)
            except Conflict as conflict:
                log.info("%s/%s: %s; deciding again", namespace, name, conflict)
                body = pods = related = None
                for i, state in engaged:
                    i.stale(state)
        log.warning("%s/%s did not settle within %d transitions", namespace, name, MAX_TRANSITIONS)
        return None

    # --- applying a plan -----------------------------------------------------------------

    async def apply(self, run: decide.RunView, plan: decide.Plan,
                    engaged: Sequence[_Engaged] = ()) -> dict[str, Any] | None:
        """Carry out ``plan``; the run as written by it, or None if it must be read again. ``engaged``: the
        integrations and their state in this pass, which create or delete their objects as the plan says."""
        ns, name = run.namespace, run.name
        if plan.add_run_finalizer:
            return await self._call(self._kube.set_run_finalizer, run.body, True)
        updated = run.body
        if plan.patch:
            # First the guarded status write: the epoch is bumped before any pod is
            # deleted or created, so a fenced pod can no longer renew or report.
            updated = await self._call(self._kube.patch_status, ns, name, plan.patch)
            # The transition is written: count it now. A pod or Event call below may fail, and the next
            # reconcile sees the new phase, not the transition, so it would never be counted.
            self._count(ns, name, plan)
        for integration, state in engaged:
            await integration.apply(state, updated, plan)
        if self._tracer:  # the decision, in the run's trace (its Events, restart and abort reasons)
            self._tracer.record(run, plan)
        for pod in plan.delete_pods:
            await self._call(self._kube.delete_pod, ns, pod)
        for pod in plan.release_pods:
            with contextlib.suppress(Conflict):
                await self._call(self._kube.release_pod, ns, pod)
        if plan.create_pod_epoch is not None:
            await self._start_pod(updated, plan.create_pod_epoch, plan)
        if plan.create_purge_pod:
            await self._call(self._kube.create_pod, builders.purge_pod(updated, self._settings))
        if plan.create_check_pod:
            await self._create_check_pod(updated)
        if plan.add_events:
            # A child's outcome, as an event of this run: first value wins, and a Waiting run wakes for it.
            written = await self._call(self._kube.merge_patch_run, ns, name, {"spec": {"events": plan.add_events}})
            if written is None:
                return None
            updated = written
        for child in plan.create_runs:
            await self._call(self._kube.create_run, child)
        for other, patch in plan.patch_runs:
            await self._call(self._kube.merge_patch_run, ns, other, patch)
        for kind, reason, message in plan.events:
            log.info("%s/%s %s: %s", ns, name, reason, message)
            await self._call(self._kube.post_event, updated, kind, reason, message)
        if plan.remove_run_finalizer:
            await self._call(self._kube.set_run_finalizer, updated, False)
            return None
        if plan.delete_run:
            await self._call(self._kube.delete_run, ns, name, run.uid)
            return None
        return updated

    def _count(self, ns: str, name: str, plan: decide.Plan) -> None:
        if not self._metrics:
            return
        if plan.restart_reason:
            self._metrics.record_restart(ns, name, plan.restart_reason)
        if plan.abort_reason:
            self._metrics.record_abort(ns, name, plan.abort_reason)
        if plan.completion:
            self._metrics.record_completion(ns, name, plan.completion)
        if plan.upgraded:
            self._metrics.record_upgrade()

    async def _create_check_pod(self, run: dict[str, Any]) -> None:
        """Create an upgrade's check pod. A refusal that cannot pass goes to decide, which refuses the upgrade
        with it; any other failure is tried again with the reconcile's backoff, until the check's timeout."""
        pod = builders.check_pod(run, self._settings)
        key = (run["metadata"]["namespace"], run["metadata"]["name"])
        try:
            await self._call(self._kube.create_pod, pod)
        except Exception as error:
            message, permanent = self._kube.create_error(error)
            if not permanent:
                raise
            log.warning("%s/%s: check pod %s cannot be created: %s", *key, pod["metadata"]["name"], message)
            self._create_failures[key] = decide.CreateFailure(pod["metadata"]["name"], message, permanent)

    async def _start_pod(self, run: dict[str, Any], epoch: int, plan: decide.Plan) -> None:
        """Create attempt ``epoch``'s pod (and the run's RBAC); a failure of any kind goes to decide, which fails
        or restarts the run (docs/operator.md): never a Running run whose pod does not exist."""
        meta = run["metadata"]
        key = (meta["namespace"], meta["name"])
        name = builders.pod_name(meta["name"], epoch)
        rbac = builders.runner_rbac(run, self._settings)
        binding = rbac[-1]["metadata"]
        made = (binding["namespace"], binding["name"])
        owner = binding.get("ownerReferences", [{}])[0].get("uid", "")
        try:
            if self._rbac_ready.get(made) != owner:  # made before the first attempt: later ones need no API calls
                for obj in rbac:
                    await self._call(self._kube.ensure, obj)
                self._rbac_ready[made] = owner
            pod = builders.runner_pod(run, epoch, self._settings)
            for integration in self.integrations:
                pod = await integration.place(pod, plan)
            created = await self._call(self._kube.create_pod, pod)
            if created is not None:
                self.pods.seen(key, created, deleted=False)
        except Exception as error:
            self._rbac_ready.pop(made, None)  # perhaps someone deleted the ServiceAccount: make sure next time
            message, permanent = self._kube.create_error(error)
            log.warning("%s/%s: pod %s could not be created (%s): %s", *key, name,
                        "permanent" if permanent else "may pass", message)
            self._create_failures[key] = decide.CreateFailure(name, message, permanent)
            return
        self._create_failures.pop(key, None)
        if not created:
            log.info("pod %s already exists: attempt %d was started before", name, epoch)

