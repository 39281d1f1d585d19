"""Reconcile runs: read facts, decide (pure), apply the plan, repeat until settled.

It is one module of over 400 lines because it is one loop, :class:`Reconciler`;
the read-decide-apply pass reads best in one place. Its work queue, rate
limiter and API threads are in :mod:`durablerun_operator.workqueue`; the lease-only
restarts held during a mass lease expiry in :mod:`durablerun_operator.holds`; each
integration (Kueue) behind the one protocol of :mod:`durablerun_operator.integrations`.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Sequence
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any

from durablerun import api
from durablerun_operator import builders, decide, shards, wakeups
from durablerun_operator.config import Settings
from durablerun_operator.holds import LeaseHolds
from durablerun_operator.integrations import Contribution, Integration
from durablerun_operator.integrations.kueue import KueueIntegration
from durablerun_operator.kube import Conflict, Kube
from durablerun_operator.workqueue import Calls, Key, WorkQueue

if TYPE_CHECKING:
    from durablerun_operator.metrics import RunMetrics
    from durablerun_operator.tracing import DecisionTracer

log = logging.getLogger("durablerun.operator")

MAX_TRANSITIONS = 12  # per pass; a run needs at most a handful to settle
# Runs reconciled at once. Each reconcile mostly waits on the API server, and a burst of expiring leases (a
# lost node) must not queue one run's detection behind another's restart (kube.load_config keeps enough
# connections).
WORKERS = 8
# A reconcile that failed (an API error, say) is tried again after this, doubling up to RETRY_MAX.
RETRY_FIRST, RETRY_MAX = 0.5, 60.0
MIN_WAKE = timedelta(seconds=1)

# One integration and its state for the pass under way.
_Engaged = tuple[Integration[Any], Any]


class Reconciler:
    def __init__(self, kube: Kube, settings: Settings, metrics: RunMetrics | None = None,
                 tracer: DecisionTracer | None = None, keeper: shards.Keeper | None = None) -> None:
        self.kube, self.settings, self.metrics, self.tracer = kube, settings, metrics, tracer
        # With more than one replica, the shards this one holds (shards.py); None: every run is ours.
        self.keeper = keeper
        self._uids: dict[Key, str] = {}  # every run seen, ours or not: which to decide when a shard comes
        # Runs of other replicas' shards: when each must be decided (decide.quiet_until as last seen; None:
        # now), so that a shard taken over has its overdue runs (a lapsed lease) decided first.
        self._due: dict[Key, datetime | None] = {}
        self.queue = WorkQueue()
        self._resumes_seen: set[tuple[str, int]] = set()
        # Runs whose last reconcile found nothing to do and whose pods have not changed since; for them a new
        # version of the run (a lease renewal, say) needs no reconcile unless decide.quiet_until says so.
        self._settled: set[Key] = set()
        self._timers: dict[Key, asyncio.TimerHandle] = {}
        # Per settled run: the resourceVersion it settled at (the same version again, from a re-list, is no
        # news), and the moment its pods' clock runs out (a new version of the run does not change that).
        self._settled_version: dict[Key, str] = {}
        self._pods_until: dict[Key, Any] = {}
        # The first look: the names of every run's pods as the pod watch reports them, and the watched body of
        # a queued run whose decision also reads its relations or an integration's objects. A run with no pod
        # is first decided on the watched body alone, with no read (at sight in run_changed, or in reconcile
        # when it has relations); only a plan that would act is decided again on fresh reads. So an operator
        # (re)starting with 100,000 waiting runs reads none of them again, rather than two calls each at its
        # client's rate.
        self._first_look: dict[Key, dict[str, Any]] = {}
        self._pods_of: dict[Key, set[str]] = {}
        # Runs an integration asked to look at again although nothing watched changes (a Kueue run whose
        # WorkloadPriorityClass does not exist): a new version of one is decided at once, although such a
        # run is otherwise woken only by what the integration watches.
        self._rechecked: set[Key] = set()
        self._failures: dict[Key, int] = {}  # reconciles in a row that raised: the retry's backoff
        self._io = Calls(settings.kube_qps, settings.kube_burst, WORKERS)
        self.holds = LeaseHolds(kube, settings, self._io, self._wake_now, metrics)  # mass lease expiry
        # Every integration, driven alike; each is inert for a run that does not involve it.
        self.integrations: tuple[Integration[Any], ...] = (KueueIntegration(kube, settings, self._io),)
        self._rbac_ready: dict[Key, str] = {}  # run -> uid whose ServiceAccount, Role and RoleBinding exist
        # Per child run: what its parent last heard about (phase, cost, ...); a change queues the parent.
        self._children_seen: dict[Key, Any] = {}
        # The last failure to create a run's pod, for decide (the run's status cannot hold it: it is written
        # before the pod is created). One per run; decide ignores it once the epoch has moved on.
        self._create_failures: dict[Key, decide.CreateFailure] = {}

    # --- workers ---------------------------------------------------------------------

    async def run_workers(self) -> None:
        await asyncio.gather(*(self._worker() for _ in range(WORKERS)))

    async def _worker(self) -> None:
        while True:
            key = await self.queue.get()
            try:
                settled = await self.reconcile(*key)
            except Exception:
                if self.metrics:
                    self.metrics.record_reconcile_error()
                log.exception("reconcile of %s/%s failed; it is retried in %.1fs", *key, self._retry(key))
            else:
                if settled:
                    self._failures.pop(key, None)
                else:
                    self._retry(key)
            finally:
                self.queue.done(key)

    def _retry(self, key: Key) -> float:
        """Decide ``key`` again after a backoff that doubles with each failure in a row (the watch may come first)."""
        failures = self._failures[key] = self._failures.get(key, 0) + 1
        delay = min(RETRY_FIRST * 2.0 ** (failures - 1), RETRY_MAX)
        self._cancel_timer(key)
        self._timers[key] = asyncio.get_running_loop().call_later(delay, self._wake, key)
        return delay

    async def resync_forever(self) -> None:
        """The safety net behind the watch: every interval, one LIST; a version the watch missed is news.

        A run the watch delivered is not looked at again here: it is decided on its own
        events and at its own wake-up, so an idle fleet costs one LIST per interval.
        """
        while True:
            await asyncio.sleep(self.settings.resync_seconds)
            try:
                for namespace in self.settings.namespaces or (None,):
                    token: str | None = None
                    while True:  # a page is decided before the next is read: one page held at a time
                        runs, token = await self._io(self.kube.list_runs_page, namespace, token)
                        for run in runs:
                            self.run_changed(run)
                        del runs
                        if token is None:
                            break
            except Exception:
                log.exception("resync failed")

    # --- what to reconcile, and when -------------------------------------------------

    def run_changed(self, body: dict[str, Any], deleted: bool = False) -> None:
        """A new version of a run (from the watch or the resync): reconcile it now, or when its clock runs out."""
        key = (body["metadata"]["namespace"], body["metadata"]["name"])
        version = body["metadata"].get("resourceVersion")
        if self.keeper is not None:
            if deleted:
                self._uids.pop(key, None)
                self._due.pop(key, None)
            elif uid := body["metadata"].get("uid"):
                self._uids[key] = uid
        if not deleted and key in self._settled and version is not None and self._settled_version.get(key) == version:
            return  # a re-list (kopf's, or the resync) of a version this run settled at: nothing is new
        if deleted:
            self._children_seen.pop(key, None)
            self.holds.deleted(key)
            parent = (body["metadata"].get("labels") or {}).get(api.LABEL_PARENT)
            if parent:
                self.queue.add((key[0], parent))
            self.queue.add(key)
            return
        try:
            run = decide.RunView.from_body(body)
        except Exception:  # the API server validated it; a reconcile reports whatever is wrong
            self.queue.add(key)
            return
        self._tell_parent(run)  # the parent may be ours when the child is not
        if not self._mine(key):
            if self.keeper is not None:
                self._due[key] = decide.quiet_until(run)
            return
        self._due.pop(key, None)
        now = api.now()
        self._observe(run, now)
        quiet = wakeups.combine(decide.quiet_until(run), self._pods_until.get(key))
        if key in self._settled and key not in self._rechecked and self._wake_at(key, quiet, now):
            if version is not None:
                self._settled_version[key] = version
            return
        if key not in self._pods_of and not self.queue.busy(key):
            if decide.related_names(run) or any(i.involves(body) for i in self.integrations):
                self._first_look[key] = body  # it reads its relations or an integration: reconcile takes it
            else:
                try:
                    if self._settle_unread(key, run, now):
                        return
                except Exception:  # the reconcile, on fresh reads, says what is wrong and retries
                    log.debug("%s/%s: the first look failed; reconciling", *key, exc_info=True)
        self.queue.add(key)

    def _settle_unread(self, key: Key, run: decide.RunView, now: datetime) -> bool:
        """The first look at a run with no pod, no relations and no integration's objects: decided on the watched
        body alone, here, so that nothing is held or read for it. True if it settled; False if it would act: it is then
        decided again on fresh reads. An operator (re)starting with 100,000 waiting runs so neither reads them
        again (two calls each at its client's rate) nor holds their bodies until its workers reach them."""
        plan = decide.decide(run, [], now, stuck_seconds=self.settings.stuck_terminating_seconds, related={},
                             create_failure=self._create_failures.get(key))
        if not plan.empty:
            return False
        self._failures.pop(key, None)
        self.holds.set_held(key, None)
        until = wakeups.next_wakeup(run, [], now, self.settings.stuck_terminating_seconds)
        self._settle(key, run, [], until, now)
        return True

    def _settle(self, key: Key, run: decide.RunView, views: list[decide.PodView], until: datetime,
                now: datetime) -> None:
        """Nothing happens to the run before ``until`` or a watch event."""
        self._settled.add(key)
        self._settled_version[key] = run.body["metadata"].get("resourceVersion", "")
        self._pods_until[key] = wakeups.pods_until(views, self.settings.stuck_terminating_seconds)
        # A moment already past means decide and the wake-up disagree: look again soon, not in a loop.
        self._wake_at(key, max(until, now + MIN_WAKE), now)

    def _tell_parent(self, child: decide.RunView) -> None:
        """A child's phase, cost or propagated state changed: its parent reports, rolls up or wakes."""
        parent = (child.body["metadata"].get("labels") or {}).get(api.LABEL_PARENT)
        if not parent:
            return
        key = (child.namespace, child.name)
        total = child.status.childrenTotal
        seen = (child.status.phase, child.status.cost.usd, total.usd if total else None,
                                     child.spec.suspend, tuple(sorted(child.annotations)))
        if self._children_seen.get(key) != seen:
            self._children_seen[key] = seen
            self._unsettle((child.namespace, parent))
            self.queue.add((child.namespace, parent))

    def pod_changed(self, namespace: str, run_name: str, pod: str | None = None, deleted: bool = False) -> None:
        """A run's pod (``pod``, from the pod watch) or its Workload changed: decide the run again."""
        key = (namespace, run_name)
        if pod is not None:
            names = self._pods_of.setdefault(key, set())
            (names.discard if deleted else names.add)(pod)
            if not names:
                del self._pods_of[key]
            self._first_look.pop(key, None)  # a look taken before this pod was seen
        if not self._mine(key):
            return
        self._unsettle(key)
        self.queue.add(key)

    def _wake_now(self, key: Key) -> None:
        self._unsettle(key)
        self.queue.add(key)

    def _unsettle(self, key: Key) -> None:
        self._settled.discard(key)
        self._settled_version.pop(key, None)
        self._pods_until.pop(key, None)

    def _wake_at(self, key: Key, until: Any, now: Any) -> bool:
        """Reconcile ``key`` once ``until`` has passed; False if it has (or is None): reconcile it now."""
        if until is None or until <= now:
            return False
        self._cancel_timer(key)
        if until != decide.NEVER:
            delay = (until - now).total_seconds() + 0.05  # decide's deadlines are strict: be just past them
            self._timers[key] = asyncio.get_running_loop().call_later(delay, self._wake, key)
        return True

    def _wake(self, key: Key) -> None:
        self._timers.pop(key, None)
        self.queue.add(key)

    def _cancel_timer(self, key: Key) -> None:
        timer = self._timers.pop(key, None)
        if timer is not None:
            timer.cancel()

    # --- more than one replica (shards.py) ---------------------------------------------

    def _mine(self, key: Key, uid: str | None = None) -> bool:
        """Whether this replica decides ``key`` now (a run not seen yet is read first, then judged)."""
        if self.keeper is None:
            return True
        uid = uid or self._uids.get(key)
        return uid is None or self.keeper.owns(uid)

    def shards_changed(self, gained: set[int], lost: set[int]) -> None:
        """The keeper took or gave up shards: decide every run of those taken, forget those given up."""
        assert self.keeper is not None
        now = api.now()
        taken = []
        for key, uid in list(self._uids.items()):
            shard = self.keeper.shard_of(uid)
            if shard in gained:
                taken.append(key)
            elif shard in lost:
                self._forget(key)
                if self.metrics:
                    self.metrics.forget_run(*key)
        # Every run of a shard taken is decided (its pods may have changed unseen), the overdue ones first.
        dues = {key: self._due.pop(key, None) for key in taken}
        for key in sorted(taken, key=lambda k: (due := dues[k]) is not None and due > now):
            self._unsettle(key)
            self.queue.add(key)

    def _forget(self, key: Key) -> None:
        self._unsettle(key)
        self._failures.pop(key, None)
        self.holds.forget(key)
        self._rbac_ready.pop(key, None)
        self._create_failures.pop(key, None)
        self._rechecked.discard(key)
        self._first_look.pop(key, None)
        self._cancel_timer(key)

    # --- one run ---------------------------------------------------------------------

    async def reconcile(self, namespace: str, name: str) -> bool:
        """Decide and act until the run settles: False if it did not (it is then tried again later)."""
        started = time.perf_counter()
        key = (namespace, name)
        self._unsettle(key)
        try:
            body: dict[str, Any] | None = None  # the run as the last write left it: no need to read it again
            pods: list[dict[str, Any]] | None = None  # None: read them (again)
            # Deciding on the watch's body and no pods, unread (the first look): settle, or read and decide again.
            # A look is only taken with no pod known, and a pod seen since drops it (pod_changed).
            first_look = self._first_look.pop(key, None)
            if first_look is not None:
                body, pods = first_look, []
            related: dict[str, decide.RunView | None] | None = None  # children and signal targets, by name
            engaged: list[_Engaged] = [(integration, integration.begin()) for integration in self.integrations]
            for _ in range(MAX_TRANSITIONS):
                if body is None:
                    body = await self._io(self.kube.get_run, namespace, name)
                if body is None:
                    self._forget(key)
                    if self.metrics:
                        self.metrics.forget_run(namespace, name)
                    return True
                if not self._mine(key, body["metadata"].get("uid")):
                    return self._not_mine(key)
                if pods is None:
                    pods = await self._io(self.kube.list_pods, namespace, name)
                now = api.now()
                views = [decide.PodView.from_pod(p, now, self.settings.stuck_terminating_seconds) for p in pods]
                run = decide.RunView.from_body(body)
                self._observe(run, now, views)
                if related is None:
                    related = await self._related(run)
                facts = Contribution.combine([await i.observe(state, run, body) for i, state in engaged])
                plan = decide.decide(run, views, now, stuck_seconds=self.settings.stuck_terminating_seconds,
                                     related=related, create_failure=self._create_failures.get(key),
                                     queueing=facts.queueing)
                if first_look is not None and not plan.empty:
                    first_look = body = pods = related = None  # it would act: on fresh reads only
                    for i, state in engaged:
                        i.stale(state)
                    continue
                first_look = None
                held = await self.holds.hold(run, plan, now)
                if plan.empty or held is not None:
                    until = held or wakeups.next_wakeup(run, views, now, self.settings.stuck_terminating_seconds)
                    if facts.recheck is not None:
                        self._rechecked.add(key)
                        until = min(until, now + facts.recheck)
                    else:
                        self._rechecked.discard(key)
                    self._settle(key, run, views, until, now)
                    return True
                if not self._mine(key, run.uid):  # fencing: the shard was lost while we decided
                    return self._not_mine(key)
                if plan.touches_pods:
                    pods = None
                if plan.touches_runs or plan.add_events:
                    related = None
                for i, state in engaged:
                    i.stale(state, plan)
                try:
                    body = await self._apply(run, plan, engaged)
                except Conflict as conflict:
                    log.info("%s/%s: %s; deciding again", namespace, name, conflict)
                    body = pods = related = None
                    for i, state in engaged:
                        i.stale(state)
            log.warning("%s/%s did not settle within %d transitions", namespace, name, MAX_TRANSITIONS)
            return False
        finally:
            if self.metrics:
                self.metrics.observe_reconcile(time.perf_counter() - started)

    def _not_mine(self, key: Key) -> bool:
        """Another replica decides ``key``: drop what this one knew of it (settled, as far as we are concerned)."""
        self._forget(key)
        if self.metrics:
            self.metrics.forget_run(*key)
        return True

    async def _apply(self, run: decide.RunView, plan: decide.Plan,
                     engaged: Sequence[_Engaged] = ()) -> dict[str, Any] | None:
        """Carry out ``plan``; the run as written by it, or None if it must be read again. ``engaged``: the
        integrations and their state in this pass, which create or delete their objects as the plan says."""
        ns, name = run.namespace, run.name
        if plan.add_run_finalizer:
            return await self._io(self.kube.set_run_finalizer, run.body, True)
        updated = run.body
        if plan.patch:
            # First the guarded status write: the epoch is bumped before any pod is
            # deleted or created, so a fenced pod can no longer renew or report.
            updated = await self._io(self.kube.patch_status, ns, name, plan.patch)
            # The transition is written: count it now. A pod or Event call below may fail, and the next
            # reconcile sees the new phase, not the transition, so it would never be counted.
            self._count(ns, name, plan)
        for integration, state in engaged:
            await integration.apply(state, updated, plan)
        if self.tracer:  # the decision, in the run's trace (its Events, restart and abort reasons)
            self.tracer.record(run, plan)
        for pod in plan.delete_pods:
            await self._io(self.kube.delete_pod, ns, pod, plan.pod_grace.get(pod))
        for pod in plan.release_pods:
            with contextlib.suppress(Conflict):
                await self._io(self.kube.release_pod, ns, pod)
        if plan.create_pod_epoch is not None:
            await self._start_pod(updated, plan.create_pod_epoch, plan)
        if plan.create_purge_pod:
            await self._io(self.kube.create_pod, builders.purge_pod(updated, self.settings))
        if plan.add_events:
            # A child's outcome, as an event of this run: first value wins, and a Waiting run wakes for it.
            written = await self._io(self.kube.merge_patch_run, ns, name, {"spec": {"events": plan.add_events}})
            if written is None:
                return None
            updated = written
        for child in plan.create_runs:
            await self._io(self.kube.create_run, child)
        for other, patch in plan.patch_runs:
            await self._io(self.kube.merge_patch_run, ns, other, patch)
        for kind, reason, message in plan.events:
            log.info("%s/%s %s: %s", ns, name, reason, message)
            await self._io(self.kube.post_event, updated, kind, reason, message)
        if plan.remove_run_finalizer:
            await self._io(self.kube.set_run_finalizer, updated, False)
            return None
        if plan.delete_run:
            await self._io(self.kube.delete_run, ns, name, run.uid)
            return None
        return updated

    def _count(self, ns: str, name: str, plan: decide.Plan) -> None:
        if not self.metrics:
            return
        if plan.restart_reason:
            self.metrics.record_restart(ns, name, plan.restart_reason)
        if plan.abort_reason:
            self.metrics.record_abort(ns, name, plan.abort_reason)
        if plan.completion:
            self.metrics.record_completion(ns, name, plan.completion)
        if plan.upgraded:
            self.metrics.record_upgrade()

    async def _related(self, run: decide.RunView) -> dict[str, decide.RunView | None]:
        """The runs decide needs besides this one: its children (one LIST by label), its signals' targets."""
        names = decide.related_names(run)
        if not names:  # no child requests (children are only ever made from one) and no signals
            return {}
        found: dict[str, decide.RunView | None] = {
            child["metadata"]["name"]: decide.RunView.from_body(child)
            for child in await self._io(self.kube.list_children, run.namespace, run.name)}
        for name in names - set(found):
            body = await self._io(self.kube.get_run, run.namespace, name)
            found[name] = decide.RunView.from_body(body) if body is not None else None
        return found

    async def _start_pod(self, run: dict[str, Any], epoch: int, plan: decide.Plan) -> None:
        """Create attempt ``epoch``'s pod (and the run's RBAC); a failure of any kind goes to decide, which fails
        or restarts the run (docs/operator.md): never a Running run whose pod does not exist."""
        meta = run["metadata"]
        key = (meta["namespace"], meta["name"])
        name = builders.pod_name(meta["name"], epoch)
        try:
            if self._rbac_ready.get(key) != meta["uid"]:  # made with the first attempt: later ones need no API calls
                for obj in builders.runner_rbac(run):
                    await self._io(self.kube.ensure, obj)
                self._rbac_ready[key] = meta["uid"]
            pod = builders.runner_pod(run, epoch, self.settings)
            for integration in self.integrations:
                pod = await integration.place(pod, plan)
            created = await self._io(self.kube.create_pod, pod)
        except Exception as error:
            self._rbac_ready.pop(key, None)  # perhaps someone deleted the ServiceAccount: make sure next time
            message, permanent = self.kube.create_error(error)
            log.warning("%s/%s: pod %s could not be created (%s): %s", *key, name,
                        "permanent" if permanent else "may pass", message)
            self._create_failures[key] = decide.CreateFailure(epoch, message, permanent)
            return
        self._create_failures.pop(key, None)
        if not created:
            log.info("pod %s already exists: attempt %d was started before", name, epoch)

    def _observe(self, run: decide.RunView, now: Any, pods: list[decide.PodView] | None = None) -> None:
        """Keep the run's lease for the mass-expiry judgement, and its metrics. ``pods``: read with it (the
        watch has none), for the start of an attempt that has not acquired its lease yet."""
        self.holds.observe(run, pods)
        status = run.status
        if not self.metrics or run.raw_status is None:
            return
        self.metrics.observe_run(run.namespace, run.name, run.status, run.spec.policy, now)
        lease = status.lease
        # Resume latency: previous pod's end -> the new attempt holding the lease.
        if lease.epoch == status.epoch and lease.acquireTime and status.lastPodEndTime:
            key = (run.uid, status.epoch)
            if key not in self._resumes_seen:
                self._resumes_seen.add(key)
                acquired, ended = api.parse_time(lease.acquireTime), api.parse_time(status.lastPodEndTime)
                if acquired and ended and acquired >= ended:
                    self.metrics.observe_resume_latency((acquired - ended).total_seconds())
