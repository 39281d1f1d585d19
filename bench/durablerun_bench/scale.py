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
  > 1, a third attempt, or a restart of a run that kept renewing): must be 0;
* the control plane: kube-apiserver's and etcd's CPU seconds, etcd's database
  size, the mean and max DurableRun object size.

The stand-ins are as many processes as it takes to keep up (a shard label
splits the runs between them, one per ``RUNS_PER_STANDIN``); each reports how
late its renewals were sent. ``waiting`` measures runs that wait: N runs, each
taken to Waiting by a stand-in that ends its first attempt as a runner reaching
``ctx.wait_for_event`` does; then the operator idle with them, and the time from
an event patch to the next attempt's pod for a sample of them.
"""

from __future__ import annotations

import contextlib
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
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from durablerun import api
from durablerun_bench import resume
from durablerun_bench.renewer import SHARD_LABEL
from durablerun_bench.util import percentile
from durablerun_testbed import procs
from durablerun_testbed.testbed import TestBed

CLK_TCK = os.sysconf("SC_CLK_TCK")
#: The operator's API client for a fleet (the chart's kubeClient.qps and .burst): the shipped 50/s paces a wave
#: of starts at a handful of calls a run, so 10,000 runs would take over half an hour to start, and an operator
#: starting with 100,000 waiting runs (two reads a run) over an hour. docs/operator.md, "Sizing".
FLEET_CLIENT = {api.OperatorEnv.KUBE_QPS: "500", api.OperatorEnv.KUBE_BURST: "1000"}
#: One stand-in process per this many runs (a Python process renews ~150 leases/s on this machine).
RUNS_PER_STANDIN = 2500


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


#: The request kinds whose kube-apiserver latency a window reports: a renewal, the operator's reads and a start.
LATENCY_KINDS = ("PATCH durableruns/status", "GET durableruns", "LIST pods", "POST pods")


def apiserver_metrics(bed: TestBed) -> tuple[dict[tuple[str, str], float], dict[tuple[str, str], dict[float, float]]]:
    """kube-apiserver's own counters, summed by (verb, resource): ``apiserver_request_total``, and the
    cumulative buckets of ``apiserver_request_duration_seconds`` (upper bound -> count)."""
    api = bed.api_client()
    method, url, headers, body, post = api.param_serialize("GET", "/metrics", auth_settings=["BearerToken"])
    reply = api.call_api(method, url, headers, body, post)
    text = reply.read().decode()
    totals: dict[tuple[str, str], float] = defaultdict(float)
    buckets: dict[tuple[str, str], dict[float, float]] = defaultdict(lambda: defaultdict(float))
    pattern = re.compile(r"^apiserver_request_(total|duration_seconds_bucket)\{(.*)\} ([0-9.e+]+)$")
    for line in text.splitlines():
        match = pattern.match(line)
        if match:
            labels = dict(re.findall(r'(\w+)="([^"]*)"', match.group(2)))
            sub = f"/{labels['subresource']}" if labels.get("subresource") else ""
            kind = (labels.get("verb", "?"), labels.get("resource", "?") + sub)
            if match.group(1) == "total":
                totals[kind] += float(match.group(3))
            else:
                buckets[kind][float(labels["le"])] += float(match.group(3))
    return dict(totals), {k: dict(v) for k, v in buckets.items()}


def apiserver_requests(bed: TestBed) -> dict[tuple[str, str], float]:
    """apiserver_request_total summed by (verb, resource)."""
    return apiserver_metrics(bed)[0]


def histogram_quantile(q: float, before: dict[float, float], after: dict[float, float]) -> float:
    """The ``q`` quantile (0..1) of the observations between two reads of one histogram's cumulative buckets,
    interpolated within its bucket as Prometheus's histogram_quantile does; nan when there were none."""
    bounds = sorted(after)
    counts = [after[b] - before.get(b, 0.0) for b in bounds]
    if not counts or counts[-1] <= 0:
        return float("nan")
    rank = q * counts[-1]
    for i, (bound, count) in enumerate(zip(bounds, counts, strict=True)):
        if count >= rank:
            if bound == float("inf"):
                return bounds[i - 1] if i else float("nan")
            lower, below = (bounds[i - 1], counts[i - 1]) if i else (0.0, 0.0)
            return lower + (bound - lower) * ((rank - below) / (count - below) if count > below else 1.0)
    return float("nan")


