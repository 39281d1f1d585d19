"""Operator scale: N DurableRuns on the real API server, leases renewed by a stand-in for N runners.

The process node is stopped for this section: runner pods stay unscheduled
(no runner processes), and ``renewer`` does for every attempt what a runner's
lease thread does. The operator runs as shipped (``python -m durablerun_operator``
with its default settings: resync every 5 s). Measured:

* ramp-up: creating N runs until every one is Running with its lease held;
* steady state (leases renewed, some of them stopping): the operator's CPU
  (utime + stime from /proc) and memory (VmRSS, VmHWM), API requests per
  second (kube-apiserver's ``apiserver_request_total``, all clients, and the
  stand-in's own renewals);
* lease-expiry detection: ``stopped`` runs stop renewing at staggered known
  times; the delay from the last renewal sent to the moment a watch sees the
  operator's restart (``status.restarts`` 1, epoch bumped), against the target
  ``leaseDuration + 5 s``;
* missed restarts (a stopped run not restarted) and duplicated ones (restarts
  > 1, a third attempt, or a restart of a run that kept renewing): must be 0.
"""

from __future__ import annotations

import json
import os
import re
import statistics
import sys
import threading
import time
import uuid
from collections import defaultdict
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from durablerun import api
from durablerun_bench import resume
from durablerun_bench.util import percentile
from durablerun_testbed import procs
from durablerun_testbed.testbed import TestBed

CLK_TCK = os.sysconf("SC_CLK_TCK")


def proc_cpu_seconds(pid: int) -> float:
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / CLK_TCK  # utime + stime (fields 14, 15)


def proc_memory_mb(pid: int) -> dict[str, float]:
    out = {}
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith(("VmRSS:", "VmHWM:")):
                out[line.split(":")[0]] = int(line.split()[1]) / 1024
    return out


def apiserver_requests(bed: TestBed) -> dict[tuple[str, str], float]:
    """apiserver_request_total summed by (verb, resource)."""
    api = bed.api_client()
    method, url, headers, body, post = api.param_serialize("GET", "/metrics", auth_settings=["BearerToken"])
    reply = api.call_api(method, url, headers, body, post)
    text = reply.read().decode()
    totals: dict[tuple[str, str], float] = defaultdict(float)
    pattern = re.compile(r"^apiserver_request_total\{(.*)\} ([0-9.e+]+)$")
    for line in text.splitlines():
        match = pattern.match(line)
        if match:
            labels = dict(re.findall(r'(\w+)="([^"]*)"', match.group(1)))
            sub = f"/{labels['subresource']}" if labels.get("subresource") else ""
            totals[(labels.get("verb", "?"), labels.get("resource", "?") + sub)] += float(match.group(2))
    return dict(totals)


def _reduce(kind: str, obj: dict[str, Any]) -> dict[str, Any]:
    status = obj.get("status") or {}
    if kind == "dr":
        return {"name": obj["metadata"]["name"], "epoch": status.get("epoch"), "restarts": status.get("restarts"),
                "phase": status.get("phase"), "holder": (status.get("lease") or {}).get("holder")}
    return {"name": obj["metadata"]["name"], "run": (obj["metadata"].get("labels") or {}).get(api.LABEL_RUN)}


def _run_manifest(namespace: str, name: str, lease_seconds: int) -> dict[str, Any]:
    return {
        "apiVersion": api.API_VERSION, "kind": "DurableRun",
        "metadata": {"name": name, "namespace": namespace},
        "spec": {
            "workflow": "durablerun_bench.dr_flows:steps",
            "input": {"n": 1},
            "checkpoint": {"uri": "s3://bench/scale"},
            "policy": {"leaseDuration": f"{lease_seconds}s", "backoff": {"initial": "0s", "max": "1s"}},
            "template": {"spec": {"containers": [{"name": "runner"}]}},
        },
    }


def _create_runs(bed: TestBed, namespace: str, names: list[str], lease_seconds: int) -> None:
    from kubernetes import client

    local = threading.local()

    def create(name: str) -> None:
        if not hasattr(local, "api"):
            local.api = client.CustomObjectsApi(bed.api_client())
        local.api.create_namespaced_custom_object(api.GROUP, api.VERSION, namespace, api.PLURAL,
                                                  _run_manifest(namespace, name, lease_seconds))

    with ThreadPoolExecutor(max_workers=8) as pool:
        list(pool.map(create, names))


