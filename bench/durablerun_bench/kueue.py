"""Admission through Kueue at scale: N DurableRuns created at once in a LocalQueue whose ClusterQueue has quota
for M runners, on the test bed with a real Kueue manager (hack/durablerun_testbed/kueue.py) and the operator.

Each runner asks for 1 CPU and the ClusterQueue has M CPUs, so Kueue admits M at a time and each finished run
gives its quota to the next. Every time is when one watch (of the runs, their pods and their Workloads) saw a
change, not the objects' own timestamps, which are to the second; nor Kueue's ``Admitted`` Events, which its
event broadcaster drops without a word when many Workloads wait. A slot's turn is broken down: the pod starting
(created → the runner holds its lease), the runner's steps (→ its outcome in status), its exit (→ the pod
Succeeded), the operator ending the run (→ Succeeded) and releasing the quota
(→ the Workload deleted), Kueue handing it on (→ the next Workload admitted) and the operator starting that one
(→ its pod created). The most runner pods alive (Pending or Running) at once, which must never exceed M, is
replayed from the same watch.

``python -m durablerun_bench.kueue`` runs this section alone and prints its RESULTS.md section.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
import uuid
from pathlib import Path
from typing import Any

from durablerun import api
from durablerun_bench import resume
from durablerun_bench.alone import alone
from durablerun_bench.util import latencies, quick
from durablerun_operator import kueue as operator_kueue
from durablerun_testbed import procs
from durablerun_testbed.kueue import Kueue
from durablerun_testbed.testbed import TestBed

GROUP = f"{operator_kueue.GROUP}/{operator_kueue.VERSION}"
POLL = 0.25


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
            watcher = resume.Watcher(bed, namespace, _reduce, kinds=("dr", "pod", "workload")).start()
            try:
                began = time.monotonic()
                bed.kubectl("apply", "-f", "-", input="\n---\n".join(json.dumps(m) for m in manifests), timeout=300)
                applied = time.monotonic() - began
                deadline = began + 300 + runs * (steps * sleep + 10) / quota
                procs.wait_for(lambda: len(_firsts(watcher, "dr", lambda r: r["phase"] == api.Phase.SUCCEEDED))
                               == runs, timeout=deadline - time.monotonic(), interval=POLL,
                               what=f"{runs} runs succeeded")
                # Every Workload is deleted when its run ends: the last ones' deletions reach the watch.
                procs.wait_for(lambda: _workloads_left(watcher) == 0, timeout=60, interval=POLL,
                               what="every Workload deleted")
            finally:
                watcher.stop()
        kueue.check_alive()
        timing = _timing(watcher, quota)
    finally:
        kueue.stop()
    return {"runs": runs, "quota": quota, "steps": steps, "sleep": sleep, "applied_s": applied,
            "kueue_start_s": kueue_start, **timing}


def _reduce(kind: str, obj: dict[str, Any]) -> dict[str, Any]:
    meta, status = obj["metadata"], obj.get("status") or {}
    run = (meta.get("labels") or {}).get(api.LABEL_RUN)
    if kind == "dr":
        return {"name": meta["name"], "phase": status.get("phase"), "outcome": status.get("outcome"),
                "holder": (status.get("lease") or {}).get("holder")}
    if kind == "pod":
        return {"name": meta["name"], "run": run, "phase": status.get("phase")}
    conditions = {c.get("type"): c.get("status") for c in status.get("conditions") or []}
    return {"name": meta["name"], "run": run, "admitted": conditions.get("Admitted") == "True"}


def _firsts(watcher: resume.Watcher, kind: str, predicate: Any, types: tuple[str, ...] = ("ADDED", "MODIFIED"),
            key: str = "name") -> dict[str, float]:
    """When the watch first saw each object (by ``key``) of ``kind`` in one of ``types`` with ``predicate`` true."""
    events = watcher.snapshot()
    seen: dict[str, float] = {}
    for when, k, type_, obj in events:
        if k == kind and type_ in types and obj.get(key) and obj[key] not in seen and predicate(obj):
            seen[obj[key]] = when
    return seen


def _workloads_left(watcher: resume.Watcher) -> int:
    return len(_firsts(watcher, "workload", lambda w: True)) - len(
        _firsts(watcher, "workload", lambda w: True, types=("DELETED",)))


def _most_live(watcher: resume.Watcher) -> int:
    """The most runner pods Pending or Running at once, replaying the watch's pod events in order."""
    events = [(type_, obj) for _, kind, type_, obj in watcher.snapshot() if kind == "pod"]
    live: set[str] = set()
    most = 0
    for type_, pod in events:
        if type_ != "DELETED" and pod["phase"] in ("Pending", "Running"):  # literal-ok: the pods' phases
            live.add(pod["name"])
        else:
            live.discard(pod["name"])
        most = max(most, len(live))
    return most


