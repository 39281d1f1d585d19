"""A long loop that continues as new every ``input.every`` steps, for CLI and display tests."""

from __future__ import annotations

from decimal import Decimal
from typing import Any

from durablerun import DurableContext


def _charge(ctx: DurableContext, n: int) -> int:
    ctx.add_cost(usd=Decimal("0.10"), tokens=5)
    return n


async def loop(ctx: DurableContext, input: dict[str, Any]) -> dict[str, Any]:
    i, total, every = input.get("i", 0), input["total"], input["every"]
    acc = input.get("acc", 0)
    for _ in range(every):
        if i >= total:
            break
        acc += await ctx.step(f"turn-{i}", _charge, ctx, i)
        i += 1
    if i < total:
        await ctx.continue_as_new({**input, "i": i, "acc": acc})
    if input.get("wait"):
        await ctx.wait_for_event("done")
    return {"i": i, "acc": acc}
