"""The bridge that lets a library's own tasks take step positions (durablerun.integrations._bridge)."""

from __future__ import annotations

import asyncio
from typing import Any

from durablerun import DurableContext, Outcome
from durablerun.integrations._bridge import Bridge
from durablerun.testing import WorkflowTest


async def _slow() -> str:
    await asyncio.sleep(0.05)
    return "done"


def test_steps_from_a_library_task_are_journaled_in_order_and_replayed() -> None:
    ran: list[str] = []

    def work(n: int) -> int:
        ran.append(f"s{n}")
        return n

    async def wf(ctx: DurableContext, input: Any) -> Any:
        bridge = Bridge(ctx, "lib")

        async def library() -> list[int]:
            async def in_own_task(n: int) -> int:  # as pydantic-graph runs each node in a task of its own
                return await bridge.step(f"s{n}", lambda: work(n))
            return [await asyncio.create_task(in_own_task(n)) for n in range(3)]

        out = await bridge.run(library())
        await ctx.wait_for_event("go")
        return out

    t = WorkflowTest(wf)
    assert t.attempt().outcome == Outcome.WAITING
    t.send_event("go")
    assert t.attempt().result == [0, 1, 2]
    assert ran == ["s0", "s1", "s2"]


def test_two_operations_at_once_are_refused_with_the_reason() -> None:
    async def wf(ctx: DurableContext, input: Any) -> Any:
        bridge = Bridge(ctx, "lib")

        async def library() -> list[str]:
            return list(await asyncio.gather(
                asyncio.create_task(bridge.step("first", _slow)), asyncio.create_task(bridge.step("second", _slow))))

        return await bridge.run(library())

    done = WorkflowTest(wf).attempt()
    assert done.outcome == Outcome.FAILED
    assert "lib started durable operation 'second' while 'first' was still running" in (done.message or "")
