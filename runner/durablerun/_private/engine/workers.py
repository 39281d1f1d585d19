"""Invoking step functions: async ones on the loop, sync ones on worker threads (runtime layer)."""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import inspect
import os
import queue
import sysconfig
import threading
import traceback
from collections.abc import Callable
from typing import Any


class StepThreads:
    """Runs sync step functions on daemon threads and hands each outcome straight to the loop.

    One ``SimpleQueue`` in, one ``call_soon_threadsafe`` out. Compared with a
    ThreadPoolExecutor behind ``asyncio.wrap_future`` a step skips the
    concurrent Future (a Condition per call, its callbacks, the executor's
    idle semaphore), and the worker goes straight back to blocking after it
    posts the outcome, so the loop thread it woke rarely has to wait for the
    GIL. A worker is started when none is idle (up to ``max_threads``), so
    steps started together (``ctx.gather``) run in parallel. A step whose
    awaiting task was cancelled (a stop's grace period ran out) is abandoned:
    its thread finishes on its own and its outcome is dropped. The threads are
    daemons: they never keep a finished process alive.
    """

    def __init__(self, max_threads: int, in_threads: bool = True) -> None:
        #: Whether sync step functions run on the threads (EngineConfig.sync_steps_in_threads).
        self._in_threads = in_threads
        self._queue: queue.SimpleQueue[_Job | None] = queue.SimpleQueue()
        self._max = max(1, max_threads)
        self._started = 0
        #: One token per idle worker (list append/pop are atomic under the GIL).
        self._idle: list[None] = []
        self._closed = False

    async def invoke(self, fn: Callable[..., Any], args: tuple[Any, ...],
                     kwargs: dict[str, Any]) -> Any:
        """``fn(*args, **kwargs)``, awaited: on the loop when async, else on a worker thread."""
        if _is_async(fn):
            return await fn(*args, **kwargs)
        if self._in_threads:
            result = await self.submit(fn, args, kwargs)
        else:
            result = fn(*args, **kwargs)
        if inspect.isawaitable(result):
            result = await result
        return result

    def submit(self, fn: Callable[..., Any], args: tuple[Any, ...],
               kwargs: dict[str, Any]) -> asyncio.Future[Any]:
        """Start ``fn(*args, **kwargs)`` on a worker thread; call on the loop's thread."""
        loop = asyncio.get_running_loop()
        fut: asyncio.Future[Any] = loop.create_future()
        if self._closed:
            fut.cancel()
            return fut
        try:
            self._idle.pop()  # an idle worker takes it
        except IndexError:
            if self._started < self._max:
                self._started += 1
                threading.Thread(target=self._work, name=f"durablerun-step-{self._started - 1}",
                                 daemon=True).start()
        self._queue.put((loop, fut, contextvars.copy_context(), fn, args, kwargs))
        return fut

    def _work(self) -> None:
        get, idle = self._queue.get, self._idle
        while True:
            job = get()
            if job is None or self._closed:
                return
            _run_job(job, idle)
            job = None  # nothing of a finished step stays alive while this thread idles

    def close(self) -> None:
        """Stop the idle workers; steps still running finish on their own, unheard."""
        self._closed = True
        for _ in range(self._started):
            self._queue.put(None)


_Job = tuple[asyncio.AbstractEventLoop, "asyncio.Future[Any]", contextvars.Context,
             Callable[..., Any], tuple[Any, ...], dict[str, Any]]


def _run_job(job: _Job, idle: list[None]) -> None:
    loop, fut, ctx, fn, args, kwargs = job
    try:
        outcome: tuple[Any, BaseException | None] = (ctx.run(fn, *args, **kwargs), None)
    except BaseException as e:  # handed to the awaiting step, as a Future would
        outcome = (None, e)
    idle.append(None)  # free again before the loop wakes up and submits the next step
    with contextlib.suppress(RuntimeError):  # a closed loop: its attempt is over
        loop.call_soon_threadsafe(_deliver, fut, outcome)


def _deliver(fut: asyncio.Future[Any], outcome: tuple[Any, BaseException | None]) -> None:
    if fut.done():
        return  # cancelled: the step was abandoned
    value, error = outcome
    if error is None:
        fut.set_result(value)
    else:
        fut.set_exception(error)


_ASYNC_CACHE: dict[Any, bool] = {}


def _is_async(fn: Callable[..., Any]) -> bool:
    try:
        return _ASYNC_CACHE[fn]
    except (KeyError, TypeError):
        result = inspect.iscoroutinefunction(fn)
        try:
            if len(_ASYNC_CACHE) < 4096:
                _ASYNC_CACHE[fn] = result
        except TypeError:
            pass
        return result


_NOT_THE_STEPS = (os.path.dirname(os.path.dirname(os.path.abspath(__file__))) + os.sep,  # the SDK
                  sysconfig.get_paths()["stdlib"] + os.sep)  # asyncio, concurrent.futures, threading


def own_traceback(e: BaseException) -> str:
    """``e``'s traceback in the step function's own frames: without the SDK's and the standard library's."""
    te = traceback.TracebackException.from_exception(e)
    te.stack = traceback.StackSummary.from_list(
        [f for f in te.stack if not f.filename.startswith(_NOT_THE_STEPS)] or list(te.stack))
    return "".join(te.format()).rstrip()
