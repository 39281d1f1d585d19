"""Output streams (``ctx.stream``): what a run can stream, how soon a live reader has it, what a write adds to a step.

On the filesystem store and on MinIO, each in this process (the run on a thread of its own, as the runner has
it; the reader on this one, as ``durablerun stream -f`` reads):

- **Throughput**: one sync step writes ``writes`` pieces of 1 KiB as fast as it can; chunks and MiB sealed per
  second of the step (its end waits for the last chunk to be durable, as every step's journal record does).
- **Latency**: one step writes a line every 20 ms, each carrying the time it was written; a ``StreamReader``
  follows the stream live (``follow``: polls from 50 ms, backing off to 1 s while nothing comes) and notes when
  each line arrives. Reported: p50 and p99 of arrival minus write, beside the batching's own wait
  (``stream_batch_seconds``, 0.25 s), the floor of a chunk that is not full.
- **A step's cost**: ``steps`` sequential steps returning 100 bytes, without and with one 100-byte write each,
  alternating runs; per step, the median over repeats. A step that wrote must have its chunk durable before
  its record, so on a store where a write is a round trip the write is one more of them per step.

``python -m durablerun_bench.streams`` runs this section alone and prints its RESULTS.md section.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import threading
import time
import uuid
from typing import Any

from durablerun import api
from durablerun._private.records.model import EngineConfig
from durablerun._private.storage.stream_reader import StreamReader
from durablerun._private.storage.streams import StreamObjects
from durablerun.engine import Run
from durablerun.stores import RunRef, Store, open_store
from durablerun_bench.alone import alone
from durablerun_bench.util import percentile, quick

LINE_EVERY = 0.02
KIB = "x" * 1023 + "\n"


def _stores(tmp: str, s3: dict[str, Any]) -> dict[str, Store]:
    return {
        "filesystem": open_store(f"file://{tempfile.mkdtemp(prefix='streams-', dir=tmp)}"),
        "S3 (MinIO)": open_store(f"s3://{s3['bucket']}/streams-{uuid.uuid4().hex[:8]}", endpoint_url=s3["endpoint"],
                                 access_key=s3["access_key"], secret_key=s3["secret_key"]),
    }


def _run(store: Store, ref: RunRef, workflow: Any) -> None:
    result = Run(store=store, run=ref, workflow=workflow, input={}).run_attempt()
    if result.outcome != api.Outcome.COMPLETED:
        raise RuntimeError(f"the run ended {result.outcome.value}: {result.message}")


def throughput(store: Store, writes: int) -> dict[str, Any]:
    ref = RunRef.local("throughput-" + uuid.uuid4().hex[:8])
    took: list[float] = []

    async def workflow(ctx: Any, input: Any) -> None:
        out = ctx.stream("out")

        def write() -> None:
            started = time.perf_counter()
            for _ in range(writes):
                out.write(KIB)
            took.append(started)

        await ctx.step("write", write)
        took.append(time.perf_counter())  # the step is journaled: its chunks are durable

    _run(store, ref, workflow)
    seconds = took[1] - took[0]
    rs = store.run_store(ref)
    try:
        chunks = StreamObjects(rs.backend, ref).end("out")
    finally:
        rs.close()
    return {"writes": writes, "seconds": seconds, "chunks": chunks, "chunks_per_s": chunks / seconds,
            "mib_per_s": writes / 1024 / seconds, "writes_per_s": writes / seconds}


def latency(store: Store, lines: int) -> dict[str, Any]:
    ref = RunRef.local("latency-" + uuid.uuid4().hex[:8])

    async def workflow(ctx: Any, input: Any) -> None:
        out = ctx.stream("out")

        def write() -> None:
            for _ in range(lines):
                out.write(f"{time.time():.6f}\n")
                time.sleep(LINE_EVERY)

        await ctx.step("write", write)

    writer = threading.Thread(target=_run, args=(store, ref, workflow), name="run", daemon=True)
    writer.start()
    delays: list[float] = []
    rs = store.run_store(ref)
    try:
        deadline = time.monotonic() + 60
        while not StreamObjects(rs.backend, ref).names():  # the stream exists once its first chunk does
            if time.monotonic() > deadline:
                raise RuntimeError("the stream's first chunk never came")
            time.sleep(0.01)
        for read in StreamReader(rs, "out").follow():
            now = time.time()
            delays += [now - float(line) for line in read.chunk.text.splitlines()]
    finally:
        rs.close()
    writer.join(timeout=60)
    if len(delays) != lines:
        raise RuntimeError(f"the reader read {len(delays)} lines of {lines}")
    return {"lines": lines, "p50_ms": percentile(delays, 50) * 1e3,
            "p99_ms": percentile(delays, 99) * 1e3, "max_ms": max(delays) * 1e3}


def step_cost(store: Store, steps: int, repeats: int) -> dict[str, Any]:
    def once(writes: bool) -> float:
        ref = RunRef.local("cost-" + uuid.uuid4().hex[:8])

        def work(out: Any) -> str:
            if out is not None:
                out.write("y" * 100)
            return "r" * 100

        async def workflow(ctx: Any, input: Any) -> None:
            out = ctx.stream("out") if writes else None
            for i in range(steps):
                await ctx.step(f"s{i}", work, out)

        started = time.perf_counter()
        _run(store, ref, workflow)
        return (time.perf_counter() - started) / steps * 1e6

    once(False), once(True)  # warm: imports, the store's first objects
    runs: dict[bool, list[float]] = {False: [], True: []}
    for repeat in range(repeats):
        for writes in (False, True) if repeat % 2 == 0 else (True, False):
            runs[writes].append(once(writes))
    without, with_ = statistics.median(runs[False]), statistics.median(runs[True])
    return {"steps": steps, "repeats": repeats, "without_us": without, "with_us": with_, "ratio": with_ / without,
            "without_all": runs[False], "with_all": runs[True]}


def bench(*, tmp: str, s3: dict[str, Any], log: Any = print) -> dict[str, Any]:
    writes, lines, steps, repeats = (2_000, 100, 100, 1) if quick() else (20_000, 500, 300, 5)
    rows = []
    for name, store in _stores(tmp, s3).items():
        log(f"  {name}: {writes:,} writes of 1 KiB, {lines} timed lines, {steps} steps without and with a write")
        rows.append({"store": name, "throughput": throughput(store, writes), "latency": latency(store, lines),
                     "cost": step_cost(store, steps, repeats)})
        store.close()
    config = EngineConfig()
    return {"rows": rows, "batch_bytes": config.stream_batch_bytes, "batch_seconds": config.stream_batch_seconds}


def section(t: dict[str, Any], load: str | None = None) -> list[str]:
    batch_ms = t["batch_seconds"] * 1e3
    lines = [
        "## Output streams: throughput, a live reader's delay, a write's cost to a step",
        "",
        *([f"Load before: {load}.", ""] if load else []),
        f"Chunks seal at {t['batch_bytes'] // 1024} KiB or after {batch_ms:.0f} ms, whichever comes first; a live "
        "reader polls from 50 ms, backing off to 1 s while nothing comes (`python -m durablerun_bench.streams`).",
        "",
        "| store | writes of 1 KiB | chunks/s | MiB/s | reader delay p50 | p99 | max | step without a write | "
        "with one | ratio |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for row in t["rows"]:
        thr, lat, cost = row["throughput"], row["latency"], row["cost"]
        lines.append(
            f"| {row['store']} | {thr['writes_per_s']:,.0f}/s | {thr['chunks_per_s']:.1f} | {thr['mib_per_s']:.1f} | "
            f"{lat['p50_ms']:.0f} ms | {lat['p99_ms']:.0f} ms | {lat['max_ms']:.0f} ms | "
            f"{cost['without_us']:,.0f} µs | {cost['with_us']:,.0f} µs | {cost['ratio']:.2f}x |")
    lines += ["", f"The delay's floor is the batching's {batch_ms:.0f} ms (a line waits for its chunk to seal) plus "
              "the reader's poll; a write makes its step wait for its chunk before the step's record, one more store "
              "write per step.", ""]
    return lines


def main(argv: list[str] | None = None) -> int:
    argparse.ArgumentParser(prog="python -m durablerun_bench.streams", description=__doc__.splitlines()[0]
                            ).parse_args(argv)
    with alone("streams", s3=True) as run:
        result = bench(tmp=str(run.root), s3=run.s3_params, log=lambda m: print(m, file=sys.stderr))
        run.report(section(result, str(run.load)), result)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
