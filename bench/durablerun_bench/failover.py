"""More than one operator at scale: N runs over 3 sharded replicas, one replica killed (issue 25, item 5).

The long version of tests/operator/test_shards.py (60 runs there; 3,000 here by default,
``BENCH_SHARD_RUNS``). The runs' leases are renewed by the stand-ins of the scale section
(``scale.StandIns``, their lag reported). Some runs' stand-ins stop renewing; just before their leases
lapse, the replica holding the most of them is SIGKILLed. Measured:

* how long after the kill the survivors held the dead replica's shards (target: the shard lease);
* per stopped run, from its lease's expiry (or the kill, if later) to the restart a watch sees: the runs
  of the dead replica's shards against the shard lease + 5 s, the others against 5 s;
* missed restarts (a stopped run never restarted) and duplicated ones (a second restart, or a restart of
  a run that kept renewing): must be 0;
* the stand-ins' renewal lag, so a lapse they caused is not blamed on the operator.
"""

from __future__ import annotations

import contextlib
import os
import signal
import sys
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from durablerun import api
from durablerun_bench import resume, scale
from durablerun_operator import shards as sharding
from durablerun_testbed import procs
from durablerun_testbed.testbed import TestBed

REPLICAS = ("op-a", "op-b", "op-c")


@contextlib.contextmanager
def replicas(bed: TestBed, namespace: str, root: Path, run_id: str, *, shards: int,
             shard_lease: int) -> Iterator[dict[str, procs.ManagedProcess]]:
    """Three operators sharing the namespace's runs over ``shards`` shard Leases."""
    started: dict[str, procs.ManagedProcess] = {}
    try:
        for name in REPLICAS:
            started[name] = procs.ManagedProcess(
                name, [sys.executable, "-m", "durablerun_operator", "--namespace", namespace],
                log_path=root / f"operator-{namespace}-{name}.log",
                env={**bed.env(), api.OperatorEnv.METRICS_PORT: str(procs.free_port()),
                     api.OperatorEnv.HEALTH_PORT: str(procs.free_port()), api.OperatorEnv.LOG_LEVEL: "WARNING",
                     api.OperatorEnv.SHARDS: str(shards), api.OperatorEnv.SHARD_LEASE_SECONDS: str(shard_lease),
                     api.OperatorEnv.NAMESPACE: namespace, api.OperatorEnv.POD_NAME: name},
                testbed_id=run_id)
        yield started
    finally:
        for process in started.values():
            process.stop()


def holders(bed: TestBed, namespace: str) -> dict[int, str]:
    """Shard -> its Lease's holder, for the shards held now."""
    from kubernetes import client

    leases = client.CoordinationV1Api(bed.api_client()).list_namespaced_lease(namespace).items
    return {int(lease.metadata.name.removeprefix(sharding.SHARD_PREFIX)): lease.spec.holder_identity
            for lease in leases
            if lease.metadata.name.startswith(sharding.SHARD_PREFIX) and lease.spec.holder_identity}


def balanced(alive: tuple[str, ...], shards: int) -> dict[int, str]:
    return {shard: str(sharding.assign(shard, alive)) for shard in range(shards)}


class LeaseWatch:
    """Polls the shard Leases from a thread: when each shard last changed holder (wall clock)."""

    def __init__(self, bed: TestBed, namespace: str) -> None:
        self.bed, self.namespace = bed, namespace
        self.now = holders(bed, namespace)
        self.changed: dict[int, float] = {}
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="lease-watch", daemon=True)

    def _loop(self) -> None:
        while not self._done.wait(0.2):
            with contextlib.suppress(Exception):  # a failed poll shows as a late takeover
                current = holders(self.bed, self.namespace)
                for shard, holder in current.items():
                    if self.now.get(shard) != holder:
                        self.changed[shard] = time.time()
                self.now = current

    def __enter__(self) -> LeaseWatch:
        self._thread.start()
        return self

    def __exit__(self, *_: Any) -> None:
        self._done.set()
        self._thread.join(timeout=30)


