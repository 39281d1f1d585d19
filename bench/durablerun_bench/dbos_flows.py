"""The DBOS side of the workload: the same steps as durable-run's, as DBOS steps.

Kept in a module of its own: DBOS derives its application version from the
registered workflows' source, and a recovering process must register the same.
"""

from __future__ import annotations

import asyncio
import os
import signal
import sqlite3
import time
from collections.abc import Callable
from typing import Any

from dbos import DBOS

from durablerun_bench.util import payload

#: Hooks called at the start of every step (the benchmark's timestamps).
STAMP: list[Callable[[], None]] = []
#: Where the recovery benchmark's marker step writes when it ran (env).
MARK_ENV = "DURABLERUN_BENCH_MARK"
CRASH_ENV = "DURABLERUN_BENCH_CRASH"


@DBOS.step()
def work(i: int) -> str:
    for hook in STAMP:
        hook()
    return payload(i)


@DBOS.step()
def marker() -> float:
    """The first step after the journaled ones: crashes the first process, times the second."""
    now = time.time()
    path = os.environ.get(MARK_ENV)
    if path:
        with open(path, "a") as f:
            f.write(f"marker {os.getpid()} {now:.6f}\n")
    if os.environ.get(CRASH_ENV):
        os.kill(os.getpid(), signal.SIGKILL)
    return now


@DBOS.workflow()
def steps(n: int, with_marker: bool) -> int:
    for i in range(n):
        work(i)
    if with_marker:
        marker()
    return n


#: When each fan-out step's function returned (perf_counter), by index.
ENDED: dict[int, float] = {}


@DBOS.step()
async def fan_work(i: int, seconds: float) -> str:
    await asyncio.sleep(seconds)
    ENDED[i] = time.perf_counter()
    return payload(i)


@DBOS.workflow()
async def fanout(n: int, seconds: float) -> dict[str, Any]:
    """N steps at once (bench.fanout): when each returned, and when its output was durable and back."""
    durable = [0.0] * n

    async def one(i: int) -> str:
        result: str = await fan_work(i, seconds)
        durable[i] = time.perf_counter()
        return result

    start = time.perf_counter()
    await asyncio.gather(*[one(i) for i in range(n)])
    return {"wall": time.perf_counter() - start, "ended": [ENDED[i] for i in range(n)], "durable": durable}


def durability(url: str) -> dict[str, Any]:
    """What a commit of this system database makes durable, as configured."""
    if url.startswith("sqlite"):
        path = url.split("///", 1)[1]
        lite = sqlite3.connect(path)
        try:
            mode = lite.execute("PRAGMA journal_mode").fetchone()[0]
            sync = lite.execute("PRAGMA synchronous").fetchone()[0]
        finally:
            lite.close()
        return {"journal_mode": mode, "synchronous": {0: "OFF", 1: "NORMAL", 2: "FULL", 3: "EXTRA"}[sync]}
    import psycopg

    dsn = url.replace("postgresql+psycopg://", "postgresql://")
    with psycopg.connect(dsn) as conn:
        row = conn.execute("SHOW synchronous_commit").fetchone()
    return {"synchronous_commit": row[0] if row else None}
