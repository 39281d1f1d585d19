"""Workflows the fault suite runs in runner pods: parallel steps, waits, sleeps and side effects.

Every step execution appends ``start <step> <pod>`` (and ``done <step> <pod>``)
to a per-run ledger on a hostPath volume, outside the run: O_APPEND writes
survive SIGKILL, so a test counts executions per pod instead of assuming them.
The charging step also records the idempotency key it saw (``effect <key>
<pod>``): a side effect re-executed after a crash must see the key its first
execution saw. Results depend only on the input (and the event payload), so a
tortured run's result can be compared with an uncrashed reference.
"""

from __future__ import annotations

import asyncio
import hashlib
import os
import time
from datetime import timedelta
from decimal import Decimal
from typing import Any

from durablerun import DurableContext, api

POD = os.environ.get(api.Env.POD_NAME, "local")


def _ledger(path: str, line: str) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o666)
    try:
        os.write(fd, (line + "\n").encode())
    finally:
        os.close(fd)


def digest(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()[:12]


def work(ledger: str, name: str, seconds: float) -> dict[str, Any]:
    _ledger(ledger, f"start {name} {POD}")
    time.sleep(seconds)
    _ledger(ledger, f"done {name} {POD}")
    return {"step": name, "digest": digest(name)}


async def awork(ledger: str, name: str, seconds: float) -> dict[str, Any]:
    _ledger(ledger, f"start {name} {POD}")
    await asyncio.sleep(seconds)
    _ledger(ledger, f"done {name} {POD}")
    return {"step": name, "digest": digest(name)}


def charge(ctx: DurableContext, ledger: str, name: str, seconds: float) -> dict[str, Any]:
    """A side effect: charges cost and 'sends' something keyed by the step's idempotency key."""
    _ledger(ledger, f"start {name} {POD}")
    key = ctx.idempotency_key()
    _ledger(ledger, f"effect {key} {POD}")
    time.sleep(seconds)
    ctx.add_cost(usd=Decimal("0.01"), tokens=100)
    _ledger(ledger, f"done {name} {POD}")
    return {"step": name, "receipt": digest(name + "/receipt")}


async def pair(ctx: DurableContext, ledger: str, prefix: str, seconds: float) -> list[Any]:
    """A gather branch with two steps in sequence (a nested scope)."""
    first = await ctx.step(f"{prefix}-x", work, ledger, f"{prefix}-x", seconds)
    second = await ctx.step(f"{prefix}-y", awork, ledger, f"{prefix}-y", seconds)
    return [first, second]


async def torture(ctx: DurableContext, input: dict[str, Any]) -> dict[str, Any]:
    """``rounds`` rounds of: a step, a ctx.gather of ``width`` branches, maybe a wait or a
    durable sleep, then a charging side effect."""
    ledger = str(input["ledger"])
    pace = float(input.get("pace", 0.2))
    decision: Any = None
    rounds = []
    for r in range(int(input.get("rounds", 3))):
        plan = await ctx.step(f"r{r}-plan", work, ledger, f"r{r}-plan", pace)
        branches = [
            pair(ctx, ledger, f"r{r}-b{i}", pace) if i % 2
            else ctx.step(f"r{r}-b{i}", work if i % 4 == 0 else awork, ledger, f"r{r}-b{i}", pace * (1 + i % 3))
            for i in range(int(input.get("width", 3)))
        ]
        parts = await ctx.gather(*branches)
        if r == input.get("waitRound"):
            decision = await ctx.wait_for_event("go")
        if r == input.get("sleepRound"):
            await ctx.sleep(timedelta(seconds=float(input.get("nap", 1.0))))
        receipt = await ctx.step(f"r{r}-charge", charge, ctx, ledger, f"r{r}-charge", pace)
        rounds.append({"plan": plan, "parts": parts, "charge": receipt})
    return {"rounds": rounds, "decision": decision}


def step_names(input: dict[str, Any]) -> list[str]:
    """Every step the torture workflow journals for ``input``, in program order."""
    names = []
    for r in range(int(input.get("rounds", 3))):
        names.append(f"r{r}-plan")
        for i in range(int(input.get("width", 3))):
            names.extend([f"r{r}-b{i}-x", f"r{r}-b{i}-y"] if i % 2 else [f"r{r}-b{i}"])
        names.append(f"r{r}-charge")
    return names
