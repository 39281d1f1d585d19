"""Workflows for CLI and concurrency tests (blocking file I/O on purpose: tiny ledgers)."""

# ruff: noqa: ASYNC230, ASYNC240

from __future__ import annotations

import asyncio
import os
import time
from datetime import timedelta
from decimal import Decimal
from typing import Any

from durablerun import DurableContext


async def _gated(ctx: DurableContext, gate: str, ledger: str, i: int) -> dict[str, Any]:
    with open(ledger, "a") as f:
        f.write(f"enter {os.getpid()} {i}\n")
    deadline = time.monotonic() + 30
    while not os.path.exists(gate):
        if time.monotonic() > deadline:
            raise TimeoutError("gate never opened")
        await asyncio.sleep(0.002)
    with open(ledger, "a") as f:
        f.write(f"done {os.getpid()} {i}\n")
    return {"i": i, "pid": os.getpid()}


async def gated(ctx: DurableContext, input: dict[str, Any]) -> list[Any]:
    """Each step waits for a gate file, so two processes can be lined up to race."""
    return [await ctx.step(f"s{i}", _gated, ctx, input["gate"], input["ledger"], i)
            for i in range(input.get("steps", 3))]


def _charge(ctx: DurableContext, i: int) -> int:
    ctx.add_cost(usd=Decimal("0.40"), tokens=50)
    return i


async def approval(ctx: DurableContext, input: dict[str, Any]) -> dict[str, Any]:
    """Charges cost, then waits for a human decision."""
    done = [await ctx.step(f"work-{i}", _charge, ctx, i) for i in range(input.get("work", 2))]
    decision = await ctx.wait_for_event("decision", timeout=timedelta(hours=1))
    return {"done": done, "decision": decision, "topic": input.get("topic")}


async def slow_steps(ctx: DurableContext, input: dict[str, Any]) -> int:
    """Long-ish steps, to be interrupted by SIGTERM."""
    marker = input["marker"]
    total = 0
    for i in range(input.get("steps", 50)):
        async def one(i: int = i) -> int:
            with open(marker, "a") as f:
                f.write(f"{i}\n")
            await asyncio.sleep(0.05)
            return i
        total += await ctx.step(f"slow-{i}", one)
    return total


def raise_on_import() -> None:  # pragma: no cover - imported by name only
    pass


async def _echo(i: int) -> int:
    return i


async def many_steps(ctx: DurableContext, input: dict[str, Any]) -> int:
    """Many quick steps: a long journal to inspect."""
    return sum([await ctx.step(f"quick-{i}", _echo, i) for i in range(input.get("steps", 10))])


async def short_wait(ctx: DurableContext, input: dict[str, Any]) -> Any:
    """A wait with a deadline short enough that the attempt polls for the event in process."""
    return await ctx.wait_for_event("go", timeout=timedelta(seconds=input.get("timeout", 30)))


async def _branch(ctx: DurableContext, i: int) -> int:
    return await ctx.step(f"branch-{i}", _echo, i)


async def fan_out(ctx: DurableContext, input: dict[str, Any]) -> list[Any]:
    """Two gathers: of called steps (positions 1, 2; the gather 3) and of coroutines (the
    gather 4, its branches 4.0.0 and 4.1.0). Neither gather's own position holds a record."""
    first = await ctx.step("first", _echo, 0)
    both = await ctx.gather(ctx.step("left", _echo, 1), ctx.step("right", _echo, 2))
    more = await ctx.gather(_branch(ctx, 4), _branch(ctx, 5))
    return [first, *both, *more, await ctx.step("last", _echo, 6)]


async def sized_result(ctx: DurableContext, input: dict[str, Any]) -> dict[str, Any]:
    """A result of about ``input.bytes`` bytes of JSON."""
    text = await ctx.step("make", _text, int(input["bytes"]))
    return {"text": text}


def _text(size: int) -> str:
    return "x" * size
