"""Workflows that go wrong at run time, for the bad-input tests (ledger lines as in torture_flows)."""

from __future__ import annotations

from typing import Any

from torture_flows import work  # type: ignore[import-not-found]

from durablerun import DurableContext

HARD_LIMIT = 64 * 1024 * 1024  # EngineConfig.result_hard_limit


def an_object(ledger: str, name: str) -> object:
    work(ledger, name, 0)
    return object()


def huge(ledger: str, name: str) -> str:
    work(ledger, name, 0)
    return "x" * (HARD_LIMIT + 1)


async def unserializable(ctx: DurableContext, input: dict[str, Any]) -> Any:
    ledger = str(input["ledger"])
    first = await ctx.step("first", work, ledger, "first", 0.05)
    await ctx.step("opaque", an_object, ledger, "opaque")
    return first


async def oversized(ctx: DurableContext, input: dict[str, Any]) -> Any:
    ledger = str(input["ledger"])
    first = await ctx.step("first", work, ledger, "first", 0.05)
    await ctx.step("huge", huge, ledger, "huge")
    return first


async def approval(ctx: DurableContext, input: dict[str, Any]) -> Any:
    """Three steps (the third takes ``slow`` seconds), a wait for event "go", two steps."""
    ledger = str(input["ledger"])
    pace = float(input.get("pace", 0.3))
    out = [await ctx.step(f"s{i}", work, ledger, f"s{i}", float(input.get("slow", pace)) if i == 2 else pace)
           for i in range(3)]
    out.append(await ctx.wait_for_event("go"))
    out.extend([await ctx.step(f"s{i}", work, ledger, f"s{i}", 0.05) for i in range(3, 5)])
    return out


def big(ledger: str, name: str) -> str:
    work(ledger, name, 0)
    return "y" * 300_000  # over EngineConfig.inline_result_max: stored as its own object (a blob)


async def big_then_wait(ctx: DurableContext, input: dict[str, Any]) -> Any:
    """A result stored as a blob, a wait for event "go", a step."""
    ledger = str(input["ledger"])
    value = await ctx.step("big", big, ledger, "big")
    decision = await ctx.wait_for_event("go")
    await ctx.step("after", work, ledger, "after", 0.05)
    return {"size": len(value), "decision": decision}
