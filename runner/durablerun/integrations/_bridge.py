"""Steps from tasks a library starts, journaled in the workflow's own task, one at a time.

Agent frameworks run their work in tasks of their own (pydantic-graph runs
every node of an agent run in an anyio task). ``ctx.step`` refuses to take a
journal position there, because positions taken by racing tasks would depend
on timing. The bridge keeps positions deterministic another way: the library
runs in a child task while the workflow's task serves its step requests in
the order they arrive, and refuses a request that arrives while another step
is still running (two at once would race for the next position). Libraries
whose durable operations are sequential (pydantic-ai with sequential tool
calls, which the integration sets) journal exactly as if the workflow had
called ``ctx.step`` itself.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Coroutine
from contextvars import ContextVar
from typing import Any, TypeVar

from durablerun import errors
from durablerun._private.engine.context import DurableContext
from durablerun._private.engine.halts import Halt

T = TypeVar("T")

#: The bridge of the library run in progress (None: not inside one).
CURRENT: ContextVar[Bridge | None] = ContextVar("durablerun_bridge", default=None)


class Bridge:
    def __init__(self, ctx: DurableContext, library: str) -> None:
        self.ctx = ctx
        self.library = library
        self._owner: asyncio.Task[Any] | None = None
        self._requests: asyncio.Queue[tuple[str, Callable[[], Awaitable[Any]], int | None,
                                            asyncio.Future[Any]]] = asyncio.Queue()
        self._running: str | None = None
        #: The library's tasks awaiting a step: ended with the library's run, never left running.
        self._waiters: set[asyncio.Task[Any]] = set()
        #: The first attempt-ending signal a step raised, re-raised whatever the library made of it.
        self.halt: Halt | None = None

    async def step(self, name: str, fn: Callable[[], Awaitable[T]], *, retries: int | None = None) -> T:
        """``ctx.step(name, fn)`` from any task of the library run."""
        if asyncio.current_task() is self._owner:
            return await self._guarded(self.ctx.step(name, fn, retries=retries))
        if self._running is not None:
            raise errors.NonRetryableError(
                f"{self.library} started durable operation {name!r} while {self._running!r} was still "
                "running: concurrent operations would take journal positions in a timing-dependent "
                "order. Run them one at a time (docs/agents.md).")
        ready: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        self._running = name
        waiter = asyncio.current_task()
        if waiter is not None:
            self._waiters.add(waiter)
        step: Coroutine[Any, Any, T] | None = None
        try:
            self._requests.put_nowait((name, fn, retries, ready))
            step = await ready
            return await self._guarded(step)
        except asyncio.CancelledError:
            if step is None and ready.done() and not ready.cancelled():
                ready.result().close()  # cancelled between its position and its start: never ran
            raise
        finally:
            self._running = None
            self._waiters.discard(waiter)

    async def _guarded(self, coro: Awaitable[T]) -> T:
        try:
            return await coro
        except Halt as h:
            if self.halt is None:
                self.halt = h
            raise

    async def run(self, coro: Coroutine[Any, Any, T]) -> T:
        """Run ``coro`` (the library's run) and serve its step requests until it ends."""
        self._owner = asyncio.current_task()
        token = CURRENT.set(self)
        try:
            task: asyncio.Task[T] = asyncio.ensure_future(coro)
        finally:
            CURRENT.reset(token)
        try:
            while True:
                get = asyncio.ensure_future(self._requests.get())
                done, _ = await asyncio.wait({task, get}, return_when=asyncio.FIRST_COMPLETED)
                if get in done:
                    name, fn, retries, ready = get.result()
                    # The position is taken here, in the workflow's task; the library's task awaits it.
                    ready.set_result(self.ctx.step(name, fn, retries=retries))
                else:
                    get.cancel()
                if task in done:
                    break
            try:
                return task.result()
            except BaseException:
                if self.halt is not None:
                    raise self.halt from None
                raise
        finally:
            # A step the library left running (its run failed meanwhile) ends with it, as a cancelled step.
            stray = [t for t in (task, *self._waiters) if not t.done()]
            for t in stray:
                t.cancel()
            await asyncio.gather(*stray, return_exceptions=True)
