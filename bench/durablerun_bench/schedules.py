"""Scheduled runs at once: N DurableRunSchedules of ``* * * * *`` applied together, so that all fire at the same
minute, on the test bed with the operator and the process node.

Each schedule's run is a short workflow. Latencies come from the API objects' own timestamps (to the second):
the tick (the run's scheduled-time annotation) to the run's creation, and to its first pod's creation. Every
schedule must fire exactly once for that tick (one run per schedule named after it), a target. The schedules
are deleted afterwards, their runs with them (owner references).

``python -m durablerun_bench.schedules [--schedules N]`` runs this section alone and prints its RESULTS.md section.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
import uuid
from datetime import datetime
from pathlib import Path
from typing import Any

from durablerun import api
from durablerun_bench import resume
from durablerun_bench.alone import alone
from durablerun_bench.util import api_time, kube_items, latencies, quick
from durablerun_testbed import procs
from durablerun_testbed.testbed import TestBed

POLL = 1.0
#: Target: with the runs suspended, every tick's run exists this long after its tick at the latest.
CREATE_TARGET_S = 10.0


def bench(bed: TestBed, root: Path, run_id: str, *, count: int, log: Any = print) -> dict[str, Any]:
    """The schedules' ticks twice, side by side: first with their runs created suspended (no pod starts: the
    schedule controller alone), then as usual, each run's pod started on the same two cores (on a cluster the
    runners run on other nodes than the operator and the control plane)."""
    log("  the controller alone: the runs created suspended")
    alone = _fire(bed, root, run_id, count=count, start_pods=False, log=log)
    log("  the runs started as usual")
    result = _fire(bed, root, run_id, count=count, start_pods=True, log=log)
    result["controller_alone"] = {k: alone[k] for k in ("fired_on_first_tick", "tick_to_run")}
    return result


def _fire(bed: TestBed, root: Path, run_id: str, *, count: int, start_pods: bool, log: Any) -> dict[str, Any]:
    suffix = "" if start_pods else "-alone"
    namespace, bucket = f"bench-schedules{suffix}", "bench-schedules-" + uuid.uuid4().hex[:8]
    resume.prepare_namespace(bed, namespace, bucket)
    marks = root / "schedule-marks"
    marks.mkdir(parents=True, exist_ok=True)
    run = resume.manifest(bed, namespace, "unused", bucket, marks, {"n": 2, "sleep": 0})
    template = {"spec": {**run["spec"], "suspend": not start_pods}}
    bodies = [{"apiVersion": api.API_VERSION, "kind": api.SCHEDULE_KIND,
               "metadata": {"name": f"s{i:03d}", "namespace": namespace},
               "spec": {"schedule": "* * * * *", "runTemplate": template}} for i in range(count)]
    with resume.operator(bed, namespace, root, run_id):
        # Applied early in a minute, so that every schedule exists well before the next tick.
        procs.wait_for(lambda: 2 <= datetime.now().second <= 20, timeout=70, interval=0.2,
                       what="the start of a minute")
        began = time.monotonic()
        bed.kubectl("apply", "-f", "-", input="\n---\n".join(json.dumps(b) for b in bodies), timeout=300)
        applied = time.monotonic() - began
        log(f"  {count} schedules applied in {applied:.1f} s; waiting for their first tick")

        def first_runs() -> list[dict[str, Any]] | None:
            runs = kube_items(bed, "dr", namespace)
            with_pods = {(pod["metadata"].get("labels") or {}).get(api.LABEL_RUN) for pod in kube_items(bed, "pods",
                                                                                                   namespace)}
            done = {r["metadata"]["labels"].get(api.LABEL_SCHEDULE) for r in runs
                    if r["metadata"]["name"] in with_pods}
            if not start_pods:
                done = {r["metadata"]["labels"].get(api.LABEL_SCHEDULE) for r in runs}
            return runs if len(done) >= count else None

        runs = procs.wait_for(first_runs, timeout=240, interval=POLL, what=f"a run with a pod for each of {count}")
        pods = kube_items(bed, "pods", namespace)
        bed.kubectl("delete", api.SCHEDULE_PLURAL, "--all", "-n", namespace, "--wait=false")
    ticks: dict[str, datetime] = {}
    created: dict[str, datetime] = {}
    for r in runs:
        meta = r["metadata"]
        tick = api_time(meta["annotations"][api.ANNOTATION_SCHEDULED_TIME])
        ticks[meta["name"]], created[meta["name"]] = tick, api_time(meta["creationTimestamp"])
    first_pod: dict[str, datetime] = {}
    for pod in pods:
        owner = (pod["metadata"].get("labels") or {}).get(api.LABEL_RUN)
        if owner in ticks:
            at = api_time(pod["metadata"]["creationTimestamp"])
            first_pod[owner] = min(first_pod.get(owner, at), at)
    first_tick = min(ticks.values())
    on_first = [n for n, t in ticks.items() if t == first_tick]

    def since_tick(later: dict[str, datetime]) -> list[float]:
        return [(later[n] - ticks[n]).total_seconds() for n in on_first if n in later]

    # A run is named after its schedule and tick, so a tick cannot fire twice; one missed would show here.
    return {"schedules": count, "applied_s": applied, "fired_on_first_tick": len(on_first),
            "tick_to_run": latencies(since_tick(created)), "tick_to_pod": latencies(since_tick(first_pod))}


def section(s: dict[str, Any], load: str | None = None) -> list[str]:
    def row(name: str, p: dict[str, float]) -> str:
        return f"| {name} | {p['p50']:.0f} s | {p['p90']:.0f} s | {p['p99']:.0f} s | {p['max']:.0f} s |"

    return [
        f"## Scheduled runs: {s['schedules']} schedules firing in the same minute",
        "",
        *([f"Load before: {load}.", ""] if load else []),
        f"{s['schedules']} DurableRunSchedules of `* * * * *` applied at once ({s['applied_s']:.1f} s), the operator "
        "and the process node on the test bed; timestamps are the API server's, to the second "
        "(`python -m durablerun_bench.schedules`). "
        f"{s['fired_on_first_tick']} of {s['schedules']} fired at the first tick (a run is named after its tick: "
        "none can fire twice)"
        + (f"; {s['controller_alone']['fired_on_first_tick']} of {s['schedules']} with the runs suspended."
           if "controller_alone" in s else "."),
        "",
        "| from the tick to | p50 | p90 | p99 | max |",
        "|---|---|---|---|---|",
        *([row("the run created, its runs suspended (the schedule controller alone)",
               s["controller_alone"]["tick_to_run"])] if "controller_alone" in s else []),
        row("the run created", s["tick_to_run"]),
        row("its pod created", s["tick_to_pod"]),
        "",
        "In the last two rows the runs' pods start on the same two cores as the operator and the control plane, "
        "and a hundred runners starting at once take most of the machine (on a cluster they run on other nodes): "
        "the first row is the schedule controller's own figure.",
        "",
    ]


def main(argv: list[str] | None = None) -> int:
    from durablerun_bench.__main__ import testbed

    parser = argparse.ArgumentParser(prog="python -m durablerun_bench.schedules", description=__doc__.splitlines()[0])
    parser.add_argument("--schedules", type=int, default=20 if quick() else 100)
    args = parser.parse_args(argv)
    with alone("schedules", s3=True) as run:
        assert run.s3
        with testbed(run.root, run.run_id, run.s3) as bed:
            result = bench(bed, run.root, run.run_id, count=args.schedules, log=lambda m: print(m, file=sys.stderr))
        run.report(section(result, str(run.load)), result)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