def bench(bed: TestBed, root: Path, run_id: str, *, runs: int, lease_seconds: int, stopped: int,
          shards: int = 12, shard_lease: int = 15, log: Any = print) -> dict[str, Any]:
    from kubernetes import client

    namespace = f"bench-shards-{uuid.uuid4().hex[:4]}"
    resume.prepare_namespace(bed, namespace)
    names = [f"run-{i:05d}" for i in range(runs)]
    standin_count = max(1, -(-runs // scale.RUNS_PER_STANDIN))
    watcher = resume.Watcher(bed, namespace, scale._reduce).start()
    standins = scale.StandIns(bed, root, run_id, namespace, standin_count)
    out: dict[str, Any] = {"runs": runs, "replicas": len(REPLICAS), "shards": shards, "shard_lease_s": shard_lease,
                           "lease_seconds": lease_seconds, "stopped": stopped, "standins": standin_count}
    with replicas(bed, namespace, root, run_id, shards=shards, shard_lease=shard_lease) as operators:
        procs.wait_for(lambda: holders(bed, namespace) == balanced(REPLICAS, shards), timeout=120, interval=0.5,
                       what="the three replicas to hold the shards rendezvous hashing gives each")
        t0 = time.time()
        scale.create_runs(bed, namespace, names, lease_seconds, standin_count)
        plan: dict[str, Any] = {"namespace": namespace, "lease_seconds": lease_seconds, "stop": {}}
        standins.start(plan)
        with contextlib.suppress(procs.Timeout):
            procs.wait_for(lambda: scale._count(standins.log, "acquired") >= runs, timeout=max(300, runs),
                           interval=1.0, what=f"all {runs} leases held")
        out["held_after_ramp"] = scale._count(standins.log, "acquired")
        out["ramp_up_s"] = time.time() - t0
        log(f"  {out['held_after_ramp']} of {runs} runs held by the stand-ins after {out['ramp_up_s']:.0f}s")

        custom = client.CustomObjectsApi(bed.api_client())
        items = custom.list_namespaced_custom_object(api.GROUP, api.VERSION, namespace, api.PLURAL)["items"]
        now = holders(bed, namespace)
        owner = {run["metadata"]["name"]: now.get(sharding.shard_of(run["metadata"]["uid"], shards)) for run in items}
        victims = names[:: max(1, runs // stopped)][:stopped]
        victim = max(REPLICAS, key=lambda replica: sum(owner.get(name) == replica for name in victims))
        orphaned = [name for name in victims if owner.get(name) == victim]
        # The stand-ins read their plan once: restart them with the stops, then kill the victim just before
        # those leases lapse, so its runs are due while nobody decides its shards.
        standins.stop()
        stop_at = time.time() + 5
        plan["stop"] = {name: stop_at for name in victims}
        standins.start(plan)
        kill_at = stop_at + lease_seconds - 2
        procs.wait_for(lambda: time.time() >= kill_at, timeout=lease_seconds + 60, interval=0.2,
                       what="the stopped runs' leases to be about to lapse")
        with LeaseWatch(bed, namespace) as leases:
            operators[victim].signal_group(signal.SIGKILL)
            killed = time.time()
            survivors = tuple(r for r in REPLICAS if r != victim)
            with contextlib.suppress(procs.Timeout):
                procs.wait_for(lambda: leases.now == balanced(survivors, shards), timeout=shard_lease + 60,
                               interval=0.5, what=f"the survivors to take over {victim}'s shards")
            with contextlib.suppress(procs.Timeout):
                procs.wait_for(lambda: scale._restarted(watcher, victims) >= len(victims),
                               timeout=shard_lease + lease_seconds + 60, interval=1.0,
                               what="every stopped run restarted")
            dead_shards = [shard for shard, holder in now.items() if holder == victim]
            taken = [leases.changed[s] - killed for s in dead_shards if s in leases.changed]
            out["takeover_s"] = max(taken) if len(taken) == len(dead_shards) else None
            time.sleep(min(30, lease_seconds))  # time for a duplicate restart to show
        standins.stop()
        for name in survivors:
            operators[name].check_alive()
    watcher.stop()
    renewals = scale._events(standins.log)
    checks = scale._restart_checks(watcher, names, victims, renewals, lease_seconds)
    restarted_at = _restart_times(watcher)
    expiry = {e["name"]: e["last_renewal_sent"] + lease_seconds for e in renewals if e.get("event") == "stopped"}
    decided = {n: restarted_at[n] - max(expiry[n], killed) for n in victims if n in restarted_at and n in expiry}
    out.update(
        victim=victim, dead_shards=len(dead_shards), orphaned=len(orphaned), load=list(os.getloadavg()),
        orphaned_decided=scale._summary([decided[n] for n in orphaned if n in decided]),
        others_decided=scale._summary([v for n, v in decided.items() if n not in orphaned]),
        missed_restarts=checks["missed_restarts"], duplicated_restarts=checks["duplicated_restarts"],
        missed=checks["missed"], duplicated=checks["duplicated"], standin_lapses=checks["standin_lapses"],
        renewer=scale._standin_counts(renewals), target_s=shard_lease + 5)
    log(f"  killed {victim} ({out['dead_shards']} shards, {len(orphaned)} stopped runs); taken over after "
        f"{out['takeover_s'] if out['takeover_s'] is None else round(out['takeover_s'], 1)}s; its runs decided "
        f"p99 {out['orphaned_decided']['p99']:.1f}s after due; missed {out['missed_restarts']}, duplicated "
        f"{out['duplicated_restarts']}; stand-in lag p99 {out['renewer'].get('lag_p99', float('nan')):.2f}s")
    return out


def _restart_times(watcher: resume.Watcher) -> dict[str, float]:
    events = watcher.snapshot()
    first: dict[str, float] = {}
    for when, kind, _type, obj in events:
        if kind == "dr" and (obj.get("restarts") or 0) >= 1:
            first.setdefault(obj["name"], when)
    return first