def machine_busy() -> tuple[float, float]:
    """The machine's busy and total CPU seconds since boot, every core (/proc/stat)."""
    with open("/proc/stat") as f:
        fields = [int(x) for x in f.readline().split()[1:]]
    idle = fields[3] + fields[4]  # idle, iowait
    return (sum(fields[:8]) - idle) / CLK_TCK, sum(fields[:8]) / CLK_TCK


def per_run(before: dict[tuple[str, str], float], after: dict[tuple[str, str], float],
            runs: int) -> dict[str, float]:
    """The API requests between two reads of ``apiserver_request_total``, by verb and resource, per run (those
    of at least 0.05 per run, most first): all clients, the stand-ins' lease writes and the bench's creates too."""
    per = {f"{verb} {res}": (after.get((verb, res), 0) - before.get((verb, res), 0)) / runs
           for verb, res in set(before) | set(after)}
    return {k: v for k, v in sorted(per.items(), key=lambda kv: -kv[1]) if v >= 0.05}


def _reduce(kind: str, obj: dict[str, Any]) -> dict[str, Any]:
    status = obj.get("status") or {}
    if kind == "dr":
        # nextAttemptTime: when the operator decided a restart (its backoff here is 0 s), to the second.
        return {"name": obj["metadata"]["name"], "epoch": status.get("epoch"), "restarts": status.get("restarts"),
                "phase": status.get("phase"), "holder": (status.get("lease") or {}).get("holder"),
                "decided": status.get("nextAttemptTime")}
    labels = obj["metadata"].get("labels") or {}
    return {"name": obj["metadata"]["name"], "run": labels.get(api.LABEL_RUN), "epoch": labels.get(api.LABEL_EPOCH),
            "created": obj["metadata"].get("creationTimestamp")}


def _stamp(value: Any) -> float | None:
    """A time the API server or the operator wrote (to the second), as a Unix time."""
    moment = api.parse_time(value) if isinstance(value, str) else None
    return moment.timestamp() if moment else None


def _run_manifest(namespace: str, name: str, lease_seconds: int, shard: str = "0") -> dict[str, Any]:
    return {
        "apiVersion": api.API_VERSION, "kind": api.KIND,
        "metadata": {"name": name, "namespace": namespace, "labels": {SHARD_LABEL: shard}},
        "spec": {
            "workflow": "durablerun_bench.dr_flows:steps",
            "input": {"n": 1},
            "checkpoint": {"uri": "s3://bench/scale"},
            # The stand-ins run no steps: no progressTimeout may abort a run before the measurement ends.
            "policy": {"leaseDuration": f"{lease_seconds}s", "backoff": {"initial": "0s", "max": "1s"},
                       "progressTimeout": "24h"},
            "template": {"spec": {"containers": [{"name": "runner"}]}},
        },
    }


def create_runs(bed: TestBed, namespace: str, names: list[str], lease_seconds: int, shards: int,
                prefix: str = "") -> None:
    """Create ``names``, dealt round-robin to the shards ``<prefix>0`` to ``<prefix><shards - 1>``."""
    from kubernetes import client

    local = threading.local()

    def create(item: tuple[int, str]) -> None:
        if not hasattr(local, "api"):
            local.api = client.CustomObjectsApi(bed.api_client())
        i, name = item
        body = _run_manifest(namespace, name, lease_seconds, f"{prefix}{i % shards}")
        local.api.create_namespaced_custom_object(api.GROUP, api.VERSION, namespace, api.PLURAL, body)

    with ThreadPoolExecutor(max_workers=8) as pool:
        list(pool.map(create, enumerate(names)))


def _summary(values: list[float]) -> dict[str, float]:
    return {"p50": percentile(values, 50), "p99": percentile(values, 99), "max": max(values) if values else 0.0,
            "n": len(values)}


