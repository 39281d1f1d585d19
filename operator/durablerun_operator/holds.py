"""Lease-only restarts held during a mass lease expiry: the state behind :mod:`durablerun_operator.overload`.

The judgement is pure (``overload``); :class:`LeaseHolds` keeps what it is judged on (every active run's lease
as last seen), the runs held, and whether a mass expiry lasts, re-judging it every second until renewals
recover, when the held runs are decided again.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from datetime import datetime
from typing import TYPE_CHECKING

from durablerun import api
from durablerun_operator import decide, overload
from durablerun_operator.config import Settings
from durablerun_operator.kube import Kube
from durablerun_operator.workqueue import Calls, Key

if TYPE_CHECKING:
    from durablerun_operator.metrics import RunMetrics

log = logging.getLogger("durablerun.operator")

# While leases lapse en masse, the judgement is made again this often, to see renewals recover.
OVERLOAD_CHECK_SECONDS = 1.0
# While renewals fall behind (overload.pace_starts), the operator starts at most this many pods a second.
PACED_STARTS_PER_SECOND = 2.0


class LeaseHolds:
    def __init__(self, kube: Kube, settings: Settings, call: Calls, wake: Callable[[Key], None],
                 metrics: RunMetrics | None = None) -> None:
        """``wake``: decide a held run again (once the mass expiry is over)."""
        self._kube, self._call, self._wake, self._metrics = kube, call, wake, metrics
        self._policy = overload.Policy(settings.mass_expiry_fraction, settings.mass_expiry_min_runs)
        # Every active run's lease as last seen, the runs whose lease-only restart is held, and when the last
        # mass expiry ended.
        self.leases: dict[Key, overload.Lease] = {}
        self._held: set[Key] = set()
        self._held_told: set[tuple[Key, str]] = set()  # (run, its uid) told by an Event in this mass expiry
        self._mass_expiry: overload.Judgement | None = None  # set while one lasts
        self._judged_at: float | None = None  # time.monotonic() of the last judgement
        self._recovered_at: datetime | None = None
        self._tasks: set[asyncio.Task[None]] = set()  # strong references to background tasks
        self._last: overload.Judgement | None = None  # the last judgement, mass expiry or not
        self._pacing = False  # starts are paced (renewals fall behind)
        self._next_start = 0.0  # time.monotonic() of the next paced start's turn
        self._turns: dict[Key, float] = {}  # runs told to wait for their paced start: its turn

    def observe(self, run: decide.RunView, pods: list[decide.PodView] | None = None) -> None:
        """Keep the run's lease for the judgement. ``pods``: read with it (the watch has none), for the start of
        an attempt that has not acquired its lease yet."""
        run_key, status = (run.namespace, run.name), run.status
        running_since = next((p.running_since for p in pods or [] if p.epoch == status.epoch), None)
        active = overload.active_lease(run, running_since)
        kept = self.leases.get(run_key)
        if active is not None:
            self.leases[run_key] = active
        elif not (pods is None and kept is not None and kept.epoch == status.epoch
                  and status.phase == api.Phase.RUNNING):  # the watch has no pods: the start read with them stands
            self.leases.pop(run_key, None)

    async def hold(self, run: decide.RunView, plan: decide.Plan, now: datetime) -> datetime | None:
        """Until when ``plan`` must wait because it restarts on the lease alone during (or just after) a mass
        expiry; None: carry it out."""
        key = (run.namespace, run.name)
        until = None
        if plan.restart_reason == api.RestartReason.LEASE_EXPIRED.value:
            judgement = self._judge(now)
            until = overload.hold_until(plan.restart_reason, self.leases.get(key), now,
                                        mass_expiry=judgement is not None, recovered_at=self._recovered_at)
            if until is not None and judgement is not None and (key, run.uid) not in self._held_told:
                self._held_told.add((key, run.uid))
                message = (f"the lease of pod {run.status.pod} lapsed, but {judgement.late} of {judgement.active} "
                           "active runs' leases are late at once: the API server or the operator is slow, not "
                           "the runners. Its restart is held until renewals recover; a pod seen dead is still "
                           "restarted at once")
                log.warning("%s/%s LeaseExpiryHeld: %s", *key, message)
                await self._call(self._kube.post_event, run.body, "Warning", "LeaseExpiryHeld", message)
        self.set_held(key, until)
        return until

    def pace(self, run: decide.RunView, plan: decide.Plan, now: datetime) -> float:
        """Seconds until ``plan`` may start its pod (0: now), so that while renewals fall behind first attempts
        come at PACED_STARTS_PER_SECOND and the running runs' renewals get the API server first. A run told to
        wait keeps its turn and is decided again then: no worker sleeps through it, so the status writes of
        other runs (a lapsed lease's restart) are not queued behind the paced starts.

        Only a run's first attempt is paced. A later one (a restart, a wake, a resume) is a run already in the
        fleet going on: its runner was gone or it waited with none, and it must not queue behind a wave of new
        runs that nobody waits for yet."""
        if plan.create_pod_epoch is None or run.status.attempt > 0:
            return 0.0
        key = (run.namespace, run.name)
        self._judge(now)
        pacing = self._last is not None and overload.pace_starts(self._last)
        if pacing != self._pacing:
            self._pacing = pacing
            if self._last is not None:
                log.warning("%d of %d active runs' leases are behind: pod starts %s", self._last.behind,
                            self._last.active,
                            f"paced to {PACED_STARTS_PER_SECOND:g} a second" if pacing else "at full rate again")
            if self._metrics:
                self._metrics.set_starts_paced(pacing)
        if not pacing:
            self._turns.clear()
            return 0.0
        mono = time.monotonic()
        turn = self._turns.get(key)
        if turn is None:
            turn = self._turns[key] = max(mono, self._next_start)
            self._next_start = turn + 1 / PACED_STARTS_PER_SECOND
        if turn <= mono:
            del self._turns[key]
            return 0.0
        return turn - mono

    def set_held(self, key: Key, until: datetime | None) -> None:
        if until is None:
            self._held.discard(key)
        else:
            self._held.add(key)
        if self._metrics:
            self._metrics.set_lease_restarts_held(len(self._held))

    def deleted(self, key: Key) -> None:
        """The run is gone: its lease no longer counts (it stays held until decided again or forgotten)."""
        self.leases.pop(key, None)

    def forget(self, key: Key) -> None:
        self.leases.pop(key, None)
        self._held.discard(key)
        self._turns.pop(key, None)

    def _judge(self, now: datetime, *, fresh: bool = False) -> overload.Judgement | None:
        """The mass expiry under way (None: none), judged over every active lease at most once per
        OVERLOAD_CHECK_SECONDS: entering one starts a task that judges every second until it ends."""
        mono = time.monotonic()
        if not fresh and self._judged_at is not None and mono - self._judged_at < OVERLOAD_CHECK_SECONDS:
            return self._mass_expiry
        self._judged_at = mono
        judgement = overload.judge(self.leases.values(), now, self._policy, holding=self._mass_expiry is not None)
        self._last = judgement
        if judgement.mass_expiry:
            if self._mass_expiry is None:
                log.warning("mass lease expiry: %d of %d active runs' leases are late at once; restarts that "
                            "rest only on the lease are held until renewals recover", judgement.late,
                            judgement.active)
                if self._metrics:
                    self._metrics.set_mass_lease_expiry(True)
                task = asyncio.get_running_loop().create_task(self._until_recovered(), name="mass-expiry")
                self._tasks.add(task)
                task.add_done_callback(self._tasks.discard)
            self._mass_expiry = judgement
        elif self._mass_expiry is not None:
            # Renewals recovered: every held run is decided again, and each lease renewed before now gets
            # a full validity from now (overload.hold_until) before it counts as expired.
            log.warning("mass lease expiry over: %d of %d active leases late; %d held runs are decided again",
                        judgement.late, judgement.active, len(self._held))
            self._mass_expiry, self._recovered_at = None, now
            self._held_told.clear()
            if self._metrics:
                self._metrics.set_mass_lease_expiry(False)
            for key in sorted(self._held):
                self._wake(key)
        return self._mass_expiry

    async def _until_recovered(self) -> None:
        while self._mass_expiry is not None:
            await asyncio.sleep(OVERLOAD_CHECK_SECONDS)
            self._judge(api.now(), fresh=True)