def _timing(watcher: resume.Watcher, quota: int) -> dict[str, Any]:
    """The admission cycle, from the moments one watch saw each change (not the objects' timestamps, which are
    to the second): run created → Workload admitted → pod created → lease held (the runner started) → run
    Succeeded → Workload deleted (its quota released) → the next Workload admitted."""
    created = _firsts(watcher, "dr", lambda r: True)
    lease = _firsts(watcher, "dr", lambda r: bool(r["holder"]))
    outcome = _firsts(watcher, "dr", lambda r: bool(r["outcome"]))
    exited = _firsts(watcher, "pod", lambda p: p["phase"] == "Succeeded", key="run")  # literal-ok: a pod's phase
    succeeded = _firsts(watcher, "dr", lambda r: r["phase"] == api.Phase.SUCCEEDED)
    admitted = _firsts(watcher, "workload", lambda w: w["admitted"], key="run")
    released = _firsts(watcher, "workload", lambda w: True, types=("DELETED",), key="run")
    pods = _firsts(watcher, "pod", lambda p: True, key="run")

    def seconds(later: dict[str, float], earlier: dict[str, float]) -> list[float]:
        return [later[n] - earlier[n] for n in later if n in earlier]

    # Each admission after the first ``quota`` waits for a release: the k-th of them for the k-th release at the
    # latest, so the gap between them is how long Kueue took to hand that quota on.
    handed_on = [a - r for a, r in zip(sorted(admitted.values())[quota:], sorted(released.values()), strict=False)]
    return {"create_to_admitted": latencies(seconds(admitted, created)),
            "create_to_pod": latencies(seconds(pods, created)),
            "cycle": {"pod_to_lease": latencies(seconds(lease, pods)),
                      "lease_to_outcome": latencies(seconds(outcome, lease)),
                      "outcome_to_exited": latencies(seconds(exited, outcome)),
                      "exited_to_succeeded": latencies(seconds(succeeded, exited)),
                      "succeeded_to_released": latencies(seconds(released, succeeded)),
                      "released_to_next_admitted": latencies(handed_on),
                      "admitted_to_pod": latencies(seconds(pods, admitted))},
            "makespan_s": max(succeeded.values()) - min(created.values()),
            "most_live_pods": _most_live(watcher),
            "missed_admissions": len(created) - len(admitted)}


def target(k: dict[str, Any]) -> float:
    """Issue 42's bound on the whole: twice the steps' own time, ``quota`` at a time, plus one pod start (pod
    created → lease held, its median) for each turn of a slot."""
    turns = k["runs"] / k["quota"]
    return float(2 * turns * k["steps"] * k["sleep"] + turns * k["cycle"]["pod_to_lease"]["p50"])


def section(k: dict[str, Any], load: str | None = None) -> list[str]:
    """The report's section (report.render)."""

    def row(name: str, p: dict[str, float]) -> str:
        return f"| {name} | {p['p50']:.2f} s | {p['p90']:.2f} s | {p['p99']:.2f} s | {p['max']:.2f} s |"

    ideal = k["runs"] / k["quota"] * k["steps"] * k["sleep"]
    verdict = "never more" if k["most_live_pods"] <= k["quota"] else "**MORE**"
    cycle, bound = k["cycle"], target(k)
    turn = sum(cycle[stage]["p50"] for stage in cycle)
    return [
        "## Admission through Kueue",
        "",
        f"{k['runs']} DurableRuns of {k['steps']} steps of {k['sleep']} s applied at once (the apply took "
        f"{k['applied_s']:.1f} s) in a LocalQueue whose ClusterQueue has quota for {k['quota']} runners (1 CPU "
        f"each), on the test bed with a real Kueue manager (it started in {k['kueue_start_s']:.0f} s) and the "
        "operator. Times are when one watch of the runs, their pods and their Workloads saw each change"
        + (f"; load average (1/5/15 min) {load} before the section" if load else "") + ".",
        "",
        "| from the run's creation | p50 | p90 | p99 | max |",
        "|---|---|---|---|---|",
        row("to its Workload admitted", k["create_to_admitted"]),
        row("to its pod", k["create_to_pod"]),
        "",
        "A slot's turn, stage by stage (whose part it is in brackets):",
        "",
        "| stage | p50 | p90 | p99 | max |",
        "|---|---|---|---|---|",
        row("pod created → lease held (the pod starting: node, process, imports)", cycle["pod_to_lease"]),
        row(f"lease held → its outcome in status (the runner: {k['steps']} steps of {k['sleep']} s, journaled)",
            cycle["lease_to_outcome"]),
        row("outcome written → pod Succeeded (the runner exiting, the node reporting it)", cycle["outcome_to_exited"]),
        row("pod Succeeded → run Succeeded (the operator)", cycle["exited_to_succeeded"]),
        row("run Succeeded → its Workload deleted (the operator)", cycle["succeeded_to_released"]),
        row("Workload deleted → the next one admitted (Kueue)", cycle["released_to_next_admitted"]),
        row("admitted → pod created (the operator)", cycle["admitted_to_pod"]),
        f"| **a turn, the medians summed** | {turn:.2f} s | | | |",
        "",
        f"At most **{k['most_live_pods']}** runner pods were alive at once: {verdict} than the quota's "
        f"{k['quota']}. The last run succeeded **{k['makespan_s']:.1f} s** after the first was created; the steps "
        f"alone, {k['quota']} at a time, take {ideal:.0f} s. Target: under twice that plus one pod start per "
        f"slot turn, {bound:.1f} s: **{'met' if k['makespan_s'] <= bound else 'missed'}**"
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
