"""The interpreter of generated programs (tests/faults/generated.py): one workflow runs them all.

Every call of a step function appends ``call <step> <process>`` to the run's ledger (outside the run;
``O_APPEND`` writes survive SIGKILL), so a test counts executions per process: the pod's name in a runner
pod, else the process id. A step's first ``fails`` calls in a process raise; results depend only on the
program, so the oracle knows them.
"""

from __future__ import annotations

import asyncio
import hashlib
import os
import threading
from collections import Counter
from datetime import timedelta
from decimal import Decimal
from typing import Any

from durablerun import DurableContext, EventTimeout, NonRetryableError, StepError, api
from durablerun.agents import Saga

PROCESS = os.environ.get(api.Env.POD_NAME) or str(os.getpid())
_calls: Counter[tuple[str, str]] = Counter()
_lock = threading.Lock()


def _ledger(path: str, line: str) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o666)
    try:
        os.write(fd, (line + "\n").encode())
    finally:
        os.close(fd)


def _result(name: str) -> dict[str, Any]:
    return {"step": name, "digest": hashlib.sha256(name.encode()).hexdigest()[:12]}


def call(ctx: DurableContext, ledger: str, name: str, fails: int, fatal: bool = False) -> dict[str, Any]:
    _ledger(ledger, f"call {name} {PROCESS}")
    with _lock:  # per run (its ledger), so runs in one process (a test's reference runs) count apart
        _calls[ledger, name] += 1
        n = _calls[ledger, name]
    if fatal:
        raise NonRetryableError(f"{name} fails for good")
    if n <= fails:
        raise RuntimeError(f"{name} fails (call {n} of {fails} failing)")
    ctx.add_cost(usd=Decimal("0.01"), tokens=10)
    return _result(name)


async def acall(ctx: DurableContext, ledger: str, name: str, fails: int) -> dict[str, Any]:
    await asyncio.sleep(0)
    return call(ctx, ledger, name, fails)


def undo(ledger: str, name: str) -> str:
    _ledger(ledger, f"call {name} {PROCESS}")
    return name


async def _step(ctx: DurableContext, ledger: str, op: dict[str, Any]) -> Any:
    fn = acall if int(op["name"][1:]) % 2 else call  # sync steps (threads) and async ones
    try:
        return await ctx.step(op["name"], fn, ctx, ledger, op["name"], op["fails"], retries=op["retries"])
    except StepError:
        return {"failed": op["name"]}


async def _run(ctx: DurableContext, ledger: str, op: dict[str, Any]) -> Any:
    kind = op["op"]
    if kind == "step":
        return await _step(ctx, ledger, op)
    if kind == "gather":
        return await ctx.gather(*[_branch(ctx, ledger, branch) for branch in op["branches"]])
    if kind == "sleep":
        await ctx.sleep(timedelta(milliseconds=op["ms"]))
        return "slept"
    if kind == "wait":
        timeout = timedelta(milliseconds=op["timeout_ms"]) if op["when"] == "never" else None
        try:
            return await ctx.wait_for_event(op["event"], timeout=timeout)
        except EventTimeout:
            return "timeout"
    if kind == "saga":
        return await _saga(ctx, ledger, op)
    if kind == "child":
        handle = await ctx.start_child(op["name"], "generated_flows:program",
                                       {"ledger": ledger, "program": op["program"]})
        return await handle
    raise AssertionError(f"unknown operation {kind}")


async def _branch(ctx: DurableContext, ledger: str, ops: list[dict[str, Any]]) -> list[Any]:
    return [await _run(ctx, ledger, op) for op in ops]


async def _saga(ctx: DurableContext, ledger: str, op: dict[str, Any]) -> Any:
    done = []
    try:
        async with Saga(ctx) as saga:
            for s in op["steps"]:
                done.append(await _step(ctx, ledger, s))
                saga.add(f"undo-{s['name']}", undo, ledger, f"compensate:undo-{s['name']}")
            if op.get("fail"):
                await ctx.step(op["fail"], call, ctx, ledger, op["fail"], 0, True)
    except StepError:
        return {"undone": op.get("fail")}
    return done


async def program(ctx: DurableContext, input: dict[str, Any]) -> dict[str, Any]:
    """Run ``input.program`` from operation ``input.start`` on (after a continuation), ``input.out`` so far."""
    ledger = str(input["ledger"])
    out: list[Any] = list(input.get("out", []))
    ops = input["program"]
    for i in range(int(input.get("start", 0)), len(ops)):
        op = ops[i]
        if op["op"] == "continue":
            out.append("continued")
            await ctx.continue_as_new({**input, "start": i + 1, "out": out})
        out.append(await _run(ctx, ledger, op))
    return {"out": out}
