"""Workflows the operator tests run in runner pods.

Every step execution appends a line to a ledger outside the run (a hostPath
volume), so a test can count executions instead of assuming them.
"""

from __future__ import annotations

import json
import os
import signal
import time
from datetime import timedelta
from decimal import Decimal
from typing import Any

from durablerun import DurableContext
from durablerun.agents import Saga

LEDGER = os.environ.get("LEDGER", "/tmp/ledger/ledger.txt")


def _record(entry: str) -> None:
    with open(LEDGER, "a") as ledger:
        ledger.write(entry + "\n")
        ledger.flush()
        os.fsync(ledger.fileno())


def work(name: str, seconds: float) -> str:
    _record(f"start {name}")
    time.sleep(seconds)
    _record(f"done {name}")
    return name.upper()


def hold(name: str) -> str:
    """A step that runs until the test creates ``release-<name>`` beside the ledger, so a test that kills its
    pod knows the step was in flight (a timed step may finish first on a loaded machine)."""
    _record(f"start {name}")
    release, deadline = os.path.join(os.path.dirname(LEDGER), f"release-{name}"), time.monotonic() + 300
    while not os.path.exists(release):
        if time.monotonic() > deadline:
            raise RuntimeError(f"{name}: {release} never appeared")
        time.sleep(0.05)
    _record(f"done {name}")
    return name.upper()


async def steps(ctx: DurableContext, input: dict[str, Any]) -> dict[str, Any]:
    """``input.steps`` steps of ``input.sleep`` seconds, each charging ``input.usd``
    (``input.declare_total``: the workflow declares how many steps it takes; ``input.hold``: the name of
    a step that runs until the test releases it, see ``hold``)."""
    results = []
    if input.get("declare_total"):
        ctx.set_total_steps(int(input.get("steps", 5)))
    for i in range(int(input.get("steps", 5))):
        if input.get("hold") == f"s{i}":
            results.append(await ctx.step(f"s{i}", hold, f"s{i}"))
            continue
        results.append(await ctx.step(f"s{i}", work, f"s{i}", float(input.get("sleep", 0.2))))
        if input.get("usd"):
            ctx.add_cost(usd=Decimal(str(input["usd"])), tokens=int(input.get("tokens", 0)))
    _record("result " + json.dumps(results))
    return {"results": results}


def die(name: str) -> str:
    _record(f"start {name}")
    os.kill(os.getpid(), signal.SIGKILL)
    return name


def shout_once_then_die(marker: str) -> str:
    """Prints a line with ``marker``; the first time, then SIGKILLs its own runner (a file beside the ledger
    remembers it); the next time it returns."""
    died = os.path.join(os.path.dirname(LEDGER), f"died-{marker}")
    if not os.path.exists(died):
        print(f"{marker}: the first attempt, about to die", flush=True)
        open(died, "w").close()
        os.kill(os.getpid(), signal.SIGKILL)
    print(f"{marker}: the next attempt, done", flush=True)
    return marker


async def shouter(ctx: DurableContext, input: dict[str, Any]) -> dict[str, Any]:
    """Its step prints ``input.marker`` and SIGKILLs its runner once (its logs must outlive the pod)."""
    return {"marker": await ctx.step("shout", shout_once_then_die, input["marker"])}


async def crasher(ctx: DurableContext, input: dict[str, Any]) -> dict[str, Any]:
    """Crashes (SIGKILL) in its second step on every attempt."""
    await ctx.step("ok", work, "ok", 0.05)
    await ctx.step("boom", die, "boom")
    return {}


async def approval(ctx: DurableContext, input: dict[str, Any]) -> dict[str, Any]:
    """A step, a human approval, another step."""
    draft = await ctx.step("draft", work, "draft", 0.1)
    decision = await ctx.wait_for_event("review", timeout=timedelta(hours=1))
    final = await ctx.step("publish", work, "publish", 0.1)
    _record("decision " + json.dumps(decision, sort_keys=True))
    return {"draft": draft, "decision": decision, "final": final}


