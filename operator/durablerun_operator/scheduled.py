"""DurableRunSchedules (durablerun.schedules): watched, each looked at when it or one of its runs changes and at
its next tick, its plan (``ticks.decide``, pure) carried out through ``kube``.

One pass over a schedule reads it and the runs it owns, decides, then acts in a fixed order: abort the runs
Replace ends, create the tick's run (a create refused with 409 means the tick already fired: its name is the
tick's), delete the runs past the history limits, write the status, post the Events. Then one timer, at the
next tick; a timer's pass goes ahead of those queued by runs' changes. A pass that fails is tried again after a
backoff. An operator that starts (or restarts) lists every schedule through its watch, and each is looked at
once: the most recent tick it missed fires then, once. With shards, a schedule is decided by the replica
holding its uid's shard.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

from durablerun import api
from durablerun_operator import builders, shards, ticks
from durablerun_operator.kube import Kube
from durablerun_operator.workqueue import Calls, Key, WorkQueue

log = logging.getLogger("durablerun.operator.schedules")

#: Schedules looked at at once.
WORKERS = 2
#: A failed pass is tried again after this long, doubling up to the maximum.
BACKOFF_SECONDS, BACKOFF_MAX_SECONDS = 1.0, 60.0
#: A timer fires this long after the tick, so that the clock read then is past it.
TIMER_MARGIN_SECONDS = 0.05


class ScheduledRuns:
    def __init__(self, kube: Kube, call: Calls, keeper: shards.Keeper | None = None) -> None:
        """``keeper``: the shard keeper with more than one replica (None: this replica decides every schedule)."""
        self._kube, self._call, self._keeper = kube, call, keeper
        self.queue = WorkQueue()
        self._timers: dict[Key, asyncio.TimerHandle] = {}
        self._failures: dict[Key, int] = {}
        self._uids: dict[Key, str] = {}
        self._runs_seen: dict[Key, tuple[Any, ...]] = {}  # a run of a schedule -> (phase, deleting)

    # --- news -------------------------------------------------------------------------

    def schedule_changed(self, body: dict[str, Any], deleted: bool = False) -> None:
        meta = body["metadata"]
        key = (meta["namespace"], meta["name"])
        if deleted:
            self._forget(key)
            return
        self._uids[key] = meta.get("uid", "")
        self.queue.add(key)

    def run_changed(self, body: dict[str, Any], deleted: bool = False) -> None:
        """A run changed: its schedule, if it has one, is looked at when the run's phase changed or it went."""
        meta = body["metadata"]
        schedule = (meta.get("labels") or {}).get(api.LABEL_SCHEDULE)
        if not schedule:
            return
        key = (meta["namespace"], meta["name"])
        seen = ((body.get("status") or {}).get("phase"), bool(meta.get("deletionTimestamp")))
        if deleted:
            self._runs_seen.pop(key, None)
        elif self._runs_seen.get(key) == seen:
            return  # a lease renewal, progress: nothing the schedule decides on
        else:
            self._runs_seen[key] = seen
        self.queue.add((meta["namespace"], schedule))

    def shards_changed(self) -> None:
        """Shards moved: look at every schedule again (those now another replica's are left alone)."""
        for key in self._uids:
            self.queue.add(key)

    def _forget(self, key: Key) -> None:
        timer = self._timers.pop(key, None)
        if timer is not None:
            timer.cancel()
        self._uids.pop(key, None)
        self._failures.pop(key, None)

    def _mine(self, uid: str) -> bool:
        return self._keeper is None or self._keeper.owns(uid)

    # --- passes ------------------------------------------------------------------------

    async def run_workers(self) -> None:
        await asyncio.gather(*(self._worker() for _ in range(WORKERS)))

    async def _worker(self) -> None:
        while True:
            key = await self.queue.get()
            try:
                await self.reconcile(key)
                self._failures.pop(key, None)
            except asyncio.CancelledError:
                raise
            except Exception:
                failures = self._failures[key] = self._failures.get(key, 0) + 1
                delay = min(BACKOFF_SECONDS * 2 ** (failures - 1), BACKOFF_MAX_SECONDS)
                log.exception("schedule %s/%s: the pass failed; trying again in %.0fs", *key, delay)
                self._wake(key, delay)
            finally:
                self.queue.done(key)

    async def reconcile(self, key: Key) -> None:
        namespace, name = key
        body = await self._call(self._kube.get_schedule, namespace, name)
        if body is None:
            self._forget(key)
            return
        uid = body["metadata"]["uid"]
        self._uids[key] = uid
        if not self._mine(uid):
            return
        owned = [run for run in await self._call(self._kube.list_scheduled_runs, namespace, name)
                 if any(ref.get("uid") == uid for ref in run["metadata"].get("ownerReferences") or [])]
        now = api.now()
        plan = ticks.decide(body, [ticks.RunView.from_body(run) for run in owned], now)
        if not self._mine(uid):  # the shard moved while we read: act on nothing
            return
        for run in plan.abort:
            await self._call(self._kube.merge_patch_run, namespace, run,
                             {"metadata": {"annotations": {api.ANNOTATION_ABORT: plan.abort_reason}}})
        if plan.create is not None:
            run_body = builders.scheduled_run(body, plan.create)
            run_name = run_body["metadata"]["name"]
            if await self._call(self._kube.create_run, run_body):
                plan.events.append(("Normal", "RunCreated",
                                    f"created {run_name} for the tick of {api.format_time(plan.create)}"))
            else:
                log.info("schedule %s/%s: %s exists already: the tick fired before", namespace, name, run_name)
        for run, run_uid in plan.delete:
            await self._call(self._kube.delete_run, namespace, run, run_uid)
            plan.events.append(("Normal", "RunDeleted", f"deleted {run}: past the schedule's history limit"))
        if plan.status_changed:
            await self._call(self._kube.patch_schedule_status, namespace, name, plan.status)
        for kind, reason, message in plan.events:
            await self._call(self._kube.post_schedule_event, body, kind, reason, message)
        if plan.wake is not None:
            self._wake(key, (plan.wake - api.now()).total_seconds() + TIMER_MARGIN_SECONDS)

    def _wake(self, key: Key, delay: float) -> None:
        """One timer per schedule: look at it again in ``delay`` seconds, ahead of the schedules queued by their
        runs' changes (a tick is due then: its run is what a pass is late for)."""
        timer = self._timers.pop(key, None)
        if timer is not None:
            timer.cancel()
        self._timers[key] = asyncio.get_running_loop().call_later(max(delay, 0.0), self.queue.add, key, True)
