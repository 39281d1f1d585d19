"""A workflow that writes every journal record kind of layout v1 (for tests/sdk/test_golden.py).

Its journal, written by the layout-v1 code, is kept under tests/sdk/golden/: do
not change what this workflow does, or the golden journal no longer fits it.
"""

from __future__ import annotations

from datetime import timedelta
from decimal import Decimal
from typing import Any

from pydantic import BaseModel

from durablerun import DurableContext, NonRetryableError, StepError

#: Step names the workflow executed in this process (a replay executes none).
EXECUTED: list[str] = []


class Finding(BaseModel):
    title: str
    score: float


def _plan(ctx: DurableContext, topic: str) -> list[str]:
    EXECUTED.append("plan")
    ctx.add_cost(usd=Decimal("0.25"), tokens=120)
    return [f"{topic}-a", f"{topic}-b"]


def _finding(title: str) -> Finding:
    EXECUTED.append("finding")
    return Finding(title=title, score=0.5)


def _big(n: int) -> str:
    EXECUTED.append("big")
    return "x" * n


def _broken() -> None:
    EXECUTED.append("broken")
    raise NonRetryableError("no such thing")


async def _branch(ctx: DurableContext, part: str) -> str:
    return str(await ctx.step(f"read-{part}", str.upper, part))


def _count(n: int) -> int:
    EXECUTED.append(f"count-{n}")
    return n + 1


async def run(ctx: DurableContext, input: dict[str, Any]) -> dict[str, Any]:
    if not input.get("generation"):
        n = await ctx.step("count", _count, 1)                              # step
        await ctx.continue_as_new({"generation": 1, "topic": input["topic"], "n": n})  # continue
    ctx.set_total_steps(8)
    parts = await ctx.step("plan", _plan, ctx, input["topic"])             # step, cost inside
    ctx.add_cost(usd="0.05", tokens=7)                                     # cost outside a step
    found = await ctx.step("finding", _finding, parts[0])                   # a pydantic model
    big = await ctx.step("big", _big, 300)                                  # a blob (ref)
    try:
        await ctx.step("broken", _broken)                                   # a failed step
        failed = ""
    except StepError as e:
        failed = e.type_name
    read = await ctx.gather(*[_branch(ctx, p) for p in parts])              # nested positions
    now = ctx.now()                                                         # value: now
    ident = ctx.uuid()                                                      # value: uuid
    await ctx.sleep(0.01)                                                   # sleep
    approval = await ctx.wait_for_event("approval")                        # wait + event
    try:
        await ctx.wait_for_event("never", timeout=timedelta(0))            # wait + timeout
        late = False
    except Exception:
        late = True
    new = ctx.patched("v2")                                                 # patch
    final = await ctx.wait_for_event("finish")
    return {"n": input["n"], "read": read, "approval": approval, "found": found.title,
            "big": len(big), "failed": failed, "late": late, "new": new,
            "now": now.year > 2000, "uuid": len(str(ident)), "final": final}   # complete
