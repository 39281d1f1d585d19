"""Version 1 of the workflows the upgrade tests move between images (tests/realnode/test_pinning.py).

Version 2 is ../workflows_v2/upgrade_flows.py, in an image of its own: ``kept`` replays this one's journals
cleanly, ``renamed`` does not. Each result names the code that finished the run.
"""

from __future__ import annotations

from typing import Any

from realnode_flows import work

from durablerun import DurableContext

CODE = "v1"


async def kept(ctx: DurableContext, input: dict[str, Any]) -> dict[str, Any]:
    """A step, a wait for `go` (no pod runs meanwhile), a step; the result names the code that ran the last."""
    await ctx.step("draft", work, input, "draft")
    await ctx.wait_for_event("go")
    await ctx.step("publish", work, input, "publish")
    return {"code": CODE}


async def renamed(ctx: DurableContext, input: dict[str, Any]) -> dict[str, Any]:
    await ctx.step("draft", work, input, "draft")
    await ctx.wait_for_event("go")
    await ctx.step("publish", work, input, "publish")
    return {"code": CODE}
