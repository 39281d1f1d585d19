"""What tracing costs a step: the same workload on the filesystem store with tracing off and on, in one run.

Each repeat runs the workload untraced, then traced to a real Jaeger on loopback (OTLP over HTTP, the
batch span processor's defaults, in the runner's span export child), each in a fresh interpreter, back to
back: the machine is shared, so each traced run is compared with the untraced run right before it and the
median over repeats is reported. The target is judged on the runner's wall time per step, with the export
child started (the runner waits for it only here, to tell a step's cost from the attempt's: in a pod the
child starts while the runner loads the journal and imports the workflow); the child's CPU per step, and
its start, once per attempt, are reported beside it.
``python -m durablerun_bench.tracing`` runs this section alone and prints its report section.
"""

from __future__ import annotations

import argparse
import json
import logging
import math
import os
import statistics
import sys
import tempfile
import threading
import time
import uuid
from pathlib import Path
from typing import Any

from durablerun_bench import machine
from durablerun_bench.util import quick, run_json
from durablerun_testbed.jaeger import Jaeger

#: The issue's target: tracing on adds at most this share to a step (filesystem store).
TARGET = 0.10
#: Pairs of runs: wall time per step on a shared machine moves by tens of percent between runs.
REPEATS = 25


def bench(*, tmp: str, endpoint: str, steps: int, repeats: int, log: Any = print) -> dict[str, Any]:
    runs: list[dict[str, Any]] = []
    for repeat in range(repeats):
        pair = {}
        # Off then on, then on then off: a machine getting busier or quieter favours neither.
        for traced in (False, True) if repeat % 2 == 0 else (True, False):
            params = {"store": "fs", "dir": tmp, "steps": steps, "trace_endpoint": endpoint if traced else None,
                      "warm": True}
            pair["on" if traced else "off"] = run_json(["durablerun_bench.systems", "durablerun", json.dumps(params)])
        runs.append(pair)
        log(f"  [{repeat + 1}/{repeats}] off {pair['off']['mean_ms']:.3f} ms/step, on {pair['on']['mean_ms']:.3f} "
            f"ms/step, {pair['on'].get('spans_undelivered', 0)} spans undelivered")

    def ratios(key: str) -> list[float]:
        return [r["on"][key] / r["off"][key] - 1 for r in runs]

    def median(side: str, key: str) -> float:
        return float(statistics.median(r[side][key] for r in runs))

    return {"steps": steps, "repeats": repeats, "overhead": statistics.median(ratios("mean_ms")),
            "overhead_all": ratios("mean_ms"),
            "added_us": statistics.median(r["on"]["mean_ms"] - r["off"]["mean_ms"] for r in runs) * 1000,
            "off_ms": median("off", "mean_ms"), "on_ms": median("on", "mean_ms"),
            "off_p99_ms": median("off", "p99_ms"), "on_p99_ms": median("on", "p99_ms"),
            "thread_overhead": statistics.median(ratios("thread_cpu_ms_per_step")),
            "thread_overhead_all": ratios("thread_cpu_ms_per_step"),
            "off_thread_cpu_ms": median("off", "thread_cpu_ms_per_step"),
            "on_thread_cpu_ms": median("on", "thread_cpu_ms_per_step"),
            "cpu_overhead": statistics.median(ratios("cpu_ms_per_step")), "cpu_overhead_all": ratios("cpu_ms_per_step"),
            "off_cpu_ms": median("off", "cpu_ms_per_step"), "on_cpu_ms": median("on", "cpu_ms_per_step"),
            "child_us": statistics.median(r["on"]["child_cpu_ms_per_step"] for r in runs) * 1000,
            "child_us_all": [r["on"]["child_cpu_ms_per_step"] * 1000 for r in runs],
            "undelivered": max(int(r["on"].get("spans_undelivered", 0)) for r in runs), "target": TARGET,
            "sink": {"steps": 20 * steps, **sink_cost(steps=20 * steps)},
            "runner": runner_share(tmp=tmp, steps=3 * steps, pairs=max(1, repeats // 4)),
            "child_start_ms": child_start(endpoint)}


def child_start(endpoint: str, repeats: int = 5) -> float:
    """The span export child's CPU for an attempt that ends no span: its start and exit; ms, median."""
    import resource

    from durablerun._private.telemetry import spanexport

    def once() -> float:
        before = resource.getrusage(resource.RUSAGE_CHILDREN)
        spanexport.start(1, {"OTEL_EXPORTER_OTLP_ENDPOINT": endpoint, "PATH": os.environ["PATH"]}).close()
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
        return (after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime) * 1000

    return statistics.median(once() for _ in range(repeats))


def sink_cost(*, steps: int = 20000, repeats: int = 5) -> dict[str, float]:
    """What tracing costs the step's own thread, alone: the five progress events a step emits, through the
    engine's SinkSet, to the tracing sink (its spans encoded and written to a pipe that ``cat`` drains, as
    the export child would) and to no sink; µs per step."""
    import subprocess
    from decimal import Decimal

    from durablerun._private.engine.sinks import EventKind, ProgressSink, SinkSet
    from durablerun._private.records.model import StepRecord
    from durablerun._private.telemetry import spanexport, tracing

    def per_step(sinks: list[ProgressSink]) -> float:
        emit = SinkSet(sinks).emit
        records = [StepRecord(seq=i, pos=str(i), name="work", encoded=b"x" * 1024) for i in range(steps)]
        started = time.thread_time()
        for r in records:
            emit(EventKind.STEP_STARTED, position=r.pos, name="work", attempt=1)
            emit(EventKind.CHECKPOINT_SAVED, seq=r.seq, key="journal")
            emit(EventKind.RECORD_JOURNALED, record=r)
            emit(EventKind.COST_UPDATED, usd=Decimal(0), tokens=0, steps=r.seq)
            emit(EventKind.STEP_COMPLETED, position=r.pos, name="work", seq=r.seq, ok=True, duration=0.0)
        return (time.thread_time() - started) / steps * 1e6

    def traced() -> float:
        read, write = os.pipe()
        drain = subprocess.Popen(["cat"], stdin=read, stdout=subprocess.DEVNULL)
        os.close(read)
        pipe = spanexport.SpanPipe(write, drain)
        sink = tracing.TracingSink(pipe, "_local/bench", attributes={}, last_finished="")
        try:
            took = per_step([sink])
        finally:
            pipe.close()
        # The SinkSet logs a failing sink and goes on, and a full pipe drops: do not time a broken sink.
        if (pipe.sent, pipe.dropped) != (steps, 0):
            raise RuntimeError(f"the tracing sink wrote {pipe.sent - pipe.dropped} spans of {steps} steps")
        return took

    return {"untraced_us": statistics.median(per_step([]) for _ in range(repeats)),
            "traced_us": statistics.median(traced() for _ in range(repeats))}


def runner_share(*, tmp: str, steps: int = 3000, pairs: int = 6) -> dict[str, Any]:
    """What tracing costs the runner in a real run, without the export: the same filesystem workflow untraced
    and traced, alternating in this process, the tracing sink's spans written to a pipe that a process reads
    every ``spanexport.READ_EVERY`` as the export child does (no OpenTelemetry, no collector); µs of CPU of
    the event loop's thread (which runs the steps) per step, and the pairs' differences."""
    import fcntl
    import subprocess

    from durablerun import api
    from durablerun._private.telemetry import spanexport, tracing
    from durablerun.engine import Run
    from durablerun.stores import RunRef, open_store

    async def work() -> str:
        return "x" * 1024

    async def workflow(ctx: Any, input: Any) -> None:
        for _ in range(steps):
            await ctx.step("work", work)

    def once(traced: bool) -> float:
        store = open_store(f"file://{tempfile.mkdtemp(prefix='share-', dir=tmp)}")
        ref = RunRef.local("share-" + uuid.uuid4().hex[:8])
        sinks: list[Any] = []
        if traced:
            read, write = os.pipe()
            drain = subprocess.Popen([sys.executable, "-c", "import os, time\nwhile os.read(0, 1 << 16): "
                                      f"time.sleep({spanexport.READ_EVERY})"], stdin=read)
            os.close(read)
            fcntl.fcntl(write, fcntl.F_SETPIPE_SZ, spanexport.PIPE_BYTES)
            os.set_blocking(write, False)
            pipe = spanexport.SpanPipe(write, drain)
            sinks = [tracing.TracingSink(pipe, ref.key, attributes={}, last_finished="")]
        started = time.thread_time()
        result = Run(store=store, run=ref, workflow=workflow, input={}, sinks=sinks).run_attempt()
        took = time.thread_time() - started  # the attempt's end (the drain's exit) is waited for, not run
        store.close()
        if result.outcome != api.Outcome.COMPLETED:
            raise RuntimeError(f"the run ended {result.outcome.value}: {result.message}")
        if traced and (pipe.sent, pipe.dropped) != (steps + 1, 0):  # the steps' spans and the attempt's
            raise RuntimeError(f"the tracing sink wrote {pipe.sent - pipe.dropped} spans of {steps + 1}")
        return took / steps * 1e6

    # The drain reports no delivery: the sink's "spans were not delivered" warning at each run's end is expected.
    quiet = logging.getLogger("durablerun")
    level = quiet.level
    quiet.setLevel(logging.ERROR)
    try:
        once(False), once(True)  # warm: imports, the first store
        runs: dict[bool, list[float]] = {False: [], True: []}
        for pair in range(pairs):
            for traced in (False, True) if pair % 2 == 0 else (True, False):
                runs[traced].append(once(traced))
    finally:
        quiet.setLevel(level)
    added = [on - off for on, off in zip(runs[True], runs[False], strict=True)]
    return {"steps": steps, "pairs": pairs, "untraced_us": statistics.median(runs[False]),
            "traced_us": statistics.median(runs[True]), "added_us": statistics.median(added), "added_us_all": added}


def section(t: dict[str, Any], load: str | None = None) -> list[str]:
    """The report's section (report.render)."""
    verdict = "meets" if t["overhead"] <= t["target"] else "misses"

    def per_repeat(key: str) -> str:
        return ", ".join(f"{r * 100:+.1f}%" for r in t[key])

    return [
        "## 5. Tracing overhead per step (filesystem store)",
        "",
        f"{t['steps']:,} sequential steps with 1 KB results, traced to "
        f"{t.get('collector', 'a Jaeger v2 on loopback')} (OTLP/HTTP, the batch span processor's defaults"
        + (", in the runner's span export child" if "child_us" in t else "") + ") beside "
        f"the same run untraced, each in a fresh interpreter, back to back (the order alternating), {t['repeats']} "
        "repeats; the median of the per-repeat ratios"
        + (f"; load average (1/5/15 min) {load} before the section" if load else "") + ".",
        "",
        "| | mean per step (wall) | p99 per step | CPU per step, the step's thread | CPU per step, the runner's "
        "process |",
        "|---|---|---|---|---|",
        *(f"| tracing {side} | {t[side + '_ms']:.3f} ms | {t[side + '_p99_ms']:.3f} ms | "
          f"{t.get(side + '_thread_cpu_ms', math.nan):.3f} ms | {t.get(side + '_cpu_ms', math.nan):.3f} ms |"
          for side in ("off", "on")),
        "",
        f"Tracing adds **{t['overhead'] * 100:.1f}%** to a step's time ({t['added_us']:.0f} µs; per repeat: "
        + ", ".join(f"{r * 100:.1f}%" for r in t["overhead_all"])
        + f"), which {verdict} the target of at most {t['target'] * 100:.0f}%. "
        + (f"CPU of the step's thread {t['thread_overhead'] * 100:+.1f}% (per repeat: "
           f"{per_repeat('thread_overhead_all')}); " if "thread_overhead" in t else "")
        + (f"CPU of the runner's process {t['cpu_overhead'] * 100:+.1f}% (per repeat: "
           f"{per_repeat('cpu_overhead_all')}). " if "cpu_overhead" in t else "")
        + (f"The span export child, a process of its own (on the other core when one is free; its CPU counts "
           f"against the runner's container), spent {t['child_us']:.0f} µs of CPU per step (per repeat: "
           + ", ".join(f"{c:.0f}" for c in t["child_us_all"]) + " µs), its start included"
           + (f"; its start alone (an attempt that ends no span) {t['child_start_ms']:.0f} ms of CPU, once per "
              "attempt, before the steps timed here" if "child_start_ms" in t else "") + ". "
           if "child_us" in t else "")
        + f"Spans not delivered at the end of a run: {t['undelivered']}.",
        "",
        *([f"The step's own share, measured alone (the five progress events of {t['sink']['steps']:,} steps "
           "through the engine's SinkSet, spans encoded and written to a pipe): "
           f"{t['sink']['traced_us'] - t['sink']['untraced_us']:.1f} µs per step "
           f"({t['sink']['traced_us']:.1f} µs with the tracing sink, {t['sink']['untraced_us']:.1f} µs without).",
           ""] if "sink" in t else []),
        *([f"The runner's own share in a real run ({t['runner']['pairs']} alternating pairs of "
           f"{t['runner']['steps']:,}-step runs in one process, spans written to a pipe read every 50 ms as the "
           "export child reads it, no OpenTelemetry, no collector): "
           f"**{t['runner']['added_us']:+.1f} µs** of the event loop thread's CPU per step, "
           f"{t['runner']['added_us'] / t['runner']['untraced_us'] * 100:+.1f}% "
           f"({t['runner']['traced_us']:.1f} µs traced, {t['runner']['untraced_us']:.1f} µs untraced; per pair: "
           + ", ".join(f"{a:+.1f}" for a in t["runner"]["added_us_all"]) + " µs).",
           ""] if "runner" in t else []),
    ]


class _Receiver:
    """An OTLP/HTTP receiver on loopback that counts the spans it is sent and keeps none (``--receiver``): the
    runner's side of the cost where no Jaeger is built. It spends less CPU than a collector that stores."""

    def __init__(self) -> None:
        from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

        from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
            ExportTraceServiceRequest,
            ExportTraceServiceResponse,
        )

        receiver = self
        self.spans = 0

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                request = ExportTraceServiceRequest.FromString(self.rfile.read(int(self.headers["Content-Length"])))
                receiver.spans += sum(len(s.spans) for r in request.resource_spans for s in r.scope_spans)
                body = ExportTraceServiceResponse().SerializeToString()
                self.send_response(200)
                self.send_header("Content-Type", "application/x-protobuf")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, format: str, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.endpoint = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, name="otlp-receiver", daemon=True).start()

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m durablerun_bench.tracing", description=__doc__.splitlines()[0])
    parser.add_argument("--receiver", action="store_true",
                        help="send spans to a loopback OTLP receiver that keeps none, instead of Jaeger")
    args = parser.parse_args(argv)
    root = Path(tempfile.mkdtemp(prefix="durablerun-bench-tracing-"))
    run_id = "bench-" + uuid.uuid4().hex[:8]
    load = machine.load()
    collector: Jaeger | _Receiver = _Receiver() if args.receiver else Jaeger(root / "jaeger", run_id).start()
    endpoint = collector.endpoint if isinstance(collector, _Receiver) else collector.otlp_endpoint
    try:
        steps, repeats = (200, 1) if quick() else (1000, REPEATS)
        result = bench(tmp=str(root), endpoint=endpoint, steps=steps, repeats=repeats,
                       log=lambda m: print(m, file=sys.stderr))

    finally:
        collector.stop()
    if isinstance(collector, _Receiver):
        result["collector"] = f"a loopback OTLP/HTTP receiver that kept none ({collector.spans} spans received)"
    print("\n".join(section(result, str(load))))
    print(json.dumps({**result, "load_before": load, "load_after": machine.load()}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
