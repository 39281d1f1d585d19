"""Workflows for the child-run tests: a supervisor that fans out to workers and signals another run.

Every step execution appends to the ledger (optest_flows._record), so a test counts executions.
"""

from __future__ import annotations

import json
from typing import Any

from optest_flows import _record, hold, work

from durablerun import ChildRunFailed, DurableContext


def combine(results: list[Any]) -> dict[str, Any]:
    _record("start combine")
    return {"squares": [r["square"] for r in results], "sum": sum(r["square"] for r in results)}


async def supervisor(ctx: DurableContext, input: dict[str, Any]) -> dict[str, Any]:
    """Starts ``children`` workers (a ``prep`` step before each), works a while, gathers them, combines.

    ``hold``: the index of a worker whose second step runs until the test releases it (``hold``);
    ``hold_between``: the same for the supervisor's ``between`` step.
    ``more``: steps each worker takes after its two.
    ``fail``: the index of a worker that fails; the supervisor catches it and carries on without it.
    ``signal``: a run to send event ``review`` to at the end. ``big``: the index of a worker whose result is
    too big for its status (the parent reads it from the worker's journal).
    """
    handles = []
    for i in range(int(input["children"])):
        await ctx.step(f"prep-{i}", work, f"prep-{i}", float(input.get("prep", 0.05)))
        handles.append(await ctx.start_child(
            f"w{i}", "optest_children:worker",
            {"i": i, "sleep": input.get("sleep", 0.2), "fail": input.get("fail") == i, "big": input.get("big") == i,
             "hold": input.get("hold") == i, "more": input.get("more", 0)}))
    if input.get("hold_between"):
        await ctx.step("between", hold, "between")
    else:
        await ctx.step("between", work, "between", float(input.get("between", 0.05)))
    results = await ctx.gather(*handles, return_exceptions=True)
    failed = [r.child for r in results if isinstance(r, ChildRunFailed)]
    total = await ctx.step("combine", combine, [r for r in results if not isinstance(r, BaseException)])
    if input.get("signal"):
        await ctx.signal(input["signal"], "review", {"approved": True, "by": ctx.run_id.split("/")[1]})
    outcome = {**total, "failed": failed}
    _record("result " + json.dumps(outcome, sort_keys=True))
    return outcome


def boom(name: str) -> None:
    _record(f"start {name}")
    raise RuntimeError(f"{name} cannot go on")


async def worker(ctx: DurableContext, input: dict[str, Any]) -> dict[str, Any]:
    i = int(input["i"])
    await ctx.step(f"w{i}-a", work, f"w{i}-a", float(input.get("sleep", 0.2)))
    if input.get("fail"):
        await ctx.step(f"w{i}-boom", boom, f"w{i}-boom", retries=0)
    if input.get("hold"):
        await ctx.step(f"w{i}-b", hold, f"w{i}-b")
    else:
        await ctx.step(f"w{i}-b", work, f"w{i}-b", float(input.get("sleep", 0.2)))
    for k in range(int(input.get("more", 0))):  # steps left to stop before, however late a suspension comes
        await ctx.step(f"w{i}-m{k}", work, f"w{i}-m{k}", float(input.get("sleep", 0.2)))
    ctx.add_cost(usd="0.25", tokens=10)
    return {"i": i, "square": i * i, **({"pad": "x" * 5000} if input.get("big") else {})}


async def greedy(ctx: DurableContext, input: dict[str, Any]) -> dict[str, Any]:
    """Asks for a child with a bigger budget than its own: the operator refuses, the parent catches it."""
    try:
        await ctx.run_child("rich", "optest_children:worker", {"i": 1}, policy={"costCeilingUSD": "5"})
    except ChildRunFailed as failure:
        return {"error": failure.message}
    return {"error": None}


async def fragile_supervisor(ctx: DurableContext, input: dict[str, Any]) -> dict[str, Any]:
    """Two children, then a step that fails until the test creates the marker (optest_flows.needs_the_fix)."""
    from optest_flows import needs_the_fix

    handles = [await ctx.start_child(f"w{i}", "optest_children:worker", {"i": i, "sleep": 0.1}) for i in range(2)]
    results = await ctx.gather(*handles)
    await ctx.step("fragile", needs_the_fix, "fragile", retries=0)
    return {"squares": [r["square"] for r in results]}