class StandIns:
    """The stand-in runners: one process per shard of the runs (shards ``<prefix>0`` on), all logging to one
    file."""

    def __init__(self, bed: TestBed, root: Path, run_id: str, namespace: str, shards: int, prefix: str = "") -> None:
        self.bed, self.root, self.run_id, self.namespace, self.shards = bed, root, run_id, namespace, shards
        self.prefix = prefix
        self.log = root / f"{namespace}-{prefix}renewals.jsonl"
        self.processes: list[procs.ManagedProcess] = []

    def start(self, plan: dict[str, Any]) -> None:
        for shard in (f"{self.prefix}{i}" for i in range(self.shards)):
            path = self.root / f"{self.namespace}-plan-{shard}.json"
            path.write_text(json.dumps({**plan, "shard": shard}))
            self.processes.append(procs.ManagedProcess(
                f"renewer-{shard}", [sys.executable, "-m", "durablerun_bench.renewer", str(path), str(self.log)],
                log_path=self.root / f"{self.namespace}-renewer-{shard}.log", env=self.bed.env(),
                testbed_id=self.run_id))

    def stop(self) -> None:
        for process in self.processes:
            process.stop()
        self.processes = []

    def cpu_seconds(self) -> float:
        """The stand-ins' CPU seconds so far (those running now)."""
        return sum(proc_cpu_seconds(p.pid) for p in self.processes)


def control_plane(bed: TestBed) -> dict[str, float]:
    """kube-apiserver's and etcd's CPU seconds so far, and etcd's database size."""
    import urllib.request

    cp = bed.controlplane
    assert cp
    assert cp.apiserver
    assert cp.etcd
    with urllib.request.urlopen(f"{cp.etcd_url}/metrics", timeout=10) as reply:
        text = reply.read().decode()
    sizes = dict(re.findall(r"^(etcd_mvcc_db_total_size_in(?:_use_in)?_bytes) ([0-9.e+]+)$", text, re.M))
    return {"apiserver_cpu_s": proc_cpu_seconds(cp.apiserver.pid), "etcd_cpu_s": proc_cpu_seconds(cp.etcd.pid),
            "etcd_db_bytes": float(sizes.get("etcd_mvcc_db_total_size_in_bytes", "nan")),
            "etcd_db_in_use_bytes": float(sizes.get("etcd_mvcc_db_total_size_in_use_in_bytes", "nan"))}


def object_sizes(bed: TestBed, namespace: str) -> dict[str, float]:
    """Mean and max size of the DurableRuns of ``namespace`` as stored (their JSON, managedFields included)."""
    from kubernetes import client

    reply = client.CustomObjectsApi(bed.api_client()).list_namespaced_custom_object(
        api.GROUP, api.VERSION, namespace, api.PLURAL)
    sizes = [len(json.dumps(item, separators=(",", ":"))) for item in reply["items"]]
    return {"mean_bytes": statistics.fmean(sizes) if sizes else 0.0, "max_bytes": max(sizes, default=0)}


RAMP_LIMIT_S = 1800


@dataclass(frozen=True)
class Mark:
    """The counters a measured window starts or ends with."""

    at: float
    requests: dict[tuple[str, str], float]
    latency: dict[tuple[str, str], dict[float, float]]
    operator_cpu_s: float
    standins_cpu_s: float
    control_plane: dict[str, float]
    machine: tuple[float, float]


def _mark(bed: TestBed, op: procs.ManagedProcess, standins: StandIns | None = None) -> Mark:
    requests, latency = apiserver_metrics(bed)
    return Mark(time.time(), requests, latency, proc_cpu_seconds(op.pid),
                standins.cpu_seconds() if standins else 0.0, control_plane(bed), machine_busy())


