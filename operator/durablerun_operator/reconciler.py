"""Reconcile runs: read facts, decide (pure), apply the plan, repeat until settled.

:class:`Reconciler` is what the kopf wiring (``handlers``) holds: it takes the watches' news (a run, a pod, a
Workload changed; shards moved) and the resync's, and decides with whom it lies. Its parts, each a module:

- :mod:`~durablerun_operator.schedule`: when a run is reconciled (the work queue and its workers, backoff,
  timers, settled runs, the first look, which runs are this replica's);
- :mod:`~durablerun_operator.executor`: one pass over a run (read, decide, guard, apply the plan), driving
  each integration (:mod:`~durablerun_operator.integrations`: Kueue) through one protocol;
- :mod:`~durablerun_operator.holds`: lease-only restarts held during a mass lease expiry;
- :mod:`~durablerun_operator.scheduled`: the DurableRunSchedules, their ticks and the runs they create.

The work queue and the API rate limiter are in :mod:`durablerun_operator.workqueue`.
"""

from __future__ import annotations

import asyncio
import logging
import time
from datetime import datetime
from typing import TYPE_CHECKING, Any

from durablerun import api
from durablerun_operator import decide, shards
from durablerun_operator.config import Settings
from durablerun_operator.executor import Dropped, Executor
from durablerun_operator.holds import LeaseHolds
from durablerun_operator.kube import Kube
from durablerun_operator.schedule import WORKERS, Schedule
from durablerun_operator.scheduled import ScheduledRuns
from durablerun_operator.workqueue import Calls, Key, WorkQueue

if TYPE_CHECKING:
    from durablerun_operator.metrics import RunMetrics
    from durablerun_operator.tracing import DecisionTracer

log = logging.getLogger("durablerun.operator")


