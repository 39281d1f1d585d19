"""A workflow whose shape comes from its input, for kill-and-resume tests.

Every step execution appends ``start <name> <pid>`` and ``end <name> <pid>``
to a ledger file *outside* the run (O_APPEND writes survive SIGKILL), so a
test can prove which steps executed how often.

A ``continue`` segment calls ``ctx.continue_as_new`` with the state the rest
of the shape needs (where to go on, what came out so far). ``input.die``
names points where the process SIGKILLs itself, once each (its ``die`` line in
the ledger remembers): ``before-continue-<i>`` right before segment ``i``'s
continuation is journaled, ``after-continue-<i>`` as the generation it
started begins (the continuation is durable, nothing of the new generation is).
"""

from __future__ import annotations

import asyncio
import hashlib
import os
import signal
import time
from datetime import timedelta
from decimal import Decimal
from typing import Any

from durablerun import DurableContext


def _ledger(path: str, line: str) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, (line + "\n").encode())
    finally:
        os.close(fd)


def result_of(name: str) -> dict[str, Any]:
    return {"name": name, "digest": hashlib.sha256(name.encode()).hexdigest()[:12]}


def work_ms(name: str) -> float:
    return (int(hashlib.sha256(name.encode()).hexdigest()[:4], 16) % 4) / 1000


def _sync_step(ctx: DurableContext, ledger: str, name: str) -> dict[str, Any]:
    _ledger(ledger, f"start {name} {os.getpid()}")
    time.sleep(work_ms(name))
    ctx.add_cost(usd=Decimal("0.01"), tokens=10)
    _ledger(ledger, f"end {name} {os.getpid()}")
    return result_of(name)


async def _async_step(ctx: DurableContext, ledger: str, name: str) -> dict[str, Any]:
    _ledger(ledger, f"start {name} {os.getpid()}")
    await asyncio.sleep(work_ms(name))
    ctx.add_cost(usd=Decimal("0.01"), tokens=10)
    _ledger(ledger, f"end {name} {os.getpid()}")
    return result_of(name)


def _die_once(input: dict[str, Any], point: str) -> None:
    # The ledger line is the only record that the point was reached: an external kill can land between any two
    # writes, so a separate "done" marker could say "died here" for a kill that never happened.
    if point not in input.get("die", ()):
        return
    try:
        with open(input["ledger"]) as ledger:
            if any(line.startswith(f"die {point} ") for line in ledger):
                return
    except FileNotFoundError:
        pass
    _ledger(input["ledger"], f"die {point} {os.getpid()}")
    os.kill(os.getpid(), signal.SIGKILL)


async def shape(ctx: DurableContext, input: dict[str, Any]) -> dict[str, Any]:
    ledger = input["ledger"]
    start = int(input.get("start", 0))
    out: list[Any] = list(input.get("out", []))
    if start:
        _die_once(input, f"after-continue-{start - 1}")
    segments = input["segments"]
    for i in range(start, len(segments)):
        seg = segments[i]
        kind, n = seg["kind"], seg.get("n", 1)
        if kind == "steps":
            for j in range(n):
                fn = _sync_step if j % 2 else _async_step
                out.append(await ctx.step(f"s{i}-{j}", fn, ctx, ledger, f"s{i}-{j}"))
        elif kind == "gather":
            out.append(await ctx.gather(*[
                ctx.step(f"g{i}-{j}", _async_step if j % 2 else _sync_step, ctx, ledger,
                         f"g{i}-{j}")
                for j in range(n)
            ]))
        elif kind == "sleep":
            await ctx.sleep(timedelta(milliseconds=5))
            out.append("slept")
        elif kind == "uuid":
            # Recorded once: the same on every replay, so the final result is stable.
            out.append(len(str(ctx.uuid())))
        elif kind == "continue":
            out.append("continued")
            _die_once(input, f"before-continue-{i}")
            await ctx.continue_as_new({**input, "start": i + 1, "out": out})
    return {"out": out}


def expected(segments: list[dict[str, Any]]) -> dict[str, Any]:
    out: list[Any] = []
    for i, seg in enumerate(segments):
        kind, n = seg["kind"], seg.get("n", 1)
        if kind == "steps":
            out.extend(result_of(f"s{i}-{j}") for j in range(n))
        elif kind == "gather":
            out.append([result_of(f"g{i}-{j}") for j in range(n)])
        elif kind == "sleep":
            out.append("slept")
        elif kind == "uuid":
            out.append(36)
        elif kind == "continue":
            out.append("continued")
    return {"out": out}


def step_names(segments: list[dict[str, Any]]) -> list[str]:
    names = []
    for i, seg in enumerate(segments):
        if seg["kind"] == "steps":
            names += [f"s{i}-{j}" for j in range(seg.get("n", 1))]
        elif seg["kind"] == "gather":
            names += [f"g{i}-{j}" for j in range(seg.get("n", 1))]
    return names
