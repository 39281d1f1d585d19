"""The reconciler's work queue, its API rate limiter and the threads its API calls run on (the
controller-runtime and client-go patterns).

The queue gives each run at most one reconcile at a time in this process and
folds bursts of events into one pass. Correctness never depends on that: every
status write is guarded, so two operators acting on one run still produce one
attempt per epoch.
"""

from __future__ import annotations

import asyncio
import itertools
import time
from collections import deque
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any, TypeVar

Key = tuple[str, str]  # (namespace, name)
T = TypeVar("T")


class RateLimiter:
    """A token bucket, as client-go's: ``qps`` requests a second on average, ``burst`` at once after a lull."""

    def __init__(self, qps: float, burst: int, clock: Callable[[], float] = time.monotonic) -> None:
        self.qps, self.burst, self._clock = qps, burst, clock
        self._tokens, self._last = float(burst), clock()

    def _refill(self) -> None:
        now = self._clock()
        self._tokens, self._last = min(float(self.burst), self._tokens + (now - self._last) * self.qps), now

    def reserve(self) -> float:
        """Take one token: the seconds to wait before the request it stands for may be sent."""
        self._refill()
        self._tokens -= 1.0
        return max(0.0, -self._tokens / self.qps)

    def take_now(self) -> bool:
        """Take one token if there is one now (True); else take none."""
        self._refill()
        if self._tokens < 1.0:
            return False
        self._tokens -= 1.0
        return True


class Calls:
    """The reconciler's API calls, paced by one :class:`RateLimiter`. They block: they run on ``threads`` threads
    of our own, as many as the workers (the default pool has cpu+4 threads, shared with everything else in the
    process).

    While calls wait for the limiter, an ``urgent`` one goes before every other that waits (then first come,
    first served): a call that is late the moment it waits (a schedule's tick) is not held behind a fleet's
    pod starts."""

    def __init__(self, qps: float, burst: int, threads: int) -> None:
        self._limiter = RateLimiter(qps, burst)
        self._pool = ThreadPoolExecutor(max_workers=threads, thread_name_prefix="durablerun-kube")
        self._waiting: dict[bool, deque[asyncio.Future[None]]] = {True: deque(), False: deque()}
        self._pacer: asyncio.Task[None] | None = None

    async def __call__(self, fn: Callable[..., T], *args: Any, urgent: bool = False) -> T:
        if self._waiting[True] or self._waiting[False] or not self._limiter.take_now():
            turn: asyncio.Future[None] = asyncio.get_running_loop().create_future()
            self._waiting[urgent].append(turn)
            if self._pacer is None or self._pacer.done():
                self._pacer = asyncio.ensure_future(self._pace())
            await turn
        return await asyncio.get_running_loop().run_in_executor(self._pool, fn, *args)

    async def _pace(self) -> None:
        """Let the waiting calls go one token at a time, the urgent ones first."""
        while self._waiting[True] or self._waiting[False]:
            delay = self._limiter.reserve()
            if delay:
                await asyncio.sleep(delay)
            waiting = self._waiting[True] or self._waiting[False]
            while waiting and waiting[0].cancelled():
                waiting.popleft()  # its caller was cancelled: the token goes to the next
            if waiting:
                waiting.popleft().set_result(None)


class WorkQueue:
    """Deduplicating queue: a key queued twice is reconciled once; one worker per key at a time.

    Two lanes: a key added ``urgent`` is served before every key added without (the schedules' timers: a tick
    due goes ahead of passes that only re-read a run's phase change). Within a lane, first come first served.
    A key already queued and added urgent moves to the urgent lane (its earlier entry is skipped when met).
    """

    URGENT, NORMAL = 0, 1

    def __init__(self) -> None:
        # (lane, arrival, key): an entry only says "look at key"; ``_dirty`` says whether it is still queued.
        self._queue: asyncio.PriorityQueue[tuple[int, int, Key]] = asyncio.PriorityQueue()
        self._arrivals = itertools.count()
        self._dirty: dict[Key, int] = {}  # queued key -> its lane
        self._active: set[Key] = set()

    def add(self, key: Key, urgent: bool = False) -> None:
        lane = self.URGENT if urgent else self.NORMAL
        if self._dirty.get(key, self.NORMAL + 1) <= lane:
            return  # queued already, in this lane or ahead of it
        self._dirty[key] = lane
        if key not in self._active:
            self._put(key)

    def busy(self, key: Key) -> bool:
        """Queued or being reconciled."""
        return key in self._dirty or key in self._active

    async def get(self) -> Key:
        while True:
            _, _, key = await self._queue.get()
            if key in self._dirty and key not in self._active:
                break  # else an entry left behind by a move to the urgent lane, or by a key served since
        del self._dirty[key]
        self._active.add(key)
        return key

    def done(self, key: Key) -> None:
        self._active.discard(key)
        if key in self._dirty:  # changed again while we worked on it
            self._put(key)

    def _put(self, key: Key) -> None:
        self._queue.put_nowait((self._dirty[key], next(self._arrivals), key))
