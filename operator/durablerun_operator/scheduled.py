"""DurableRunSchedules (durablerun.schedules): watched, each looked at when it or one of its runs changes and at its
next tick, its plan (``ticks.decide``, pure) carried out through ``kube``.

A pass does not read what the watches tell: it decides from the schedule's latest body from its watch (with the
status the last pass wrote, until the watch tells that write) and from an index of the schedule's runs (the runs'
watch, by namespace and schedule label, deletions included, and the pass's own creates and deletes). Only the first
pass of a schedule since the operator started (or since a pass of it failed) LISTs its runs, as the runs' watch may
not have told them all yet, and so does the next pass after the resync found a run's version the watch had not told
(the resync's bodies are not kept: its LIST may predate what the watch told while it was read); a schedule no watch
event told, or one told deleted, is not looked at. The pass then acts in a fixed order: abort the runs Replace ends,
create the tick's run (a create refused with 409 means the tick already fired: its name is the tick's), delete the
runs past the history limits, write the status, set one timer at the next tick, post the Events. A timer's pass goes
ahead of those queued by runs' changes (the work queue's urgent lane), and a pass's API calls go ahead of the run
reconciler's that wait for the rate limit with them: at a tick of many schedules, the new runs' phase changes and
pod starts must not delay the next schedules' creates. A pass that fails is tried again after a backoff. An
operator that starts (or restarts) lists every schedule through its watch, and each is looked at once: the most
recent tick it missed fires then, once. With shards, a schedule is decided by the replica holding its uid's shard.
"""

from __future__ import annotations

