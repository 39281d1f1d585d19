"""A fan-out: one gather of N one-millisecond steps, on S3 with and without group commit, beside DBOS.

``python -m durablerun_bench.fanout SYSTEM '{"steps": 100, ...}'`` runs one fan-out in a fresh interpreter
and prints one JSON line; :func:`run` alternates the systems, ``repeats`` times each, in one bench run.

What is measured, from the gather's start to its return:

* wall time of the whole fan-out;
* per step, the time from its function returning to its result being handed back durable (what the
  step waits on the journal: the commit latency it sees), p50 and p99;
* for durable-run, every PutObject the store sent (journal records, groups, snapshots), per step.

DBOS runs the same shape as an async workflow gathering async steps on PostgreSQL
(``synchronous_commit=on``: each step's row is committed before the step returns).
"""

from __future__ import annotations

import asyncio
import json
import statistics
import sys
import time
import uuid
from typing import Any

from durablerun_bench.util import payload, percentile, run_json

#: What a step does: about a millisecond of waiting (an I/O call), then returns 1 KB.
STEP_SECONDS = 0.001


def _summary(wall: float, latencies: list[float], extra: dict[str, Any]) -> dict[str, Any]:
    return {"wall_ms": 1000 * wall, "steps": len(latencies), "steps_per_s": len(latencies) / wall,
            "p50_ms": 1000 * percentile(latencies, 50), "p99_ms": 1000 * percentile(latencies, 99), **extra}


def durablerun(p: dict[str, Any]) -> dict[str, Any]:
    from durablerun import api
    from durablerun.engine import EngineConfig, Run
    from durablerun.stores import RunRef, open_store

    n = int(p["steps"])
    store = open_store(f"s3://{p['bucket']}/fanout", endpoint_url=p["endpoint"], access_key=p["access_key"],
                       secret_key=p["secret_key"], region="us-east-1")
    puts = [0]

    def count(**_: Any) -> None:
        puts[0] += 1

    # Every PutObject the store's client sends (the backend's own client: what the runner would send).
    store.backend._client.meta.events.register("before-call.s3.PutObject", count)  # type: ignore[attr-defined]
    ended: dict[int, float] = {}
    durable: dict[int, float] = {}
    window: dict[str, float] = {}

    async def work(i: int) -> str:
        await asyncio.sleep(STEP_SECONDS)
        ended[i] = time.perf_counter()
        return payload(i)

    async def timed(ctx: Any, i: int) -> str:
        result: str = await ctx.step(f"w{i}", work, i)
        durable[i] = time.perf_counter()
        return result

    async def workflow(ctx: Any, input: dict[str, Any]) -> int:
        await ctx.step("before", work, -1)  # the manifest and the first record are not the fan-out's
        window["puts"], window["start"] = puts[0], time.perf_counter()
        await ctx.gather(*[timed(ctx, i) for i in range(n)])
        window["end"], window["puts"] = time.perf_counter(), puts[0] - window["puts"]
        return n

    ref = RunRef.local(f"fanout-{uuid.uuid4().hex[:12]}")
    config = EngineConfig(group_commit=bool(p["group_commit"]))
    result = Run(store=store, run=ref, workflow=workflow, input={}, config=config).run_attempt()
    store.close()
    if result.outcome != api.Outcome.COMPLETED:
        raise RuntimeError(f"durable-run ended {result.outcome.value}: {result.message}")
    latencies = [durable[i] - ended[i] for i in range(n)]
    return _summary(window["end"] - window["start"], latencies,
                    {"puts": int(window["puts"]), "puts_per_step": window["puts"] / n})


def dbos(p: dict[str, Any]) -> dict[str, Any]:
    from dbos import DBOS, DBOSConfig

    from durablerun_bench import dbos_flows

    n = int(p["steps"])
    config: DBOSConfig = {"name": "durablerun-bench", "system_database_url": p["url"], "log_level": "WARNING"}
    DBOS(config=config)
    DBOS.launch()
    try:
        durability = dbos_flows.durability(p["url"])

        async def go() -> dict[str, Any]:
            handle = await DBOS.start_workflow_async(dbos_flows.fanout, n, STEP_SECONDS)
            out: dict[str, Any] = await handle.get_result()
            return out

        got = asyncio.run(go())
    finally:
        DBOS.destroy()
    latencies = [d - e for e, d in zip(got["ended"], got["durable"], strict=True)]
    return _summary(got["wall"], latencies, durability)


SYSTEMS = {"durablerun": durablerun, "dbos": dbos}


def run(*, s3: dict[str, Any], dbos_url: str, steps: int, repeats: int, log: Any = print) -> dict[str, Any]:
    """Each system ``repeats`` times, interleaved (the machine is shared); the median of each figure."""
    rows = [("dr-s3-group", "durable-run, S3 (MinIO), group commit", "durablerun", {**s3, "group_commit": True}),
            ("dr-s3-single", "durable-run, S3 (MinIO), one PUT per step", "durablerun",
             {**s3, "group_commit": False}),
            ("dbos-pg", "DBOS on PostgreSQL", "dbos", {"url": dbos_url})]
    measured: dict[str, list[dict[str, Any]]] = {key: [] for key, *_ in rows}
    for repeat in range(repeats):
        for key, label, system, params in rows:
            got = run_json(["durablerun_bench.fanout", system, json.dumps({**params, "steps": steps})])
            measured[key].append(got)
            log(f"  [{repeat + 1}/{repeats}] fan-out of {steps}, {label}: {got['wall_ms']:.0f} ms, step p50 "
                f"{got['p50_ms']:.1f} ms p99 {got['p99_ms']:.1f} ms"
                + (f", {got['puts']} PUTs" if "puts" in got else ""))
    out = []
    for key, label, _, _ in rows:
        runs = measured[key]
        entry: dict[str, Any] = {"key": key, "label": label, "runs": runs}
        for field in ("wall_ms", "p50_ms", "p99_ms", "steps_per_s", "puts", "puts_per_step"):
            if field in runs[0]:
                entry[field] = statistics.median(r[field] for r in runs)
        out.append(entry)
    return {"steps": steps, "step_seconds": STEP_SECONDS, "repeats": repeats, "rows": out}


def main(argv: list[str]) -> int:
    name, params = argv[0], json.loads(argv[1])
    sys.stdout.write(json.dumps(SYSTEMS[name](params)) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
