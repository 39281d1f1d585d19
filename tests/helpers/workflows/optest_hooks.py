"""A workflow that hands out a capability URL and waits for an outside system to call it."""

from __future__ import annotations

from typing import Any

from optest_flows import _record

from durablerun import DurableContext


async def hooked(ctx: DurableContext, input: dict[str, Any]) -> Any:
    url = ctx.webhook_url("done", ttl=600)
    _record("url " + url)  # what a workflow would post to the outside system, in a step
    return await ctx.wait_for_event("done")