def _summary(values: list[float]) -> dict[str, float]:
    return {"p50": percentile(values, 50), "p99": percentile(values, 99), "max": max(values) if values else 0.0,
            "n": len(values)}


def bench(bed: TestBed, root: Path, run_id: str, *, runs: int, lease_seconds: int, stopped: int,
          log: Any = print) -> dict[str, Any]:
    namespace = f"bench-scale-{uuid.uuid4().hex[:4]}"
    resume.prepare_namespace(bed, namespace)
    names = [f"run-{i:05d}" for i in range(runs)]
    watcher = resume.Watcher(bed, namespace, _reduce).start()
    plan_path, renew_log = root / f"{namespace}-plan.json", root / f"{namespace}-renewals.jsonl"
    out: dict[str, Any] = {"runs": runs, "lease_seconds": lease_seconds, "stopped": stopped}
    with resume.operator(bed, namespace, root, run_id) as op:
        cpu0, t0 = proc_cpu_seconds(op.pid), time.time()
        _create_runs(bed, namespace, names, lease_seconds)
        created = time.time()
        log(f"  created {runs} DurableRuns in {created - t0:.1f}s")
        plan: dict[str, Any] = {"namespace": namespace, "lease_seconds": lease_seconds, "stop": {}}
        plan_path.write_text(json.dumps(plan))
        renewer = procs.ManagedProcess("renewer", [sys.executable, "-m", "durablerun_bench.renewer", str(plan_path),
                                                   str(renew_log)],
                                       log_path=root / f"{namespace}-renewer.log", env=bed.env(), testbed_id=run_id)
        try:
            def all_held() -> bool:
                return _count(renew_log, "acquired") >= runs

            procs.wait_for(all_held, timeout=max(300, runs), interval=1.0,
                           what=f"all {runs} runs Running with their leases held")
        except procs.Timeout:
            log(f"  only {_count(renew_log, 'acquired')} of {runs} leases held after the ramp-up timeout")
        ramp = time.time()
        cpu1 = proc_cpu_seconds(op.pid)
        out["ramp_up_s"] = ramp - t0
        out["ramp_cpu_cores"] = (cpu1 - cpu0) / (ramp - t0)
        out["held_after_ramp"] = _count(renew_log, "acquired")
        log(f"  ramp-up: {out['held_after_ramp']} runs Running with leases held after {ramp - t0:.1f}s "
            f"(operator {out['ramp_cpu_cores']:.2f} cores)")
        # The stand-in reads its plan once: restart it with the stops (it re-acquires every lease it sees).
        renewer.stop()
        victims = names[:: max(1, runs // stopped)][:stopped]
        first_stop = time.time() + 5
        # Spread over several resync periods (5 s), so detection is seen at every phase of the loop.
        plan["stop"] = {name: first_stop + i * (lease_seconds / 3) / stopped for i, name in enumerate(victims)}
        plan_path.write_text(json.dumps(plan))
        renewer = procs.ManagedProcess("renewer", [sys.executable, "-m", "durablerun_bench.renewer", str(plan_path),
                                                   str(renew_log)],
                                       log_path=root / f"{namespace}-renewer.log", env=bed.env(), testbed_id=run_id)
        api0, cpu_s0, w0 = apiserver_requests(bed), proc_cpu_seconds(op.pid), time.time()
        rss: list[float] = []
        deadline = max(plan["stop"].values()) + 2 * lease_seconds + 30
        while time.time() < deadline:
            rss.append(proc_memory_mb(op.pid)["VmRSS"])
            if _restarted(watcher, victims) >= len(victims) and time.time() > max(plan["stop"].values()) \
                    + lease_seconds + 15:
                break
            time.sleep(2)
        api1, cpu_s1, w1 = apiserver_requests(bed), proc_cpu_seconds(op.pid), time.time()
        memory = proc_memory_mb(op.pid)
        time.sleep(5)  # let the renewer acquire the restarted attempts
        renewer.stop()
    watcher.stop()
    window = w1 - w0
    requests = {f"{verb} {res}": (api1.get((verb, res), 0) - api0.get((verb, res), 0)) / window
                for verb, res in set(api0) | set(api1)}
    requests = {k: v for k, v in sorted(requests.items(), key=lambda kv: -kv[1]) if v > 0.05}
    renewals = _events(renew_log)
    counts: dict[str, Any] = next((e for e in reversed(renewals) if e["event"] == "counts"), {})
    out.update(
        window_s=window,
        cpu_cores=(cpu_s1 - cpu_s0) / window,
        rss_mb_max=max(rss) if rss else memory["VmRSS"],
        rss_mb_end=memory["VmRSS"], hwm_mb=memory["VmHWM"],
        api_requests_per_s=sum(requests.values()),
        api_requests_by_kind=requests,
        renewer=counts,
    )
    out.update(_restart_checks(watcher, names, victims, renewals, lease_seconds))
    delay = out["detection_delay"]
    log(f"  operator {out['cpu_cores']:.2f} cores, RSS max {out['rss_mb_max']:.0f} MB; "
        f"API {out['api_requests_per_s']:.0f} req/s; detection p50 {delay['p50']:.1f}s p99 {delay['p99']:.1f}s "
        f"after expiry; missed {out['missed_restarts']}, duplicated {out['duplicated_restarts']}")
    return out


def _events(path: Path) -> list[dict[str, Any]]:
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def _count(path: Path, event: str) -> int:
    return len({e["name"] for e in _events(path) if e.get("event") == event})


def _restarted(watcher: resume.Watcher, victims: list[str]) -> int:
    with watcher.lock:
        events = list(watcher.events)
    seen = {obj["name"] for _, kind, _, obj in events if kind == "dr" and (obj.get("restarts") or 0) >= 1}
    return len(seen & set(victims))


def _restart_checks(watcher: resume.Watcher, names: list[str], victims: list[str],
                    renewals: list[dict[str, Any]], lease_seconds: int) -> dict[str, Any]:
    with watcher.lock:
        events = list(watcher.events)
    last_sent = {e["name"]: e["last_renewal_sent"] for e in renewals if e.get("event") == "stopped"}
    detected: dict[str, float] = {}
    restarts: dict[str, int] = defaultdict(int)
    epochs: dict[str, int] = defaultdict(int)
    pods: dict[str, set[str]] = defaultdict(set)
    for when, kind, _type, obj in events:
        if kind == "dr":
            restarts[obj["name"]] = max(restarts[obj["name"]], obj.get("restarts") or 0)
            epochs[obj["name"]] = max(epochs[obj["name"]], obj.get("epoch") or 0)
            if (obj.get("restarts") or 0) >= 1 and obj["name"] not in detected:
                detected[obj["name"]] = when
        elif obj.get("run"):
            pods[obj["run"]].add(obj["name"])
    delays = [detected[n] - (last_sent[n] + lease_seconds) for n in victims if n in detected and n in last_sent]
    since_renewal = [detected[n] - last_sent[n] for n in victims if n in detected and n in last_sent]
    victim_set = set(victims)
    lapses: dict[str, int] = defaultdict(int)  # the stand-in itself failed to renew in time
    for e in renewals:
        if e.get("event") == "lapsed":
            lapses[e["name"]] += 1
    missed = [n for n in victims if n not in detected]
    allowed = {n: (1 if n in victim_set else 0) + lapses[n] for n in names}
    duplicated = [n for n in names if restarts[n] > allowed[n] or len(pods[n]) > 1 + allowed[n]]
    return {
        "detection_delay": _summary(delays),
        "since_last_renewal": _summary(since_renewal),
        "detection_target_s": lease_seconds + 5,
        "missed_restarts": len(missed), "missed": missed[:20],
        "standin_lapses": sum(lapses.values()), "lapsed_runs_restarted": sum(
            1 for n in names if n not in victim_set and lapses[n] and restarts[n]),
        "duplicated_restarts": len(duplicated), "duplicated": duplicated[:20],
        "max_epoch": max(epochs.values()) if epochs else 0,
        "stops_logged": len(last_sent),
        "mean_delay": statistics.fmean(delays) if delays else None,
    }