def _window(bed: TestBed, op: procs.ManagedProcess, start: Mark, rss: list[float],
            standins: StandIns | None = None) -> dict[str, Any]:
    """Rates over a window opened by ``_mark``: operator CPU and memory, API requests and kube-apiserver's
    latency for them, control-plane CPU, the stand-ins' CPU and the whole machine's."""
    end = _mark(bed, op, standins)
    window = end.at - start.at
    requests = {f"{verb} {res}": (end.requests.get((verb, res), 0) - start.requests.get((verb, res), 0)) / window
                for verb, res in set(start.requests) | set(end.requests)}
    requests = {k: v for k, v in sorted(requests.items(), key=lambda kv: -kv[1]) if v > 0.05}
    latency = {}
    for kind in LATENCY_KINDS:
        key = tuple(kind.split(" ", 1))
        if key in end.latency:
            latency[kind] = {f"p{int(q * 100)}": histogram_quantile(q, start.latency.get(key, {}), end.latency[key])
                             for q in (0.5, 0.99)}
    memory = proc_memory_mb(op.pid)
    cp0, cp1 = start.control_plane, end.control_plane
    busy = end.machine[0] - start.machine[0]
    return {
        "window_s": window, "cpu_cores": (end.operator_cpu_s - start.operator_cpu_s) / window,
        "rss_mb_max": max(rss) if rss else memory["VmRSS"], "rss_mb_end": memory["VmRSS"], "hwm_mb": memory["VmHWM"],
        "api_requests_per_s": sum(requests.values()), "api_requests_by_kind": requests, "api_latency": latency,
        "apiserver_cores": (cp1["apiserver_cpu_s"] - cp0["apiserver_cpu_s"]) / window,
        "etcd_cores": (cp1["etcd_cpu_s"] - cp0["etcd_cpu_s"]) / window,
        "etcd_db_bytes": cp1["etcd_db_bytes"], "etcd_db_in_use_bytes": cp1["etcd_db_in_use_bytes"],
        "standins_cores": (end.standins_cpu_s - start.standins_cpu_s) / window if standins else None,
        "machine_busy_cores": busy / window, "machine_cores": (end.machine[1] - start.machine[1]) / window,
    }