async def narrator(ctx: DurableContext, input: dict[str, Any]) -> dict[str, Any]:
    """Writes stream "story" before and after event "go": the wait ends the first pod, a second writes on."""
    out = ctx.stream("story")

    def tell(part: str) -> str:
        for i in range(3):
            out.write(f"{part}{i} ")
        return part

    await ctx.step("before", tell, "before")
    await ctx.wait_for_event("go", timeout=timedelta(hours=1))
    await ctx.step("after", tell, "after")
    return {"told": True}


async def sleeper(ctx: DurableContext, input: dict[str, Any]) -> dict[str, Any]:
    """A durable sleep long enough to end the attempt."""
    await ctx.step("before", work, "before", 0.05)
    await ctx.sleep(timedelta(seconds=float(input.get("seconds", 90))))
    await ctx.step("after", work, "after", 0.05)
    return {"slept": True}


MARKER = os.path.join(os.path.dirname(LEDGER), "fixed")


def needs_the_fix(name: str) -> str:
    _record(f"start {name}")
    if not os.path.exists(MARKER):
        raise RuntimeError(f"{name}: the dependency is down ({MARKER} is missing)")
    return name.upper()


def crashes_until_fixed(name: str) -> str:
    _record(f"start {name}")
    if not os.path.exists(MARKER):
        os.kill(os.getpid(), signal.SIGKILL)
    return name.upper()


async def fragile(ctx: DurableContext, input: dict[str, Any]) -> dict[str, Any]:
    """A step, then one that fails (or, with input.crash, crashes) until the test creates the marker, then one more."""
    first = await ctx.step("prepare", work, "prepare", 0.05)
    breaking = crashes_until_fixed if input.get("crash") else needs_the_fix
    middle = await ctx.step("fragile", breaking, "fragile", retries=0)
    last = await ctx.step("finish", work, "finish", 0.05)
    return {"steps": [first, middle, last]}


async def booking(ctx: DurableContext, input: dict[str, Any]) -> dict[str, Any]:
    """Two bookings a Saga undoes if the run fails or is aborted, a payment that runs until the test releases
    it (``<tag>-pay``; with ``input.approval``, a wait for the event ``approval`` instead), and a confirmation.
    Ledger entries carry ``input.tag``, so runs can share a ledger."""
    tag = input["tag"]
    async with Saga(ctx) as saga:
        for what in ("flight", "hotel"):
            await ctx.step(f"book-{what}", work, f"{tag}-book-{what}", 0.05)
            saga.add(f"cancel-{what}", work, f"{tag}-cancel-{what}", 0.05)
        if input.get("approval"):
            await ctx.wait_for_event("approval")
        else:
            await ctx.step("pay", hold, f"{tag}-pay")
        await ctx.step("confirm", work, f"{tag}-confirm", 0.05)
    return {"booked": True}


def crash_once(name: str) -> str:
    """SIGKILLs its process the first time it runs (the run restarts), returns the second time."""
    with open(LEDGER) as ledger:
        first = ledger.read().splitlines().count(f"start {name}") == 0
    _record(f"start {name}")
    if first:
        os.kill(os.getpid(), signal.SIGKILL)
    return name.upper()


async def restart_then_approve(ctx: DurableContext, input: dict[str, Any]) -> dict[str, Any]:
    """A step, a step that crashes its first attempt, a human approval, a last step: a run with a restart and
    a wait, as the run browser's tests show it."""
    await ctx.step("prepare", work, "prepare", 0.05)
    await ctx.step("flaky", crash_once, "flaky")
    decision = await ctx.wait_for_event("review", timeout=timedelta(hours=1))
    await ctx.step("publish", work, "publish", 0.05)
    return {"decision": decision}


async def reteller(ctx: DurableContext, input: dict[str, Any]) -> dict[str, Any]:
    """Writes stream "story" from a step whose first try fails (what it wrote is superseded by the second's),
    waits for event "go", then writes once more."""
    out = ctx.stream("story")
    tries: list[int] = []

    def tell() -> str:
        tries.append(1)
        out.write(f"try {len(tries)}\n")
        if len(tries) == 1:
            raise RuntimeError("the first try fails")
        return "told"

    await ctx.step("tell", tell, retries=1)
    await ctx.wait_for_event("go", timeout=timedelta(hours=1))
    await ctx.step("after", out.write, "after the event\n")
    return {"told": True}
