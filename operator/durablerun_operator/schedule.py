"""When each run is reconciled: the work queue and its workers, backoff, timers, settled runs, the first look,
and which runs are this replica's.

No decision is made here and no API is called: :class:`Schedule` keeps, per run, what the reconciler needs to
know to leave a run alone until something about it is new (a watch event, its clock running out, a shard
taken over). The reconciler (:mod:`durablerun_operator.reconciler`) asks it and tells it.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any

from durablerun import api
from durablerun_operator import decide, shards, wakeups
from durablerun_operator.workqueue import Key, WorkQueue

if TYPE_CHECKING:
    from durablerun_operator.metrics import RunMetrics

log = logging.getLogger("durablerun.operator")

# Runs reconciled at once. Each reconcile mostly waits on the API server, and a burst of expiring leases (a
# lost node) must not queue one run's detection behind another's restart: a restart is about 16 calls, so
# eight workers carried out 3 a second at 5,000 runs, and 250 leases lapsing within 44 s were restarted up to
# 39 s late (docs/operator.md, "Sizing"). handlers.py keeps a connection for each.
WORKERS = 32
# A reconcile that failed (an API error, say) is tried again after this, doubling up to RETRY_MAX.
RETRY_FIRST, RETRY_MAX = 0.5, 60.0
MIN_WAKE = timedelta(seconds=1)


class Schedule:
    def __init__(self, stuck_seconds: float, metrics: RunMetrics | None = None,
                 keeper: shards.Keeper | None = None) -> None:
        self._stuck_seconds, self._metrics = stuck_seconds, metrics
        self.queue = WorkQueue()
        self._failures: dict[Key, int] = {}  # reconciles in a row that raised: the retry's backoff
        self.timers: dict[Key, asyncio.TimerHandle] = {}
        # Runs whose last reconcile found nothing to do and whose pods have not changed since; for them a new
        # version of the run (a lease renewal, say) needs no reconcile unless decide.quiet_until says so.
        self.settled: set[Key] = set()
        # Per settled run: the resourceVersion it settled at (the same version again, from a re-list, is no
        # news), and the moment its pods' clock runs out (a new version of the run does not change that).
        self._settled_version: dict[Key, str] = {}
        self._pods_until: dict[Key, Any] = {}
        # The first look: the names of every run's pods as the pod watch reports them, and the watched body of
        # a queued run whose decision also reads its relations or an integration's objects. A run with no pod
        # is first decided on the watched body alone, with no read (at sight in the reconciler's run_changed, or
        # in its reconcile when it has relations); only a plan that would act is decided again on fresh reads.
        # So an operator (re)starting with 100,000 waiting runs reads none of them again, rather than two
        # calls each at its client's rate.
        self.first_look: dict[Key, dict[str, Any]] = {}
        self._pods_of: dict[Key, set[str]] = {}
        # Runs an integration asked to look at again although nothing watched changes (a Kueue run whose
        # WorkloadPriorityClass does not exist): a new version of one is decided at once, although such a
        # run is otherwise woken only by what the integration watches.
        self.rechecked: set[Key] = set()
        # With more than one replica, the shards this one holds (shards.py); None: every run is ours.
        self.keeper = keeper
        self._uids: dict[Key, str] = {}  # every run seen, ours or not: which to decide when a shard comes
        # Runs of other replicas' shards: when each must be decided (decide.quiet_until as last seen; None:
        # now), so that a shard taken over has its overdue runs (a lapsed lease) decided first.
        self._due: dict[Key, datetime | None] = {}

    # --- workers and backoff -----------------------------------------------------------

    async def run_workers(self, reconcile: Callable[[str, str], Awaitable[bool]]) -> None:
        await asyncio.gather(*(self._worker(reconcile) for _ in range(WORKERS)))

    async def _worker(self, reconcile: Callable[[str, str], Awaitable[bool]]) -> None:
        while True:
            key = await self.queue.get()
            try:
                settled = await reconcile(*key)
            except Exception:
                if self._metrics:
                    self._metrics.record_reconcile_error()
                log.exception("reconcile of %s/%s failed; it is retried in %.1fs", *key, self.retry(key))
            else:
                if settled:
                    self._failures.pop(key, None)
                else:
                    self.retry(key)
            finally:
                self.queue.done(key)

    def retry(self, key: Key) -> float:
        """Decide ``key`` again after a backoff that doubles with each failure in a row (the watch may come first)."""
        failures = self._failures[key] = self._failures.get(key, 0) + 1
        delay = min(RETRY_FIRST * 2.0 ** (failures - 1), RETRY_MAX)
        self._cancel_timer(key)
        self.timers[key] = asyncio.get_running_loop().call_later(delay, self._wake, key)
        return delay

    def succeeded(self, key: Key) -> None:
        """A decision of ``key`` settled it: the next failure backs off from the start."""
        self._failures.pop(key, None)

    # --- settled runs and their timers ---------------------------------------------------

    def settled_at(self, key: Key, version: str | None) -> bool:
        """``key`` settled at this very ``version``: a re-list of it (kopf's, or the resync) is no news."""
        return key in self.settled and version is not None and self._settled_version.get(key) == version

    def still_quiet(self, key: Key, run: decide.RunView, version: str | None, now: datetime) -> bool:
        """A new ``version`` of a settled run changes nothing before its clock or its pods' runs out: True if it
        is left to its timer (set again for the moment the new version gives)."""
        quiet = wakeups.combine(decide.quiet_until(run), self._pods_until.get(key))
        if key in self.settled and key not in self.rechecked and self._wake_at(key, quiet, now):
            if version is not None:
                self._settled_version[key] = version
            return True
        return False

    def settle(self, key: Key, run: decide.RunView, views: list[decide.PodView], until: datetime,
               now: datetime) -> None:
        """Nothing happens to the run before ``until`` or a watch event."""
        self.settled.add(key)
        self._settled_version[key] = run.body["metadata"].get("resourceVersion", "")
        self._pods_until[key] = wakeups.pods_until(views, self._stuck_seconds)
        # A moment already past means decide and the wake-up disagree: look again soon, not in a loop.
        self._wake_at(key, max(until, now + MIN_WAKE), now)

    def unsettle(self, key: Key) -> None:
        self.settled.discard(key)
        self._settled_version.pop(key, None)
        self._pods_until.pop(key, None)

    def wake_now(self, key: Key) -> None:
        """Something the run's settling did not know changed: decide it again, now."""
        self.unsettle(key)
        self.queue.add(key)

    def _wake_at(self, key: Key, until: Any, now: Any) -> bool:
        """Reconcile ``key`` once ``until`` has passed; False if it has (or is None): reconcile it now."""
        if until is None or until <= now:
            return False
        self._cancel_timer(key)
        if until != decide.NEVER:
            delay = (until - now).total_seconds() + 0.05  # decide's deadlines are strict: be just past them
            self.timers[key] = asyncio.get_running_loop().call_later(delay, self._wake, key)
        return True

    def _wake(self, key: Key) -> None:
        self.timers.pop(key, None)
        self.queue.add(key)

    def _cancel_timer(self, key: Key) -> None:
        timer = self.timers.pop(key, None)
        if timer is not None:
            timer.cancel()

    # --- the first look --------------------------------------------------------------------

    def first_look_possible(self, key: Key) -> bool:
        """No pod of ``key`` is known and no reconcile of it is queued or under way: its watched body may be
        decided alone."""
        return key not in self._pods_of and not self.queue.busy(key)

    def pod_seen(self, key: Key, pod: str, deleted: bool) -> None:
        """The pod watch reported ``pod`` of ``key``: a first look taken before it is void."""
        names = self._pods_of.setdefault(key, set())
        (names.discard if deleted else names.add)(pod)
        if not names:
            del self._pods_of[key]
        self.first_look.pop(key, None)

    # --- more than one replica (shards.py) ---------------------------------------------

    def seen(self, key: Key, body: dict[str, Any], deleted: bool) -> None:
        """A version of a run, ours or not: keep its uid, to know its shard."""
        if self.keeper is None:
            return
        if deleted:
            self._uids.pop(key, None)
            self._due.pop(key, None)
        elif uid := body["metadata"].get("uid"):
            self._uids[key] = uid

    def mine(self, key: Key, uid: str | None = None) -> bool:
        """Whether this replica decides ``key`` now (a run not seen yet is read first, then judged)."""
        if self.keeper is None:
            return True
        uid = uid or self._uids.get(key)
        return uid is None or self.keeper.owns(uid)

    def due(self, key: Key, run: decide.RunView | None) -> None:
        """``run`` is another replica's (None: ours after all): when it must be decided if its shard comes."""
        if run is None:
            self._due.pop(key, None)
        elif self.keeper is not None:
            self._due[key] = decide.quiet_until(run)

    def shards_moved(self, gained: set[int], lost: set[int], forget: Callable[[Key], None]) -> None:
        """The keeper took ``gained`` and gave up ``lost``: ``forget`` every run of those lost, and decide every
        run of those taken (its pods may have changed unseen), the overdue ones first."""
        assert self.keeper is not None
        now = api.now()
        taken = []
        for key, uid in list(self._uids.items()):
            shard = self.keeper.shard_of(uid)
            if shard in gained:
                taken.append(key)
            elif shard in lost:
                forget(key)
        dues = {key: self._due.pop(key, None) for key in taken}
        for key in sorted(taken, key=lambda k: (due := dues[k]) is not None and due > now):
            self.wake_now(key)

    def forget(self, key: Key) -> None:
        """Drop what is scheduled for ``key`` (deleted, or another replica's now)."""
        self.unsettle(key)
        self._failures.pop(key, None)
        self.rechecked.discard(key)
        self.first_look.pop(key, None)
        self._cancel_timer(key)