import asyncio
import functools
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
        self._kube, self._keeper = kube, keeper
        # A schedule's calls go before the run reconciler's that wait with them: at a tick of many schedules,
        # their runs' creates must not queue behind the pod starts of the runs created first.
        self._call = functools.partial(call, urgent=True)
        self.queue = WorkQueue()
        self._timers: dict[Key, asyncio.TimerHandle] = {}
        self._failures: dict[Key, int] = {}
        #: Each schedule as its watch last told it.
        self._schedules: dict[Key, dict[str, Any]] = {}
        #: The status a pass wrote, until the watch tells that write (by its resourceVersion): until then the
        #: watch's body may predate it, and a pass on it would write older ticks back (and fire a tick again).
        self._written: dict[Key, tuple[str, dict[str, Any]]] = {}
        #: The runs of each schedule (by its label, any owner: the pass keeps its own), by name, as the watch
        #: last told them, and as the pass's own creates and deletes left them.
        self._runs: dict[Key, dict[str, dict[str, Any]]] = {}
        #: A run (namespace, name) -> the schedule whose runs above hold it: if its label changes, it leaves them.
        self._schedule_of: dict[Key, str] = {}
        #: Schedules whose runs were LISTed since this operator started (or their last pass failed).
        self._listed: set[Key] = set()
        #: While a schedule's LIST is under way: the runs the watch told meanwhile (its word is the newer).
        self._listing: dict[Key, set[str]] = {}

    # --- news -------------------------------------------------------------------------

    def schedule_changed(self, body: dict[str, Any], deleted: bool = False) -> None:
        meta = body["metadata"]
        key = (meta["namespace"], meta["name"])
        if deleted:
            self._forget(key)
            return
        written, known = self._written.get(key), self._schedules.get(key)
        if written is not None and (meta.get("resourceVersion") == written[0]
                                    or known is None or known["metadata"].get("uid") != meta.get("uid")):
            del self._written[key]  # the watch caught up with the pass's write (or it is a new schedule)
        self._schedules[key] = body
        self.queue.add(key)

    def run_changed(self, body: dict[str, Any], deleted: bool = False, relisted: bool = False) -> None:
        """A run changed: kept in its schedule's runs; its schedule, if it has one, is looked at when the run's
        phase changed or it went.

        ``relisted``: the body is the resync's, from a LIST that may predate what the watch told while it was
        read: not kept; if it is not the version the watch told, the schedule's next pass LISTs its runs."""
        meta = body["metadata"]
        namespace, name = meta["namespace"], meta["name"]
        schedule = (meta.get("labels") or {}).get(api.LABEL_SCHEDULE)
        if relisted:
            if schedule and meta.get("resourceVersion") != self._runs.get((namespace, schedule), {}).get(
                    name, {}).get("metadata", {}).get("resourceVersion"):
                self._listed.discard((namespace, schedule))
                self.queue.add((namespace, schedule))
            return
        run = (namespace, name)
        was = self._schedule_of.get(run)
        if was is not None and was != schedule:  # its label changed: no longer that schedule's
            self._runs.get((namespace, was), {}).pop(name, None)
            del self._schedule_of[run]
            self.queue.add((namespace, was))
        if not schedule:
            return
        key = (namespace, schedule)
        if key in self._listing:
            self._listing[key].add(name)
        runs = self._runs.setdefault(key, {})
        if deleted:
            runs.pop(name, None)
            self._schedule_of.pop(run, None)
            self.queue.add(key)
            return
        before = runs.get(name)
        runs[name] = body
        self._schedule_of[run] = schedule
        if before is not None and _decides(before) == _decides(body):
            return  # a lease renewal, progress: nothing the schedule decides on
        self.queue.add(key)

    def shards_changed(self) -> None:
        """Shards moved: look at every schedule again (those now another replica's are left alone)."""
        for key, body in self._schedules.items():
            if not self._mine(body["metadata"].get("uid", "")):
                self._written.pop(key, None)  # another replica may write its status now: believe the watch
            self.queue.add(key)

    def _forget(self, key: Key) -> None:
        timer = self._timers.pop(key, None)
        if timer is not None:
            timer.cancel()
        self._schedules.pop(key, None)
        self._written.pop(key, None)
        self._listed.discard(key)
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
                self._listed.discard(key)  # what it read or did may be half known: the next pass lists again
                failures = self._failures[key] = self._failures.get(key, 0) + 1
                delay = min(BACKOFF_SECONDS * 2 ** (failures - 1), BACKOFF_MAX_SECONDS)
                log.exception("schedule %s/%s: the pass failed; trying again in %.0fs", *key, delay)
                self._wake(key, delay)
            finally:
                self.queue.done(key)

    async def reconcile(self, key: Key) -> None:
        namespace, name = key
        body = self._schedules.get(key)
        if body is None:
            return  # not told yet (its watch event queues it) or deleted
        written = self._written.get(key)
        if written is not None:
            body = {**body, "status": written[1]}
        uid = body["metadata"]["uid"]
        if not self._mine(uid):
            return
        if key not in self._listed:
            await self._list_runs(key)
        owned = [run for run in self._runs.get(key, {}).values()
                 if any(ref.get("uid") == uid for ref in run["metadata"].get("ownerReferences") or [])]
        now = api.now()
        plan = ticks.decide(body, [ticks.RunView.from_body(run) for run in owned], now)
        if not self._mine(uid):  # the shard moved while we read: act on nothing
            return
        runs = self._runs.setdefault(key, {})
        for run in plan.abort:  # only with the create of a tick's run: the next pass finds that tick done
            await self._call(self._kube.merge_patch_run, namespace, run,
                             {"metadata": {"annotations": {api.ANNOTATION_ABORT: plan.abort_reason}}})
        if plan.create is not None:
            run_body = builders.scheduled_run(body, plan.create)
            run_name = run_body["metadata"]["name"]
            made = await self._call(self._kube.create_run, run_body)
            if made is not None:
                runs.setdefault(run_name, made)  # the watch may have told it already, and newer
                plan.events.append(("Normal", "RunCreated",
                                    f"created {run_name} for the tick of {api.format_time(plan.create)}"))
            else:
                log.info("schedule %s/%s: %s exists already: the tick fired before", namespace, name, run_name)
        for run, run_uid in plan.delete:
            await self._call(self._kube.delete_run, namespace, run, run_uid)
            runs.pop(run, None)
            plan.events.append(("Normal", "RunDeleted", f"deleted {run}: past the schedule's history limit"))
        if plan.status_changed:
            patched = await self._call(self._kube.patch_schedule_status, namespace, name, plan.status)
            version = (patched or {}).get("metadata", {}).get("resourceVersion")
            told = self._schedules.get(key)
            if version and told is not None and told["metadata"].get("resourceVersion") != version:
                self._written[key] = (version, plan.status)  # else the watch told that write already
        if plan.wake is not None:
            self._wake(key, (plan.wake - api.now()).total_seconds() + TIMER_MARGIN_SECONDS)
        for kind, reason, message in plan.events:
            await self._call(self._kube.post_schedule_event, body, kind, reason, message)

    async def _list_runs(self, key: Key) -> None:
        """The schedule's first pass since the operator started (or since a pass failed): the watch may not
        have told every run yet, so its runs are LISTed; a run the watch told while the LIST was under way is
        kept as the watch told it (newer, or deleted), the others as listed."""
        self._listing[key] = set()
        try:
            listed = await self._call(self._kube.list_scheduled_runs, *key)
        finally:
            told = self._listing.pop(key)
        runs = {run["metadata"]["name"]: run for run in listed if run["metadata"]["name"] not in told}
        runs.update((name, run) for name, run in self._runs.get(key, {}).items() if name in told)
        self._runs[key] = runs
        self._listed.add(key)

    def _wake(self, key: Key, delay: float) -> None:
        """One timer per schedule: look at it again in ``delay`` seconds, ahead of the schedules queued by their
        runs' changes (a tick is due then: its run is what a pass is late for)."""
        timer = self._timers.pop(key, None)
        if timer is not None:
            timer.cancel()
        self._timers[key] = asyncio.get_running_loop().call_later(max(delay, 0.0), self.queue.add, key, True)


def _decides(run: dict[str, Any]) -> tuple[Any, bool]:
    """What of a run its schedule decides on: its phase, and whether it is being deleted."""
    return (run.get("status") or {}).get("phase"), bool(run["metadata"].get("deletionTimestamp"))
