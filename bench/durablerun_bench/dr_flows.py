"""durable-run workflows the replay and resume benchmarks run, in processes and in runner pods.

``steps``: ``input.n`` steps returning 1 KB each (optionally sleeping
``input.sleep`` seconds in each), then a ``marker`` step. ``continuing``: the
same steps, but the workflow calls ``ctx.continue_as_new`` every
``input.every`` steps (a resume replays only the last generation). Timestamps go to the
file named by ``$DURABLERUN_BENCH_MARK`` (one ``<what> <pid> <unix time>`` line
each), so a benchmark can tell when a process started, entered the workflow
and ran its first new step, even inside a runner pod. ``$DURABLERUN_BENCH_CRASH``
makes the marker step SIGKILL its own process (``settle``: after letting the
snapshot thread finish; ``now``: at once), which leaves a journal of exactly
``n`` steps behind, so the same journal can be resumed again and again.
"""

from __future__ import annotations

import asyncio
import os
import signal
import time
from collections.abc import Callable
from typing import Any

from durablerun import api
from durablerun_bench.util import payload

MARK_ENV = "DURABLERUN_BENCH_MARK"
CRASH_ENV = "DURABLERUN_BENCH_CRASH"
STEP_MARKS_ENV = "DURABLERUN_BENCH_STEP_MARKS"
#: Called by the marker step just before it SIGKILLs the process (a build exports its journal).
BEFORE_CRASH: list[Callable[[], None]] = []


def process_start_time() -> float:
    """When this process started (unix time, ~10 ms resolution): its age from /proc, back from now."""
    with open("/proc/self/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    started_ticks = int(fields[19])  # starttime, field 22 of stat, counted after the comm field
    with open("/proc/uptime") as f:
        uptime = float(f.read().split()[0])
    return time.time() - (uptime - started_ticks / os.sysconf("SC_CLK_TCK"))


def attempt_id() -> int:
    """Which process wrote a mark: its pid, and in a runner pod its epoch too (a container's
    runner may have the same pid, 1, in every attempt)."""
    return int(os.environ.get(api.Env.EPOCH, "0")) * 10_000_000 + os.getpid()


def mark(what: str, when: float | None = None) -> None:
    path = os.environ.get(MARK_ENV)
    if path:
        with open(path, "a") as f:
            f.write(f"{what} {attempt_id()} {time.time() if when is None else when:.6f}\n")


mark("process", process_start_time())
mark("import")


async def work(i: int, sleep: float) -> str:
    if os.environ.get(STEP_MARKS_ENV):
        mark(f"step{i}")
    if sleep:
        await asyncio.sleep(sleep)
    return payload(i)


def marker() -> float:
    now = time.time()
    mark("marker", now)
    crash = os.environ.get(CRASH_ENV)
    if crash == "settle":
        time.sleep(0.5)  # let a snapshot in flight finish, so every build leaves the same state
    if crash:
        for hook in BEFORE_CRASH:
            hook()
        os.kill(os.getpid(), signal.SIGKILL)
    return now


async def steps(ctx: Any, input: dict[str, Any]) -> int:
    mark("entry")
    n, sleep = int(input["n"]), float(input.get("sleep", 0))
    for i in range(n):
        await ctx.step("work", work, i, sleep)
    await ctx.step("marker", marker)
    return n


async def continuing(ctx: Any, input: dict[str, Any]) -> int:
    """``steps`` as a long-lived loop: a new generation every ``input.every`` steps."""
    mark("entry")
    n, sleep, every = int(input["n"]), float(input.get("sleep", 0)), int(input["every"])
    done = int(input.get("done", 0))
    end = min(n, done + every)
    for i in range(done, end):
        await ctx.step("work", work, i, sleep)
    if end < n:
        await ctx.continue_as_new({**input, "done": end})
    await ctx.step("marker", marker)
    return n
