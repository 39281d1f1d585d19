"""Admission through Kueue at scale: N DurableRuns created at once in a LocalQueue whose ClusterQueue has quota
for M runners, on the test bed with a real Kueue manager (hack/durablerun_testbed/kueue.py) and the operator.

Each runner asks for 1 CPU and the ClusterQueue has M CPUs, so Kueue admits M at a time and each finished run
gives its quota to the next. Latencies come from the API objects' timestamps: each run's creation, its
Workload's ``Admitted`` condition (its lastTransitionTime, seen through a watch while the Workload exists: the
operator deletes it when the attempt ends), its pod's creation. Not Kueue's ``Admitted`` Event: Kueue posts
Events through client-go's event broadcaster, which queues at most 1,000 and drops the rest without a word while
its writer, held to the manager's client rate, is behind; and each time Kueue tries the waiting Workloads again it
posts a ``Pending`` Event for each of them, so with many waiting, ``Admitted`` Events are lost (bench/RESULTS.md).
The most runner pods alive (Pending or Running) at once, which must never exceed M, is watched by polling the
pods until every run has succeeded.

``python -m durablerun_bench.kueue`` runs this section alone and prints its RESULTS.md section.
"""

from __future__ import annotations

import argparse
import json
import math
import subprocess
import sys
import threading
import time
import uuid
from datetime import datetime
from pathlib import Path
from typing import Any

from durablerun import api
from durablerun_bench import resume
from durablerun_bench.alone import alone
from durablerun_bench.util import api_time, kube_items, latencies, quick
from durablerun_operator import kueue as operator_kueue
from durablerun_testbed import binaries
from durablerun_testbed.kueue import Kueue
from durablerun_testbed.testbed import TestBed

GROUP = "kueue.x-k8s.io/v1beta2"
POLL = 0.25
#: One line per Workload change: its name, its Admitted condition's status and lastTransitionTime.
_ADMITTED = '{.metadata.name} {.status.conditions[?(@.type=="Admitted")].status} ' \
            '{.status.conditions[?(@.type=="Admitted")].lastTransitionTime}{"\\n"}'