def bench(bed: TestBed, root: Path, run_id: str, *, runs: int, lease_seconds: int, stopped: int, wake: int = 0,
          log: Any = print) -> dict[str, Any]:
    """``runs`` applied at once, then the steady state with ``stopped`` of them stopping; then, with all of them
    still renewing, ``wake`` runs taken to Waiting and woken (``wake_amid``)."""
    namespace = f"bench-scale-{uuid.uuid4().hex[:4]}"
    resume.prepare_namespace(bed, namespace)
    names = [f"run-{i:05d}" for i in range(runs)]
    shards = max(1, -(-runs // RUNS_PER_STANDIN))
    watcher = resume.Watcher(bed, namespace, _reduce).start()
    standins = StandIns(bed, root, run_id, namespace, shards)
    renew_log = standins.log
    out: dict[str, Any] = {"runs": runs, "lease_seconds": lease_seconds, "stopped": stopped, "standins": shards}
    with resume.operator(bed, namespace, root, run_id, env=FLEET_CLIENT) as op:
        cpu0, t0 = proc_cpu_seconds(op.pid), time.time()
        requests0 = apiserver_requests(bed)
        create_runs(bed, namespace, names, lease_seconds, shards)
        created = time.time()
        log(f"  created {runs} DurableRuns in {created - t0:.1f}s")
        plan: dict[str, Any] = {"namespace": namespace, "lease_seconds": lease_seconds, "stop": {}}
        standins.start(plan)
        try:
            def all_held() -> bool:
                return _count(renew_log, "acquired") >= runs

            # At most half an hour: a ramp the control plane cannot carry is reported as such, not waited on.
            procs.wait_for(all_held, timeout=max(300, min(runs, RAMP_LIMIT_S)), interval=1.0,
                           what=f"all {runs} runs Running with their leases held")
        except procs.Timeout:
            log(f"  only {_count(renew_log, 'acquired')} of {runs} leases held after the ramp-up timeout")
        ramp = time.time()
        cpu1 = proc_cpu_seconds(op.pid)
        out["ramp_up_s"] = ramp - t0
        out["ramp_cpu_cores"] = (cpu1 - cpu0) / (ramp - t0)
        out["held_after_ramp"] = _count(renew_log, "acquired")
        out["ramp_requests_per_run"] = per_run(requests0, apiserver_requests(bed), runs)
        log(f"  ramp-up: {out['held_after_ramp']} runs Running with leases held after {ramp - t0:.1f}s "
            f"(operator {out['ramp_cpu_cores']:.2f} cores)")
        # The stand-ins read their plan once: restart them with the stops (they re-acquire every lease they see).
        standins.stop()
        victims = names[:: max(1, runs // stopped)][:stopped]
        first_stop = time.time() + 5
        # Spread over a renewal period, so detection is seen at every phase of the operator's timers.
        plan["stop"] = {name: first_stop + i * (lease_seconds / 3) / stopped for i, name in enumerate(victims)}
        standins.start(plan)
        start = _mark(bed, op, standins)
        rss: list[float] = []
        deadline = max(plan["stop"].values()) + 2 * lease_seconds + 30
        while time.time() < deadline:
            rss.append(proc_memory_mb(op.pid)["VmRSS"])
            if _restarted(watcher, victims) >= len(victims) and time.time() > max(plan["stop"].values()) \
                    + lease_seconds + 15:
                break
            time.sleep(2)
        out.update(_window(bed, op, start, rss, standins))
        if wake:
            out["woken_amid"] = wake_amid(bed, root, run_id, namespace, watcher, wake, log)
        time.sleep(5)  # let the stand-ins acquire the restarted attempts
        standins.stop()
        out.update(object_sizes(bed, namespace))
    watcher.stop()
    renewals = _events(renew_log)
    out["renewer"] = _standin_counts(renewals)
    out.update(_restart_checks(watcher, names, victims, renewals, lease_seconds))
    delay = out["detection_delay"]
    log(f"  operator {out['cpu_cores']:.2f} cores, RSS max {out['rss_mb_max']:.0f} MB; "
        f"API {out['api_requests_per_s']:.0f} req/s, API server {out['apiserver_cores']:.2f} cores, etcd "
        f"{out['etcd_cores']:.2f} cores; detection p50 {delay['p50']:.1f}s p99 {delay['p99']:.1f}s "
        f"after expiry; missed {out['missed_restarts']}, duplicated {out['duplicated_restarts']}; stand-in lag p99 "
        f"{out['renewer'].get('lag_p99', float('nan')):.2f}s")
    return out


def _standin_counts(renewals: list[dict[str, Any]]) -> dict[str, Any]:
    """The stand-ins' counts summed, and their worst lag (each reports its own at SIGTERM; one that renewed
    nothing reports NaN)."""
    reports = [e for e in renewals if e.get("event") == "counts"]
    total: dict[str, Any] = {key: sum(int(e.get(key, 0)) for e in reports)
                             for key in ("acquired", "renewed", "fenced", "errors", "lists", "waits", "completed")}
    for key in ("lag_p50", "lag_p99", "lag_max"):
        lags = [float(e[key]) for e in reports if isinstance(e.get(key), (int, float)) and e[key] == e[key]]
        total[key] = max(lags, default=float("nan"))
    return total


#: Waiting runs taken there by stand-ins (the path a real run takes); the rest are cloned from one of them.
THROUGH_RUNNERS = 1000
#: The shard label of cloned runs no stand-in watches (only the woken sample's are watched).
UNWATCHED = "none"


def create_waiting_clones(bed: TestBed, namespace: str, names: list[str], template: dict[str, Any],
                          watched: set[str]) -> None:
    """Create ``names`` as DurableRuns whose status is ``template``'s (a run a stand-in took to Waiting),
    its run name replaced by each one's: the object an operator finds after such a run's first attempt."""
    from kubernetes import client

    local = threading.local()
    status = json.dumps(template["status"])
    origin = template["metadata"]["name"]

    def create(name: str) -> None:
        if not hasattr(local, "api"):
            local.api = client.CustomObjectsApi(bed.api_client())
        body = _run_manifest(namespace, name, 180)
        body["metadata"]["labels"][SHARD_LABEL] = "0" if name in watched else UNWATCHED
        body["metadata"]["finalizers"] = template["metadata"].get("finalizers") or []  # the operator's, as on it
        local.api.create_namespaced_custom_object(api.GROUP, api.VERSION, namespace, api.PLURAL, body)
        local.api.patch_namespaced_custom_object_status(api.GROUP, api.VERSION, namespace, api.PLURAL, name,
                                                        {"status": json.loads(status.replace(origin, name))})

    with ThreadPoolExecutor(max_workers=8) as pool:
        list(pool.map(create, names))


def settle(op: procs.ManagedProcess, timeout: float, quiet_cores: float = 0.05, window: float = 10.0) -> float:
    """Seconds until the operator's CPU over ``window`` seconds falls under ``quiet_cores``."""
    t0 = time.time()
    last_cpu, last_t = proc_cpu_seconds(op.pid), time.time()
    while time.time() - t0 < timeout:
        time.sleep(window)
        cpu, now = proc_cpu_seconds(op.pid), time.time()
        if (cpu - last_cpu) / (now - last_t) < quiet_cores:
            return now - t0
        last_cpu, last_t = cpu, now
    return float("nan")


def waiting(bed: TestBed, root: Path, run_id: str, *, runs: int, woken: int, idle_seconds: float,
            through_runners: int = THROUGH_RUNNERS, log: Any = print) -> dict[str, Any]:
    """``runs`` runs Waiting for event "go"; the operator idle with them; then ``woken`` of them sent the event,
    one every 50 ms: event patch -> the next attempt's pod, and exactly one such pod per woken run.

    Up to ``through_runners`` runs get there as a real run does (a stand-in ends each first attempt Waiting); the rest
    are created with the operator stopped, each with the status of one of those (its name replaced), and the
    operator started again: so 100,000 waiting runs cost minutes to build rather than the eight writes a run each
    that the real path takes. The operator's start with all of them (until its CPU settles) is measured too. Half
    the woken sample is of each kind."""
    from kubernetes import client

    namespace = f"bench-waiting-{uuid.uuid4().hex[:4]}"
    resume.prepare_namespace(bed, namespace)
    names = [f"wait-{i:06d}" for i in range(runs)]
    real, clones = names[:through_runners], names[through_runners:]
    half = woken // 2 if clones else woken
    sample = real[:: max(1, len(real) // half)][:half] + clones[:: max(1, len(clones) // max(1, woken - half))][
        :woken - half]
    watcher = resume.Watcher(bed, namespace, _reduce).start()
    standins = StandIns(bed, root, run_id, namespace, 1)
    out: dict[str, Any] = {"runs": runs, "through_runners": len(real), "woken": len(sample), "standins": 1}
    custom = client.CustomObjectsApi(bed.api_client())
    plan = {"namespace": namespace, "lease_seconds": 180, "stop": {}, "wait_event": "go"}

    with resume.operator(bed, namespace, root, run_id, env=FLEET_CLIENT):
        t0 = time.time()
        standins.start(plan)
        create_runs(bed, namespace, real, 180, 1)
        with contextlib.suppress(procs.Timeout):  # reported below: how many got there
            procs.wait_for(lambda: sum(p == api.Phase.WAITING for p in _phases(watcher).values()) >= len(real),
                           timeout=max(300, len(real)), interval=2.0, what=f"all {len(real)} runs Waiting")
        out["ramp_up_s"] = time.time() - t0
        log(f"  {sum(p == api.Phase.WAITING for p in _phases(watcher).values())} of {len(real)} runs Waiting through "
            f"stand-ins after {out['ramp_up_s']:.0f}s")
        standins.stop()
    if clones:
        template = custom.get_namespaced_custom_object(api.GROUP, api.VERSION, namespace, api.PLURAL, real[0])
        assert template["status"]["phase"] == api.Phase.WAITING, template["status"]
        t0 = time.time()
        create_waiting_clones(bed, namespace, clones, template, set(sample))
        out["clone_s"] = time.time() - t0
        log(f"  {len(clones)} more Waiting runs created with the operator stopped in {out['clone_s']:.0f}s")
    with resume.operator(bed, namespace, root, run_id, env=FLEET_CLIENT) as op:
        start = _mark(bed, op)
        out["operator_start_s"] = settle(op, timeout=max(300, runs / 50))
        out["start"] = _window(bed, op, start, [proc_memory_mb(op.pid)["VmRSS"]])
        out["waiting_after_ramp"] = sum(p == api.Phase.WAITING for p in _phases(watcher).values())
        log(f"  operator started with {out['waiting_after_ramp']} Waiting runs: settled in "
            f"{out['operator_start_s']:.0f}s, RSS {out['start']['rss_mb_end']:.0f} MB")
        start = _mark(bed, op)
        rss: list[float] = []
        idle_end = time.time() + idle_seconds
        while time.time() < idle_end:
            rss.append(proc_memory_mb(op.pid)["VmRSS"])
            time.sleep(2)
        out["idle"] = _window(bed, op, start, rss)
        standins.start(plan)  # shard 0: the runs taken there by stand-ins and the woken clones
        start = _mark(bed, op)
        sent = _send_events(bed, namespace, sample)
        with contextlib.suppress(procs.Timeout):  # a run without one is counted as a missed wake
            procs.wait_for(lambda: len(set(_next_attempts(watcher)) & set(sample)) >= len(sample), timeout=120,
                           interval=1.0, what="a new attempt for every woken run")
        time.sleep(10)  # a duplicate would show by now
        out["wake"] = _window(bed, op, start, [proc_memory_mb(op.pid)["VmRSS"]])
        standins.stop()
        out.update(object_sizes(bed, namespace))
    watcher.stop()
    pods = _next_attempts(watcher)
    out.update(_wakes(pods, sent))
    through = set(real)
    out["event_to_pod_clones"] = _summary([pods[n][0] - sent[n] for n in sample if n in pods and n not in through])
    out["duplicated_wakes"] += sum(1 for n in pods if n not in sent)  # a run woken that was sent no event
    out["renewer"] = _standin_counts(_events(standins.log))
    idle = out["idle"]
    log(f"  idle with {runs} waiting runs: operator {idle['cpu_cores']:.3f} cores, RSS {idle['rss_mb_max']:.0f} MB, "
        f"API {idle['api_requests_per_s']:.1f} req/s; event -> pod p50 {out['event_to_pod']['p50']:.2f}s p99 "
        f"{out['event_to_pod']['p99']:.2f}s; missed {out['missed_wakes']}, duplicated {out['duplicated_wakes']}")
    return out


def _next_attempts(watcher: resume.Watcher, stamped: bool = False) -> dict[str, list[float]]:
    """Per run, when the watch first saw each pod of an attempt after its first, in order; ``stamped``: when the
    API server created each (its creationTimestamp, to the second) instead."""
    events = watcher.snapshot()
    pods: dict[str, dict[str, float]] = defaultdict(dict)
    for when, kind, _, obj in events:
        if kind == "pod" and obj.get("run") and obj.get("epoch") not in (None, "1"):
            created = _stamp(obj.get("created")) if stamped else when
            pods[obj["run"]].setdefault(obj["name"], created if created is not None else when)
    return {run: sorted(p.values()) for run, p in pods.items()}


def _phases(watcher: resume.Watcher) -> dict[str, str]:
    """Each run's latest phase the watch saw."""
    events = watcher.snapshot()
    return {obj["name"]: obj.get("phase") or "" for _, kind, _, obj in events if kind == "dr"}


def _send_events(bed: TestBed, namespace: str, names: list[str]) -> dict[str, float]:
    """Approve event "go" on each of ``names``, one every 50 ms: when each patch was sent."""
    from kubernetes import client

    custom = client.CustomObjectsApi(bed.api_client())
    sent: dict[str, float] = {}
    for name in names:
        sent[name] = time.time()
        custom.patch_namespaced_custom_object(api.GROUP, api.VERSION, namespace, api.PLURAL, name,
                                              {"spec": {"events": {"go": {"approved": True}}}})
        time.sleep(0.05)
    return sent


def _wakes(pods: dict[str, list[float]], sent: dict[str, float]) -> dict[str, Any]:
    """Event patch → the next attempt's first pod, and the woken runs without exactly one such pod."""
    return {"event_to_pod": _summary([pods[n][0] - sent[n] for n in sent if n in pods]),
            "missed_wakes": sum(1 for n in sent if n not in pods),
            "duplicated_wakes": sum(1 for n in sent if len(pods.get(n, [])) > 1)}


def wake_amid(bed: TestBed, root: Path, run_id: str, namespace: str, watcher: resume.Watcher, count: int,
              log: Any = print) -> dict[str, Any]:
    """``count`` more runs in a fleet's namespace, taken to Waiting by a stand-in of their own (the fleet's keep
    renewing), then woken one every 50 ms: event patch → the next attempt's pod, as the operator serves it
    amid the fleet."""
    names = [f"wake-{i:04d}" for i in range(count)]
    waiters = StandIns(bed, root, run_id, namespace, 1, prefix="wake-")
    waiters.start({"namespace": namespace, "lease_seconds": 180, "stop": {}, "wait_event": "go"})
    try:
        t0 = time.time()
        create_runs(bed, namespace, names, 180, 1, prefix="wake-")
        with contextlib.suppress(procs.Timeout):  # those not Waiting are woken all the same, and reported
            procs.wait_for(lambda: sum(_phases(watcher).get(n) == api.Phase.WAITING for n in names) >= count,
                           timeout=max(120, count), interval=1.0, what=f"all {count} runs Waiting")
        phases = _phases(watcher)
        out: dict[str, Any] = {"runs": count, "waiting_s": time.time() - t0,
                               "waiting": sum(phases.get(n) == api.Phase.WAITING for n in names)}
        sent = _send_events(bed, namespace, names)
        with contextlib.suppress(procs.Timeout):  # a run without one is counted as a missed wake
            procs.wait_for(lambda: len(set(_next_attempts(watcher)) & set(names)) >= count, timeout=120,
                           interval=1.0, what="a new attempt for every woken run")
        time.sleep(10)  # a duplicate would show by now
    finally:
        waiters.stop()
    out.update(_wakes(_next_attempts(watcher), sent))
    # The same from the API server's creationTimestamp (to the second, so up to 1 s early): this bench's watch
    # keeping up or not.
    out["event_to_pod_created"] = _wakes(_next_attempts(watcher, stamped=True), sent)["event_to_pod"]
    e = out["event_to_pod"]
    log(f"  {out['waiting']} of {count} runs Waiting amid the fleet after {out['waiting_s']:.0f}s; woken: event -> "
        f"pod p50 {e['p50']:.2f}s p99 {e['p99']:.2f}s; missed {out['missed_wakes']}, duplicated "
        f"{out['duplicated_wakes']}")
    return out


def _events(path: Path) -> list[dict[str, Any]]:
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def _count(path: Path, event: str) -> int:
    return len({e["name"] for e in _events(path) if e.get("event") == event})


def _restarted(watcher: resume.Watcher, victims: list[str]) -> int:
    events = watcher.snapshot()
    seen = {obj["name"] for _, kind, _, obj in events if kind == "dr" and (obj.get("restarts") or 0) >= 1}
    return len(seen & set(victims))


def _restart_checks(watcher: resume.Watcher, names: list[str], victims: list[str],
                    renewals: list[dict[str, Any]], lease_seconds: int) -> dict[str, Any]:
    events = watcher.snapshot()
    last_sent = {e["name"]: e["last_renewal_sent"] for e in renewals if e.get("event") == "stopped"}
    detected: dict[str, float] = {}
    decided: dict[str, float] = {}  # the operator's nextAttemptTime on the restart the watch saw first
    restarts: dict[str, int] = defaultdict(int)
    epochs: dict[str, int] = defaultdict(int)
    pods: dict[str, set[str]] = defaultdict(set)
    for when, kind, _type, obj in events:
        if kind == "dr":
            restarts[obj["name"]] = max(restarts[obj["name"]], obj.get("restarts") or 0)
            epochs[obj["name"]] = max(epochs[obj["name"]], obj.get("epoch") or 0)
            if (obj.get("restarts") or 0) >= 1 and obj["name"] not in detected:
                detected[obj["name"]] = when
                if (stamp := _stamp(obj.get("decided"))) is not None:
                    decided[obj["name"]] = stamp
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
        # Split at the operator's decision (to the second): expiry -> decided, decided -> this bench's watch.
        "decided_after_expiry": _summary([decided[n] - (last_sent[n] + lease_seconds) for n in victims
                                          if n in decided and n in last_sent]),
        "watch_after_decided": _summary([detected[n] - decided[n] for n in victims if n in decided]),
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
