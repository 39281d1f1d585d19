"""python -m durablerun_bench [--only SECTION ...] [--out bench/RESULTS.md]: run the benchmarks.

Sections: steps (per-step overhead; a fan-out on S3 with and without group
commit), replay (journals of growing size, DBOS recovery), resume (SIGKILL ->
first new step on the test bed), writecost (what one status write costs the
API server, object sizes), scale (the operator with many DurableRuns, active
and waiting), tracing (per-step overhead with traces on, beside off),
timelines (the run browser's timeline page of a 100,000-record journal), kueue
(N runs through a ClusterQueue with quota for M), quotas (a fleet of agent runs of three namespaces
sharing one model's limit, without and with a ModelQuota in Redis), browser (the run browser on a
namespace of 10,000 runs: first paint, answers, how soon a change is shown).
BENCH_QUICK=1 runs a fast smoke version.
Every server is started here on loopback and stopped at the end.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import signal
import tempfile
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from durablerun_bench import (
    browser,
    failover,
    fanout,
    kueue,
    machine,
    objsize,
    postgres,
    preemption,
    quotas,
    replay,
    report,
    resume,
    scale,
    schedules,
    steps,
    streams,
    timelines,
    tracing,
    webhooks,
    writecost,
)
from durablerun_bench.util import quick
from durablerun_testbed import procs, realnode
from durablerun_testbed.jaeger import Jaeger
from durablerun_testbed.s3 import S3Server
from durablerun_testbed.testbed import TestBed

BENCH_DIR = Path(__file__).resolve().parent.parent
REPO = BENCH_DIR.parent
SECTIONS = ("steps", "replay", "resume", "writecost", "webhooks", "scale", "tracing", "timelines", "streams",
            "schedules", "kueue", "preemption", "quotas", "browser")


@dataclass(frozen=True)
class Sizes:
    steps: int
    step_repeats: int
    replay_sizes: tuple[int, ...]
    replay_repeats: int
    export_from: int
    dbos_steps: int
    resume_repeats: int
    scale_runs: tuple[int, ...]  # each a measurement of its own, side by side in one table
    scale_lease: int
    write_cost_writes: int = 300
    write_cost_rounds: int = 3
    children: int = 1000
    events: int = 500
    waiting_runs: int = 1000
    through_runners: int = scale.THROUGH_RUNNERS
    woken: int = 100
    idle_seconds: float = 60.0
    fanout_steps: int = 100
    fanout_repeats: int = 5
    shard_runs: int = 3000
    timeline_records: int = 100_000
    kueue_runs: int = 100
    kueue_quota: int = 10
    schedules: int = 100
    preemptions: int = 5
    browser_runs: int = 10_000

    @classmethod
    def pick(cls) -> Sizes:
        if quick():
            return cls(steps=300, step_repeats=1, replay_sizes=(100, 1_000, 10_000), replay_repeats=1,
                       export_from=10_000, dbos_steps=1_000, resume_repeats=1, scale_runs=(60,), scale_lease=15,
                       write_cost_writes=50, write_cost_rounds=1, children=100, events=50, waiting_runs=60,
                       through_runners=30, woken=10, idle_seconds=10.0, fanout_repeats=1, shard_runs=60,
                       timeline_records=20_000, kueue_runs=20, kueue_quota=4,
                       schedules=20, preemptions=2, browser_runs=1_000)
        runs = tuple(int(n) for n in os.environ.get("BENCH_SCALE_RUNS", "1000").split(","))
        waiting = int(os.environ.get("BENCH_WAITING_RUNS", "1000"))
        return cls(steps=1_000, step_repeats=3, replay_sizes=(100, 10_000, 100_000), replay_repeats=3,
                   export_from=100_000, dbos_steps=10_000, resume_repeats=3, scale_runs=runs, scale_lease=180,
                   waiting_runs=waiting, woken=min(100, waiting),
                   shard_runs=int(os.environ.get("BENCH_SHARD_RUNS", "3000")))


def log(message: str) -> None:
    print(f"[bench {time.strftime('%H:%M:%S')}] {message}", flush=True)


@contextlib.contextmanager
def testbed(root: Path, run_id: str, s3: S3Server) -> Iterator[TestBed]:
    bed = TestBed(root / "k8s", id=run_id).start(s3=s3)
    try:
        bed.install_crds(timeout=60)
        yield bed
    finally:
        bed.stop()


@contextlib.contextmanager
def real_node_bed(root: Path, run_id: str, tmp: Path) -> Iterator[tuple[TestBed, str]]:
    """A test bed on a kubelet and containerd, with dr_flows in a workflow image imported into it: (bed, image).
    Raises RealNodeUnavailable where the machine cannot run it."""
    realnode.check_machine()
    realnode.image_archives()
    staged = tmp / f"bench-image-{uuid.uuid4().hex[:6]}"
    shutil.copytree(BENCH_DIR / "durablerun_bench", staged / "durablerun_bench",
                    ignore=shutil.ignore_patterns("__pycache__"))
    archive, image = realnode.build_workflow_image(staged)
    bed = TestBed(root / f"k8s-real-{uuid.uuid4().hex[:6]}", id=run_id).start(real_node=True)
    try:
        assert bed.real_node
        bed.real_node.import_image(archive)
        bed.install_crds(timeout=60)
        yield bed, image
    finally:
        bed.stop()


def _resume_on_real_node(root: Path, run_id: str, tmp: Path, repeats: int, log: Any) -> dict[str, Any] | None:
    """The resume section again on a kubelet and containerd, with dr_flows in a workflow image."""
    try:
        with real_node_bed(root, run_id, tmp) as (bed, image):
            log("resume after SIGKILL on the real node (kubelet, containerd)")
            return resume.bench(bed, root, run_id, repeats=repeats, steps=400, kill_after=200, sleep=0.01, log=log,
                                kill=resume.kill_container, image=image)
    except realnode.RealNodeUnavailable as reason:
        log(f"resume on the real node: skipped ({reason})")
        return None


def _preemption_on_real_node(root: Path, run_id: str, tmp: Path, preemptions: int,
                             log: Any) -> dict[str, Any] | None:
    try:
        with real_node_bed(root, run_id, tmp) as (bed, image):
            return preemption.bench(bed, root, run_id, image=image, steps=4 + 2 * preemptions, seconds=4.0,
                                    preemptions=preemptions, log=log)
    except realnode.RealNodeUnavailable as reason:
        log(f"preemption on the real node: skipped ({reason})")
        return None


def _interrupt(signum: int, frame: object) -> None:
    raise KeyboardInterrupt


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m durablerun_bench", description=__doc__.splitlines()[0])
    parser.add_argument("--only", action="append", choices=SECTIONS, help="run only this section (repeatable)")
    parser.add_argument("--out", type=Path, default=BENCH_DIR / "RESULTS.md")
    parser.add_argument("--json", type=Path, default=BENCH_DIR / "out" / "results.json")
    parser.add_argument("--merge", action="store_true",
                        help="keep the other sections of the last run (--json) and replace only these")
    args = parser.parse_args(argv)
    # SIGTERM (a stopped make, a session ending) unwinds like Ctrl-C, so every server is stopped.
    signal.signal(signal.SIGTERM, _interrupt)
    sections = tuple(args.only or SECTIONS)
    sizes = Sizes.pick()
    run_id = "bench-" + uuid.uuid4().hex[:8]
    root = Path(tempfile.mkdtemp(prefix="durablerun-bench-"))
    tmp = root / "tmp"
    tmp.mkdir()
    results: dict[str, Any] = {"quick": quick(), "sizes": sizes.__dict__, "sections": list(sections),
                               "machine": machine.info(str(tmp)), "load_before": machine.load(),
                               "started": time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime())}
    started = time.monotonic()
    previous: dict[str, Any] = {}
    if args.merge and args.json.exists():
        previous = json.loads(args.json.read_text())
    log(f"{'quick' if quick() else 'full'} run of {', '.join(sections)} in {root}")
    s3 = S3Server(root / "s3", run_id).start()
    try:
        s3.create_bucket("bench")
        s3_params = {"endpoint": s3.endpoint_url, "access_key": s3.access_key, "secret_key": s3.secret_key,
                     "bucket": "bench"}
        results["minio"] = str(s3.process.popen.args[0]).rsplit("/", 1)[-1] if s3.process else None  # type: ignore[index]
        if "steps" in sections or "replay" in sections:
            with postgres.cluster() as pg:
                results["postgres"] = pg.version
                if "steps" in sections:
                    log("per-step overhead")
                    env = steps.Env(tmp=str(tmp), s3=s3_params, pg_dsn=pg.dsn(pg.create_database("floor")),
                                    dbos_pg_url=pg.sqlalchemy_url(pg.create_database("dbos")),
                                    langgraph_pg_dsn=pg.dsn(pg.create_database("langgraph")),
                                    dbos_sqlite_url="sqlite:///unused")
                    results["steps"] = steps.run(env, steps=sizes.steps, repeats=sizes.step_repeats, log=log)
                    log(f"a fan-out of {sizes.fanout_steps} steps: S3 with and without group commit, DBOS")
                    results["steps"]["fanout"] = fanout.run(
                        s3=s3_params, dbos_url=pg.sqlalchemy_url(pg.create_database("fanout")),
                        steps=sizes.fanout_steps, repeats=sizes.fanout_repeats, log=log)
                if "replay" in sections:
                    log("replay and recovery")
                    results["replay"] = replay.bench(
                        tmp=str(tmp), s3=s3_params, dbos_url=pg.sqlalchemy_url(pg.create_database("recovery")),
                        sizes=list(sizes.replay_sizes), dbos_steps=sizes.dbos_steps, repeats=sizes.replay_repeats,
                        export_from=sizes.export_from, log=log)
        if "timelines" in sections:
            log("the run browser's timeline: one page of a long journal, beside the whole journal")
            results["timelines"] = timelines.bench(tmp=str(tmp), s3=s3_params, records=sizes.timeline_records,
                                                   repeats=sizes.replay_repeats, log=log)
        if "streams" in sections:
            log("output streams: throughput, a live reader's delay, a write's cost to a step")
            results["streams"] = streams.bench(tmp=str(tmp), s3=s3_params, log=log)
        if "preemption" in sections:
            log(f"preemption through Kueue on the real node: {sizes.preemptions} preemptions, cut off or at a step "
                "boundary")
            results["preemption"] = _preemption_on_real_node(root, run_id, tmp, sizes.preemptions, log)
        if "quotas" in sections:
            log("model quotas: a fleet of runs of three namespaces on one model's limit, without and with a quota")
            results["quotas"] = quotas.bench(root, run_id)
        if "tracing" in sections:
            log("tracing overhead per step (filesystem store, Jaeger on loopback)")
            jaeger = Jaeger(root / "jaeger", run_id).start()
            try:
                results["tracing"] = tracing.bench(tmp=str(tmp), endpoint=jaeger.otlp_endpoint, steps=sizes.steps,
                                                   repeats=1 if quick() else tracing.REPEATS, log=log)
            finally:
                jaeger.stop()
        if {"resume", "scale", "writecost", "webhooks", "schedules", "kueue", "browser"} & set(sections):
            log("starting the test bed (kube-apiserver, etcd, controller-manager, process node)")
            with testbed(root, run_id, s3) as bed:
                results["kubernetes"] = bed.kubectl("version", "-o", "json").stdout and json.loads(
                    bed.kubectl("version", "-o", "json").stdout).get("serverVersion", {}).get("gitVersion")
                if "resume" in sections:
                    log("resume after SIGKILL on the test bed")
                    results["resume"] = resume.bench(bed, root, run_id, repeats=sizes.resume_repeats, steps=400,
                                                     kill_after=200, sleep=0.01, log=log)
                if "resume" in sections:
                    results["resume_real"] = _resume_on_real_node(root, run_id, tmp, sizes.resume_repeats, log)
                if "writecost" in sections:
                    log("what one status write costs the API server")
                    results["writecost"] = writecost.bench(bed, writes=sizes.write_cost_writes,
                                                           rounds=sizes.write_cost_rounds, log=log)
                    log(f"object size: a parent of {sizes.children} children, a run sent {sizes.events} events")
                    results["writecost"]["objects"] = objsize.bench(bed, children=sizes.children,
                                                                    events=sizes.events, log=log)
                if "webhooks" in sections:
                    log("the webhook ingress: 1,000 capability-URL POSTs to 100 runs")
                    results["webhooks"] = webhooks.bench(bed, root, run_id, runs=100, requests=1000)
                if "schedules" in sections:
                    log(f"scheduled runs: {sizes.schedules} schedules firing in the same minute")
                    results["schedules"] = schedules.bench(bed, root, run_id, count=sizes.schedules, log=log)
                if "kueue" in sections:  # before scale, which stops the process node
                    log(f"admission through Kueue: {sizes.kueue_runs} runs, quota for {sizes.kueue_quota}")
                    results["kueue"] = kueue.bench(bed, root, run_id, runs=sizes.kueue_runs, quota=sizes.kueue_quota,
                                                   steps=5, sleep=0.5, log=log)
                if "scale" in sections:
                    if bed.node_process:
                        bed.node_process.stop()  # the stand-in renews leases; no runner processes
                        bed.node_process = None
                    measured = []
                    for runs in sizes.scale_runs:
                        log(f"operator scale: {runs} DurableRuns")
                        measured.append(scale.bench(bed, root, run_id, runs=runs, lease_seconds=sizes.scale_lease,
                                                    stopped=max(10, runs // 20), wake=sizes.woken, log=log))
                    results["scale"] = {**measured[0], "more_active": measured[1:]}
                    if sizes.shard_runs:  # BENCH_SHARD_RUNS=0: not this time
                        log(f"{len(failover.REPLICAS)} sharded operators, {sizes.shard_runs} DurableRuns, one "
                            "replica killed")
                        results["scale"]["failover"] = failover.bench(
                            bed, root, run_id, runs=sizes.shard_runs, lease_seconds=sizes.scale_lease,
                            stopped=max(12, sizes.shard_runs // 50), log=log)
                    log(f"operator scale: {sizes.waiting_runs} waiting DurableRuns")
                    results["scale"]["waiting"] = scale.waiting(bed, root, run_id, runs=sizes.waiting_runs,
                                                                through_runners=sizes.through_runners,
                                                                woken=sizes.woken, idle_seconds=sizes.idle_seconds,
                                                                log=log)
                if "browser" in sections:  # last: its runs have no pods, and no operator may see them
                    log(f"the run browser on a namespace of {sizes.browser_runs} runs")
                    results["browser"] = browser.bench(bed, root, run_id, runs=sizes.browser_runs, log=log)
    finally:
        s3.stop()
        for pid, _ in procs.processes_with_marker(run_id):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, 9)
        if not os.environ.get("BENCH_KEEP"):
            shutil.rmtree(root, ignore_errors=True)
    results["load_after"] = machine.load()
    results["seconds"] = time.monotonic() - started
    if previous:
        # This run's sections replace the last run's; the header keeps describing the last full run.
        rerun = {s: {"started": results["started"], "load_before": results["load_before"],
                     "load_after": results["load_after"], "commit": results["machine"].get("commit")}
                 for s in sections}
        results = {**previous, **{s: results[s] for s in sections if s in results},
                   "reruns": {**previous.get("reruns", {}), **rerun}}
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(results, indent=1, default=str))
    args.out.write_text(report.render(results))
    log(f"done in {(time.monotonic() - started) / 60:.1f} min: {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