class Admissions:
    """When each Workload was first admitted, by name: its ``Admitted`` condition's lastTransitionTime, as one
    ``kubectl get --watch`` sees every change of the namespace's Workloads."""

    def __init__(self, bed: TestBed, namespace: str) -> None:
        self.at: dict[str, datetime] = {}
        self.ended_early = False
        self.process = subprocess.Popen(
            [str(binaries.kubectl()), "--kubeconfig", str(bed.kubeconfig), "get", "workloads.kueue.x-k8s.io",
             "-n", namespace, "--watch", "-o", f"jsonpath={_ADMITTED}"],
            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
        self.thread = threading.Thread(target=self._read, name="admissions", daemon=True)
        self.thread.start()

    def _read(self) -> None:
        assert self.process.stdout
        for line in self.process.stdout:
            name, status, at = [*line.split(), "", ""][:3]
            if status == "True" and name not in self.at:
                self.at[name] = api_time(at)

    def __enter__(self) -> Admissions:
        return self

    def __exit__(self, *exc: object) -> None:
        """Stop watching; ``ended_early`` says whether the watch had ended before (missing admissions)."""
        self.ended_early = self.process.poll() is not None
        self.process.terminate()
        self.process.wait(timeout=10)
        self.thread.join(timeout=10)


def _queues(namespace: str, quota: int) -> list[dict[str, Any]]:
    return [
        {"apiVersion": GROUP, "kind": "ResourceFlavor", "metadata": {"name": "bench-flavor"}},
        {"apiVersion": GROUP, "kind": "ClusterQueue", "metadata": {"name": "bench-cq"},
         "spec": {"namespaceSelector": {}, "resourceGroups": [{"coveredResources": ["cpu"], "flavors": [
             {"name": "bench-flavor", "resources": [{"name": "cpu", "nominalQuota": str(quota)}]}]}]}},
        {"apiVersion": GROUP, "kind": "LocalQueue", "metadata": {"name": "bench-lq", "namespace": namespace},
         "spec": {"clusterQueue": "bench-cq"}},
    ]


def bench(bed: TestBed, root: Path, run_id: str, *, runs: int, quota: int, steps: int, sleep: float,
          log: Any = print) -> dict[str, Any]:
    namespace, bucket = "bench-kueue", "bench-kueue-" + uuid.uuid4().hex[:8]
    resume.prepare_namespace(bed, namespace, bucket)
    marks = root / "kueue-marks"
    marks.mkdir(parents=True, exist_ok=True)
    log("starting the Kueue manager")
    started_kueue = time.monotonic()
    kueue = Kueue(root / "kueue", run_id, bed.kubeconfig).start(bed.kubectl)
    kueue_start = time.monotonic() - started_kueue
    try:
        bed.kubectl("apply", "--server-side", "-f", "-", input="\n---\n".join(
            json.dumps(o) for o in _queues(namespace, quota)))
        with resume.operator(bed, namespace, root, run_id, env={api.OperatorEnv.KUEUE: "true"}):
            manifests = []
            for i in range(runs):
                manifest = resume.manifest(bed, namespace, f"q{i}", bucket, marks, {"n": steps, "sleep": sleep})
                manifest["metadata"]["labels"] = {api.LABEL_QUEUE_NAME: "bench-lq"}
                manifest["spec"]["template"]["spec"]["containers"][0]["resources"] = {"requests": {"cpu": "1"}}
                manifests.append(manifest)
            log(f"{runs} runs, quota for {quota}")
            with Admissions(bed, namespace) as admissions:
                began = time.monotonic()
                bed.kubectl("apply", "-f", "-", input="\n---\n".join(json.dumps(m) for m in manifests), timeout=300)
                applied = time.monotonic() - began
                done: set[str] = set()
                most_live = 0
                deadline = began + 300 + runs * (steps * sleep + 10) / quota
                while len(done) < runs:
                    if time.monotonic() > deadline:
                        raise TimeoutError(f"{runs - len(done)} of {runs} runs did not succeed in time")
                    phases = [(p.get("status") or {}).get("phase") for p in kube_items(bed, "pods", namespace)]
                    live = [p for p in phases if p in ("Pending", "Running")]  # literal-ok: the pods' phases
                    most_live = max(most_live, len(live))
                    done |= {r["metadata"]["name"] for r in kube_items(bed, "dr", namespace)
                             if (r.get("status") or {}).get("phase") == api.Phase.SUCCEEDED}
                    time.sleep(POLL)
            if admissions.ended_early:
                raise RuntimeError("the watch of Workloads ended before the runs did: admissions may be missing")
        kueue.check_alive()
        timing = _timing(bed, namespace, admissions.at)
    finally:
        kueue.stop()
    return {"runs": runs, "quota": quota, "steps": steps, "sleep": sleep, "applied_s": applied,
            "kueue_start_s": kueue_start, "most_live_pods": most_live, **timing}


def _timing(bed: TestBed, namespace: str, admissions: dict[str, datetime]) -> dict[str, Any]:
    """Latencies from the API objects' own timestamps (to the second): each run's creation, its Workload's first
    admission (``admissions``, by Workload name), its first pod's creation, and the last pod's end. Polling at
    this load would be coarser than that."""
    created: dict[str, datetime] = {}
    workloads: dict[str, str] = {}
    for body in kube_items(bed, "dr", namespace):
        meta = body["metadata"]
        created[meta["name"]] = api_time(meta["creationTimestamp"])
        workloads[operator_kueue.workload_name(meta["name"], meta["uid"])] = meta["name"]
    pods: dict[str, datetime] = {}
    ended = []
    for pod in kube_items(bed, "pods", namespace):
        owner = str((pod["metadata"].get("labels") or {}).get(api.LABEL_RUN))
        if owner in created:
            at = api_time(pod["metadata"]["creationTimestamp"])
            pods[owner] = min(pods.get(owner, at), at)
            for container in (pod.get("status") or {}).get("containerStatuses") or []:
                if finished := ((container.get("state") or {}).get("terminated") or {}).get("finishedAt"):
                    ended.append(api_time(finished))
    admitted = {workloads[name]: at for name, at in admissions.items() if name in workloads}
    first = min(created.values())

    def seconds(later: dict[str, datetime], earlier: dict[str, datetime]) -> list[float]:
        return [(later[n] - earlier[n]).total_seconds() for n in later if n in earlier]

    return {"create_to_admitted": latencies(seconds(admitted, created)),
            "create_to_pod": latencies(seconds(pods, created)),
            "admitted_to_pod": latencies(seconds(pods, admitted)),
            "makespan_s": (max(ended) - first).total_seconds() if ended else math.nan,
            "missed_admissions": len(created) - len(admitted)}


def section(k: dict[str, Any], load: str | None = None) -> list[str]:
    """The report's section (report.render)."""

    def row(name: str, p: dict[str, float]) -> str:
        return f"| {name} | {p['p50']:.1f} s | {p['p90']:.1f} s | {p['p99']:.1f} s | {p['max']:.1f} s |"

    ideal = k["runs"] / k["quota"] * k["steps"] * k["sleep"]
    verdict = "never more" if k["most_live_pods"] <= k["quota"] else "**MORE**"
    return [
        "## Admission through Kueue",
        "",
        f"{k['runs']} DurableRuns of {k['steps']} steps of {k['sleep']} s applied at once (the apply took "
        f"{k['applied_s']:.1f} s) in a LocalQueue whose ClusterQueue has quota for {k['quota']} runners (1 CPU "
        f"each), on the test bed with a real Kueue manager (it started in {k['kueue_start_s']:.0f} s) and the "
        "operator; latencies from the objects' timestamps (to the second: the run's creation, its Workload's "
        "Admitted condition as a watch saw it, its pod's creation), live pods polled"
        + (f"; load average (1/5/15 min) {load} before the section" if load else "") + ".",
        "",
        "| from the run's creation | p50 | p90 | p99 | max |",
        "|---|---|---|---|---|",
        row("to its Workload admitted", k["create_to_admitted"]),
        row("to its pod", k["create_to_pod"]),
        row("admitted to pod (the operator's part)", k["admitted_to_pod"]),
        "",
        f"At most **{k['most_live_pods']}** runner pods were alive at once: {verdict} than the quota's "
        f"{k['quota']}. The last runner ended {k['makespan_s']:.0f} s after the first run was created; the steps "
        f"alone, "
        f"{k['quota']} at a time, take {ideal:.0f} s, so the rest is pods starting and admission handing quota on"
        + (f" ({k['missed_admissions']} runs had no admission seen)" if k["missed_admissions"] else "")
        + ".",
        "",
    ]


def main(argv: list[str] | None = None) -> int:
    from durablerun_bench.__main__ import testbed

    parser = argparse.ArgumentParser(prog="python -m durablerun_bench.kueue", description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=20 if quick() else 100)
    parser.add_argument("--quota", type=int, default=4 if quick() else 10)
    args = parser.parse_args(argv)
    with alone("kueue", s3=True) as run:
        assert run.s3
        with testbed(run.root, run.run_id, run.s3) as bed:
            result = bench(bed, run.root, run.run_id, runs=args.runs, quota=args.quota, steps=5, sleep=0.5,
                           log=lambda m: print(m, file=sys.stderr))
        run.report(section(result, str(run.load)), result)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
