"""A supervisor and its workers, for child runs in-process (tests/sdk/test_testing_children.py)."""

from __future__ import annotations

from collections import Counter
from typing import Any

from durablerun import ChildRunFailed, DurableContext, errors

#: Steps executed, by "<run name>:<step>": a step replayed from a journal is not counted again.
calls: Counter[str] = Counter()


async def worker(ctx: DurableContext, input: dict[str, Any]) -> dict[str, Any]:
    me = ctx.run_id.split("/")[1]

    def square(n: int) -> int:
        calls[f"{me}:square"] += 1
        ctx.add_cost(usd=str(input.get("usd", "0")))
        if input.get("fail"):
            raise errors.NonRetryableError(f"cannot square {n}")
        return n * n

    out: dict[str, Any] = {}
    if input.get("wait"):
        out["go"] = await ctx.wait_for_event("go")
    out["sq"] = await ctx.step("square", square, input["n"])
    if input.get("big"):
        out["big"] = "x" * 5000  # above the status' inline result: the parent reads the child's journal
    return out


async def pipeline(ctx: DurableContext, input: dict[str, Any]) -> dict[str, Any]:
    """First child, then (knowing its result) a second that waits for a signal, then a fan-out."""
    first = await ctx.run_child("first", "fanout:worker", {"n": 2})
    second = await ctx.start_child("second", "fanout:worker", {"n": 3, "wait": True})
    await ctx.signal(second.run, "go", {"after": first["sq"]})
    await ctx.signal("nobody", "go", 1)
    fan = [await ctx.start_child(f"w{i}", "fanout:worker", spec) for i, spec in enumerate(input["fan"])]
    results = await ctx.gather(second, *fan, return_exceptions=True)
    return {"first": first, "rest": [
        {"failed": r.phase, "message": r.message, "reason": r.reason} if isinstance(r, ChildRunFailed) else r
        for r in results]}


async def doomed(ctx: DurableContext, input: dict[str, Any]) -> None:
    """Starts a child that waits forever, then fails: the operator aborts the child."""
    await ctx.start_child("waiter", "fanout:worker", {"n": 1, "wait": True})

    def explode() -> None:
        raise errors.NonRetryableError("the supervisor gave up")

    await ctx.step("explode", explode)
