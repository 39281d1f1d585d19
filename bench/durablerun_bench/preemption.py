"""Preemption through Kueue on the real node: how many steps a preempted run executes again, stopping at a step
boundary against being cut off mid-step.

On a kubelet and containerd with a real Kueue manager and the operator (``kueue`` on), a ClusterQueue with room
for one runner preempts within itself by priority. A low-priority run of ``steps`` steps of ``seconds`` each is
preempted ``preemptions`` times: each time, once the run is a random share into a step, a high-priority run of one
short step is applied; Kueue evicts the low run's Workload, the operator stops its pod, the high run runs, and
the low run is admitted again and resumes from its journal. Side by side in one run, the same scenario with:

- ``stopGracePeriod: 0s``: the runner's steps in flight are cancelled at once (what a preemption did before
  issue 40: a preemption was a crash for the step in flight);
- the default: the runner starts no new step and lets the one in flight finish and be journaled.

Every execution of a step is marked by the step itself in a file on the host (``dr_flows``, a hostPath mount), so
the count is the workflow's own, not the operator's. Reported: executions beyond the first per preemption, the
step-seconds they cost, and the time from the high run's creation to its pod, with each variant.

``python -m durablerun_bench.preemption`` runs this section alone and prints its RESULTS.md section.
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import time
import uuid
from collections import Counter
from pathlib import Path
from typing import Any

from durablerun import api
from durablerun_bench import resume
from durablerun_bench.alone import alone
from durablerun_bench.kueue import GROUP
from durablerun_bench.util import api_time, kube_items, quick
from durablerun_testbed import procs, realnode
from durablerun_testbed.kueue import Kueue
from durablerun_testbed.testbed import TestBed

VARIANTS = {"cut off mid-step (stopGracePeriod 0s)": "0s", "at a step boundary (the default)": None}


def _objects(namespace: str, suffix: str) -> list[dict[str, Any]]:
    return [
        {"apiVersion": GROUP, "kind": "ResourceFlavor", "metadata": {"name": f"flavor-{suffix}"}},
        {"apiVersion": GROUP, "kind": "ClusterQueue", "metadata": {"name": f"cq-{suffix}"},
         "spec": {"namespaceSelector": {}, "preemption": {"withinClusterQueue": "LowerPriority"},
                  "resourceGroups": [{"coveredResources": ["cpu"], "flavors": [
                      {"name": f"flavor-{suffix}", "resources": [{"name": "cpu", "nominalQuota": "1"}]}]}]}},
        {"apiVersion": GROUP, "kind": "LocalQueue", "metadata": {"name": "lq", "namespace": namespace},
         "spec": {"clusterQueue": f"cq-{suffix}"}},
        *({"apiVersion": GROUP, "kind": "WorkloadPriorityClass", "metadata": {"name": f"{level}-{suffix}"},
           "value": value} for level, value in (("low", 10), ("high", 1000))),
    ]


def _queued(bed: TestBed, namespace: str, name: str, bucket: str, marks: Path, image: str, priority: str,
            input: dict[str, Any], grace: str | None) -> dict[str, Any]:
    marks.mkdir(parents=True, exist_ok=True)
    marks.chmod(0o777)
    body = resume.manifest(bed, namespace, name, bucket, marks, input, image=image)
    body["metadata"]["labels"] = {api.LABEL_QUEUE_NAME: "lq", api.LABEL_PRIORITY_CLASS: priority}
    body["spec"]["template"]["spec"]["containers"][0]["resources"] = {"requests": {"cpu": "1"}}
    body["spec"]["policy"]["leaseDuration"] = "30s"
    if grace is not None:
        body["spec"]["policy"]["stopGracePeriod"] = grace
    return body


def _executions(marks: Path) -> Counter[str]:
    """How often each step ran, as the steps marked it (``step<i> <attempt> <time>`` lines)."""
    path = marks / "marks.txt"
    lines = path.read_text().splitlines() if path.exists() else []
    return Counter(line.split()[0] for line in lines if line.startswith("step"))


def _phase(bed: TestBed, namespace: str, name: str) -> str:
    body = json.loads(bed.kubectl("get", "dr", name, "-n", namespace, "-o", "json").stdout)
    return str((body.get("status") or {}).get("phase") or "")


def one(bed: TestBed, root: Path, run_id: str, *, label: str, grace: str | None, image: str, steps: int,
        seconds: float, preemptions: int, log: Any) -> dict[str, Any]:
    suffix = uuid.uuid4().hex[:6]
    namespace, bucket = f"preempt-{suffix}", f"preempt-{suffix}"
    resume.prepare_namespace(bed, namespace, bucket)
    bed.kubectl("apply", "--server-side", "-f", "-", input="\n---\n".join(
        json.dumps(o) for o in _objects(namespace, suffix)))
    low_marks = root / f"marks-{suffix}-low"
    bed.kubectl("apply", "-f", "-", input=json.dumps(_queued(
        bed, namespace, "low", bucket, low_marks, image, f"low-{suffix}", {"n": steps, "sleep": seconds}, grace)))
    to_pod: list[float] = []
    with resume.operator(bed, namespace, root, run_id, env={api.OperatorEnv.KUEUE: "true"}):
        for k in range(preemptions):
            _preempt(bed, namespace, bucket, root, suffix, image, low_marks, k, seconds, to_pod)
            log(f"    {label}: preemption {k + 1} of {preemptions}, the high run's pod {to_pod[-1]:.0f} s after it")
        procs.wait_for(lambda: _phase(bed, namespace, "low") == api.Phase.SUCCEEDED,
                       timeout=steps * seconds + 600, interval=1, what="the low run to succeed")
    status = json.loads(bed.kubectl("get", "dr", "low", "-n", namespace, "-o", "json").stdout)["status"]
    counts = _executions(low_marks)
    again = sum(n - 1 for n in counts.values())
    bed.kubectl("delete", "namespace", namespace, "--wait=false")
    return {"label": label, "grace": grace, "preemptions": preemptions, "disruptions": status.get("disruptions", 0),
            "restarts": status.get("restarts", 0), "steps_run": len(counts), "executed_again": again,
            "again_per_preemption": again / preemptions, "seconds_lost": again * seconds,
            "high_to_pod_s": to_pod}


def _preempt(bed: TestBed, namespace: str, bucket: str, root: Path, suffix: str, image: str, low_marks: Path,
             k: int, seconds: float, to_pod: list[float]) -> None:
    """Once the low run is a random share into a step, a high-priority run preempts it; until it has succeeded."""
    ran = sum(_executions(low_marks).values())
    # Into a step: a new step of this admission has started, then a random share of a step's time.
    procs.wait_for(lambda: sum(_executions(low_marks).values()) > ran, timeout=300, interval=0.2,
                   what=f"the low run's next step (preemption {k + 1})")
    time.sleep(random.uniform(0.2, 0.8) * seconds)
    high = f"high-{k}"
    bed.kubectl("apply", "-f", "-", input=json.dumps(_queued(
        bed, namespace, high, bucket, root / f"marks-{suffix}-{high}", image, f"high-{suffix}",
        {"n": 1, "sleep": 0.1}, None)))
    procs.wait_for(lambda: _phase(bed, namespace, high) == api.Phase.SUCCEEDED, timeout=300, interval=0.5,
                   what=f"{high} to succeed")
    run = json.loads(bed.kubectl("get", "dr", high, "-n", namespace, "-o", "json").stdout)
    pods = [p for p in kube_items(bed, "pods", namespace)
            if (p["metadata"].get("labels") or {}).get(api.LABEL_RUN) == high]
    to_pod.append(min((api_time(p["metadata"]["creationTimestamp"]) - api_time(run["metadata"]["creationTimestamp"])
                       ).total_seconds() for p in pods))


def bench(bed: TestBed, root: Path, run_id: str, *, image: str, steps: int, seconds: float, preemptions: int,
          log: Any = print) -> dict[str, Any]:
    kueue = Kueue(root / "preempt-kueue", run_id, bed.kubeconfig).start(bed.kubectl)
    try:
        rows = []
        for label, grace in VARIANTS.items():
            log(f"  {label}: {steps} steps of {seconds:g} s, preempted {preemptions} times")
            rows.append(one(bed, root, run_id, label=label, grace=grace, image=image, steps=steps, seconds=seconds,
                            preemptions=preemptions, log=log))
        kueue.check_alive()
    finally:
        kueue.stop()
    return {"steps": steps, "seconds": seconds, "preemptions": preemptions, "rows": rows}


def section(p: dict[str, Any], load: str | None = None) -> list[str]:
    lines = [
        "## Preemption through Kueue on the real node: steps executed again",
        "",
        *([f"Load before: {load}.", ""] if load else []),
        f"A low-priority run of {p['steps']} steps of {p['seconds']:g} s, preempted {p['preemptions']} times by a "
        "high-priority run in a ClusterQueue with room for one runner, each time a random share (20-80%) into a "
        "step; kubelet and containerd, a real Kueue, the operator with `kueue` on. Executions counted by the steps "
        "themselves (`python -m durablerun_bench.preemption`).",
        "",
        "| the runner stops | preemptions (disruptions) | steps executed again | per preemption | "
        "step-seconds run again | high run's pod after it (median) |",
        "|---|---|---|---|---|---|",
    ]
    for row in p["rows"]:
        ordered = sorted(row["high_to_pod_s"])
        lines.append(f"| {row['label']} | {row['preemptions']} ({row['disruptions']}) | {row['executed_again']} | "
                     f"{row['again_per_preemption']:.2f} | {row['seconds_lost']:g} s | "
                     f"{ordered[len(ordered) // 2]:.0f} s |")
    return [*lines, ""]


def main(argv: list[str] | None = None) -> int:
    from durablerun_bench.__main__ import real_node_bed

    parser = argparse.ArgumentParser(prog="python -m durablerun_bench.preemption", description=__doc__.splitlines()[0])
    parser.add_argument("--preemptions", type=int, default=2 if quick() else 5)
    args = parser.parse_args(argv)
    with alone("preemption") as run:
        (run.root / "tmp").mkdir()
        try:
            with real_node_bed(run.root, run.run_id, run.root / "tmp") as (bed, image):
                result = bench(bed, run.root, run.run_id, image=image, steps=4 + 2 * args.preemptions, seconds=4.0,
                               preemptions=args.preemptions, log=lambda m: print(m, file=sys.stderr))
        except realnode.RealNodeUnavailable as reason:
            print(f"preemption on the real node: cannot run here ({reason})", file=sys.stderr)
            return 1
        run.report(section(result, str(run.load)), result)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