class Reconciler:
    def __init__(self, kube: Kube, settings: Settings, metrics: RunMetrics | None = None,
                 tracer: DecisionTracer | None = None, keeper: shards.Keeper | None = None) -> None:
        self.kube, self.settings, self.metrics, self.tracer = kube, settings, metrics, tracer
        self._call = Calls(settings.kube_qps, settings.kube_burst, WORKERS)
        self.schedule = Schedule(settings.stuck_terminating_seconds, metrics, keeper)
        self.holds = LeaseHolds(kube, settings, self._call, self.schedule.wake_now, metrics)
        self.executor = Executor(kube, settings, self._call, self.holds, self.schedule.mine, metrics, tracer)
        #: The DurableRunSchedules: their ticks, and the runs they create (same API client and rate).
        self.schedules = ScheduledRuns(kube, self._call, keeper)
        # Per child run: what its parent last heard about (phase, cost, ...); a change queues the parent.
        self._children_seen: dict[Key, Any] = {}

    @property
    def queue(self) -> WorkQueue:
        return self.schedule.queue

    @property
    def keeper(self) -> shards.Keeper | None:
        return self.schedule.keeper

    async def run_workers(self) -> None:
        await self.schedule.run_workers(self.reconcile)

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
                        runs, token = await self._call(self.kube.list_runs_page, namespace, token)
                        for run in runs:
                            self.run_changed(run, relisted=True)
                        del runs
                        if token is None:
                            break
            except Exception:
                log.exception("resync failed")

    # --- what to reconcile, and when -------------------------------------------------

    def run_changed(self, body: dict[str, Any], deleted: bool = False, relisted: bool = False) -> None:
        """A new version of a run (from the watch, or ``relisted`` by the resync): reconcile it now, or when its
        clock runs out."""
        self.schedules.run_changed(body, deleted, relisted)  # a scheduled run's phase tells its schedule
        schedule = self.schedule
        key = (body["metadata"]["namespace"], body["metadata"]["name"])
        version = body["metadata"].get("resourceVersion")
        schedule.seen(key, body, deleted)
        if not deleted and schedule.settled_at(key, version):
            return  # a re-list (kopf's, or the resync) of a version this run settled at: nothing is new
        if deleted:
            self._children_seen.pop(key, None)
            self.holds.deleted(key)
            parent = (body["metadata"].get("labels") or {}).get(api.LABEL_PARENT)
            if parent:
                schedule.queue.add((key[0], parent))
            schedule.queue.add(key)
            return
        try:
            run = decide.RunView.from_body(body)
        except Exception:  # the API server validated it; a reconcile reports whatever is wrong
            schedule.queue.add(key)
            return
        self._tell_parent(run)  # the parent may be ours when the child is not
        if not schedule.mine(key):
            schedule.due(key, run)
            return
        schedule.due(key, None)
        now = api.now()
        self.executor.observe(run, now)
        if schedule.still_quiet(key, run, version, now):
            return
        if schedule.first_look_possible(key):
            if decide.related_names(run) or self.executor.involves_integration(body):
                schedule.first_look[key] = body  # it reads its relations or an integration: reconcile takes it
            else:
                try:
                    if self._settle_unread(key, run, now):
                        return
                except Exception:  # the reconcile, on fresh reads, says what is wrong and retries
                    log.debug("%s/%s: the first look failed; reconciling", *key, exc_info=True)
        schedule.queue.add(key)

    def _settle_unread(self, key: Key, run: decide.RunView, now: datetime) -> bool:
        """The first look at a run with no pod, no relations and no integration's objects: decided on the watched
        body alone, here, so that nothing is held or read for it. True if it settled; False if it would act: it
        is then decided again on fresh reads. An operator (re)starting with 100,000 waiting runs so neither
        reads them again (two calls each at its client's rate) nor holds their bodies until its workers reach
        them."""
        plan = self.executor.plan_for(key, run, [], now, related={})
        if not plan.empty:
            return False
        self.schedule.succeeded(key)
        self.holds.set_held(key, None)
        until = self.executor.next_wakeup(run, [], now)
        self.schedule.settle(key, run, [], until, now)
        return True

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
            self.schedule.wake_now((child.namespace, parent))

    def pod_changed(self, namespace: str, run_name: str, pod: dict[str, Any] | None = None,
                    deleted: bool = False) -> None:
        """A run's pod (``pod``, from the pod watch) or its Workload changed: decide the run again."""
        key = (namespace, run_name)
        if pod is not None:
            self.schedule.pod_seen(key, pod["metadata"]["name"], deleted)
            self.executor.pods.seen(key, pod, deleted)
        if not self.schedule.mine(key):
            return
        self.schedule.wake_now(key)

    def shards_changed(self, gained: set[int], lost: set[int]) -> None:
        """The keeper took or gave up shards: decide every run of those taken, forget those given up."""
        self.schedule.shards_moved(gained, lost, self._drop)
        self.schedules.shards_changed()

    def _forget(self, key: Key) -> None:
        self.schedule.forget(key)
        self.holds.forget(key)
        self.executor.forget(key)

    def _drop(self, key: Key) -> None:
        """Another replica decides ``key``, or it is gone: drop what this one knew of it."""
        self._forget(key)
        if self.metrics:
            self.metrics.forget_run(*key)

    # --- one run ---------------------------------------------------------------------

    async def reconcile(self, namespace: str, name: str) -> bool:
        """Decide and act until the run settles: False if it did not (it is then tried again later)."""
        started = time.perf_counter()
        key = (namespace, name)
        self.schedule.unsettle(key)
        try:
            # A look is only taken with no pod known, and a pod seen since drops it (Schedule.pod_seen).
            outcome = await self.executor.converge(key, self.schedule.first_look.pop(key, None))
            if outcome is None:
                return False
            if isinstance(outcome, Dropped):
                self._drop(key)
                return True
            if outcome.recheck:
                self.schedule.rechecked.add(key)
            else:
                self.schedule.rechecked.discard(key)
            self.schedule.settle(key, outcome.run, outcome.views, outcome.until, outcome.now)
            return True
        finally:
            if self.metrics:
                self.metrics.observe_reconcile(time.perf_counter() - started)
