"""Workflows for the Kueue tests (tests/kueue/): runs that share one ledger, each entry tagged with its run."""

from __future__ import annotations

from typing import Any

from optest_flows import hold, work

from durablerun import DurableContext


async def tagged(ctx: DurableContext, input: dict[str, Any]) -> dict[str, Any]:
    """``input.steps`` steps of ``input.sleep`` seconds named ``<tag>-s<i>`` in the ledger; ``input.wait_after``:
    wait for the event ``go`` after that step; ``input.hold``: the step (``s<i>``) that runs until the test
    releases ``<tag>-s<i>`` (optest_flows.hold)."""
    tag = input["tag"]
    for i in range(int(input.get("steps", 3))):
        if input.get("hold") == f"s{i}":
            await ctx.step(f"s{i}", hold, f"{tag}-s{i}")
        else:
            await ctx.step(f"s{i}", work, f"{tag}-s{i}", float(input.get("sleep", 0.5)))
        if input.get("wait_after") == i:
            await ctx.wait_for_event("go")
    return {"tag": tag}
