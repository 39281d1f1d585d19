"""One workflow in several releases, for the replayer, rerun and fork tests.

Every step appends its name to the ledger file named by the input, so a test can tell exactly
which steps ran (and how often).
"""

from __future__ import annotations

import os
from datetime import timedelta
from typing import Any

from durablerun import DurableContext, NonRetryableError


def _do(ledger: str, name: str) -> str:
    with open(ledger, "a") as f:
        f.write(f"{name}\n")
    return name.upper()


async def v1(ctx: DurableContext, input: dict[str, Any]) -> dict[str, Any]:
    """The release runs started with: plan, a durable sleep, draft, a review, publish."""
    ledger = input["ledger"]
    plan = await ctx.step("plan", _do, ledger, "plan")
    await ctx.sleep(timedelta(hours=input.get("sleep_hours", 0)))
    draft = await ctx.step("draft", _do, ledger, "draft")
    review = await ctx.wait_for_event("review")
    done = await ctx.step("publish", _do, ledger, "publish")
    return {"plan": plan, "draft": draft, "review": review, "done": done}


async def renamed(ctx: DurableContext, input: dict[str, Any]) -> dict[str, Any]:
    """A release that renamed a step without ctx.patched: diverges from v1's journals."""
    ledger = input["ledger"]
    plan = await ctx.step("plan", _do, ledger, "plan")
    await ctx.sleep(timedelta(hours=input.get("sleep_hours", 0)))
    draft = await ctx.step("draft-v2", _do, ledger, "draft-v2")
    review = await ctx.wait_for_event("review")
    done = await ctx.step("publish", _do, ledger, "publish")
    return {"plan": plan, "draft": draft, "review": review, "done": done}


async def patched(ctx: DurableContext, input: dict[str, Any]) -> dict[str, Any]:
    """The same change guarded with ctx.patched: replays v1's journals cleanly."""
    ledger = input["ledger"]
    plan = await ctx.step("plan", _do, ledger, "plan")
    await ctx.sleep(timedelta(hours=input.get("sleep_hours", 0)))
    if ctx.patched("draft-v2"):
        draft = await ctx.step("draft-v2", _do, ledger, "draft-v2")
    else:
        draft = await ctx.step("draft", _do, ledger, "draft")
    review = await ctx.wait_for_event("review")
    done = await ctx.step("publish", _do, ledger, "publish")
    return {"plan": plan, "draft": draft, "review": review, "done": done}


async def shortened(ctx: DurableContext, input: dict[str, Any]) -> dict[str, Any]:
    """A release that dropped the publish step: a completed v1 journal holds a step it never reaches."""
    ledger = input["ledger"]
    plan = await ctx.step("plan", _do, ledger, "plan")
    await ctx.sleep(timedelta(hours=input.get("sleep_hours", 0)))
    draft = await ctx.step("draft", _do, ledger, "draft")
    review = await ctx.wait_for_event("review")
    return {"plan": plan, "draft": draft, "review": review, "done": None}


async def crashing(ctx: DurableContext, input: dict[str, Any]) -> dict[str, Any]:
    """A release whose workflow function raises before reaching the journal's end."""
    await ctx.step("plan", _do, input["ledger"], "plan")
    await ctx.sleep(timedelta(hours=input.get("sleep_hours", 0)))
    raise RuntimeError("a bug in the new release")


def _fetch(ledger: str, broken: str) -> str:
    _do(ledger, "fetch")
    if os.path.exists(broken):
        raise NonRetryableError(f"{broken} exists: the bug is not fixed yet")
    return "fetched"


async def fixable(ctx: DurableContext, input: dict[str, Any]) -> dict[str, Any]:
    """A step that fails for good while the file ``input.broken`` exists (the bug), between two good ones."""
    ledger = input["ledger"]
    plan = await ctx.step("plan", _do, ledger, "plan")
    fetched = await ctx.step("fetch", _fetch, ledger, input["broken"])
    done = await ctx.step("publish", _do, ledger, "publish")
    return {"plan": plan, "fetched": fetched, "done": done}


def _flaky(ledger: str) -> str:
    _do(ledger, "flaky")
    with open(ledger) as f:
        tries = f.read().split().count("flaky")
    if tries < 3:
        raise ValueError(f"flaky {tries}")
    return "ok"


async def flaky(ctx: DurableContext, input: dict[str, Any]) -> str:
    """A step that raises on its first two attempts."""
    return str(await ctx.step("flaky", _flaky, input["ledger"]))
