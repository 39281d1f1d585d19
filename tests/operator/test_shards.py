"""More than one operator: three replicas split the runs over shard Leases, and one of them dies.

On the test bed: RUNS DurableRuns whose pods stay unscheduled, their leases
renewed by a stand-in for their runners (``tests.operator.standin``), and
three operators holding SHARDS shards between them. Some runs' runners hang
(their lease lapses) just as the replica holding the most of them is killed:
the survivors must take its shards over within the shard lease, restart each
hung run exactly once (none missed, none twice) within the shard lease + 5 s
of the kill, and restart no healthy run.
"""

from __future__ import annotations

import json
import os
import signal
import threading
import time
from typing import Any

import pytest

from durablerun import api
from durablerun_operator import shards
from durablerun_testbed import procs
from tests.helpers.runs import RunEnv, StartOperator
from tests.operator.standin import StandIn

pytestmark = pytest.mark.testbed

RUNS = 60
HUNG = 12  # runners that hang: spread over the shards, so the dead replica holds some of them
SHARDS = 12
SHARD_LEASE = 10  # seconds
LEASE, HUNG_LEASE = 30, 8  # the runs' leases: healthy ones renew every 10 s, the hung ones lapse within 8 s
REPLICAS = ("op-a", "op-b", "op-c")


def step(what: str) -> None:
    print(f"{time.strftime('%X')} {what}", flush=True)  # shown with a failure: how far the test got, and when


@pytest.mark.timeout(600)
def test_a_dead_replicas_runs_are_taken_over_and_each_hung_run_restarts_exactly_once(
        start_operator: StartOperator, runs: RunEnv) -> None:
    operators = {name: start_operator(name, **{
        api.OperatorEnv.SHARDS: str(SHARDS), api.OperatorEnv.SHARD_LEASE_SECONDS: str(SHARD_LEASE),
        api.OperatorEnv.NAMESPACE: runs.namespace, api.OperatorEnv.POD_NAME: name}) for name in REPLICAS}
    procs.wait_for(lambda: _holders(runs) == _balanced(REPLICAS), timeout=60, interval=0.5,
                   what="the three replicas to hold the shards rendezvous hashing gives each")
    step("shards balanced")

    names = [f"run-{i:03d}" for i in range(RUNS)]
    hung = names[:HUNG]
    items = []
    for name in names:
        lease = HUNG_LEASE if name in hung else LEASE
        manifest = runs.manifest(name, "optest_flows:steps", policy={"leaseDuration": f"{lease}s"})
        manifest["spec"]["template"]["spec"]["schedulerName"] = "durablerun-test-no-scheduler"  # stays Pending
        items.append(manifest)
    runs.testbed.kubectl("apply", "-f", "-", input=json.dumps({"apiVersion": "v1", "kind": "List", "items": items}))

    with StandIn(runs, names, LEASE, {name: HUNG_LEASE for name in hung}) as stand_in:
        procs.wait_for(lambda: len(stand_in.held) == RUNS, timeout=180, interval=1.0,
                       what=f"all {RUNS} stand-in leases acquired")
        step("all leases held")
        before = {run["metadata"]["name"]: run for run in _runs(runs)}
        assert all(run["status"].get("restarts", 0) == 0 for run in before.values()), "a lease lapsed early"
        holders = _holders(runs)
        owner = {name: holders[shards.shard_of(run["metadata"]["uid"], SHARDS)] for name, run in before.items()}
        victim = max(REPLICAS, key=lambda replica: sum(owner[name] == replica for name in hung))
        orphaned = [name for name in hung if owner[name] == victim]
        assert orphaned, f"no hung run in {victim}'s shards: {owner}"

        # The hung runners stop renewing, and the replica holding the most of their runs dies with them.
        for name in hung:
            stand_in.abandoned.add((name, before[name]["status"]["epoch"]))
        with Watch(runs) as watch:
            operators[victim].process.signal_group(signal.SIGKILL)
            killed = time.time()
            step(f"killed {victim}; {len(orphaned)} of its runs' runners hang")
            survivors = tuple(r for r in REPLICAS if r != victim)
            procs.wait_for(lambda: watch.holders == _balanced(survivors), timeout=SHARD_LEASE + 30, interval=0.2,
                           what=f"the survivors to take over {victim}'s shards")
            procs.wait_for(lambda: set(watch.restarted) >= set(hung), timeout=SHARD_LEASE + 30, interval=0.2,
                           what="every hung run restarted")
        taken_over = max(watch.changed[shard] for shard, holder in holders.items() if holder == victim) - killed
        restarted_at = {name: watch.restarted[name] - killed for name in hung}
        step(f"shards taken over {taken_over:.1f}s after the kill; hung runs restarted after (s): "
             f"{ {n: round(t, 1) for n, t in sorted(restarted_at.items())} }; load {os.getloadavg()[0]:.1f}")
        # The next attempts' leases are renewed again; a lease's time for a second restart to show.
        procs.wait_for(lambda: time.time() > killed + SHARD_LEASE + 2 * HUNG_LEASE + 10, timeout=60,
                       what="time for a duplicate restart to show")

    after = {run["metadata"]["name"]: run["status"] for run in _runs(runs)}
    assert taken_over <= SHARD_LEASE + 5, f"{victim}'s shards were taken over {taken_over:.1f}s after it died"
    late = {n: t for n, t in restarted_at.items() if n in orphaned and t > SHARD_LEASE + 5}
    assert not late, f"runs of the dead replica decided again later than the shard lease + 5 s: {late}"
    duplicated = {n: s.get("restarts") for n, s in after.items() if n in hung and s.get("restarts") != 1}
    assert not duplicated, f"hung runs restarted other than exactly once: {duplicated}"
    assert all(after[n]["epoch"] == before[n]["status"]["epoch"] + 1 for n in hung)
    healthy = {n: s.get("restarts") for n, s in after.items() if n not in hung and s.get("restarts", 0) != 0}
    assert not healthy, f"healthy runs restarted: {healthy}"
    assert not stand_in.errors, stand_in.errors[:5]
    for name in survivors:
        operators[name].process.check_alive()


class Watch:
    """Polls the shard Leases and the runs from a thread of its own: when each shard changed holder and each
    run was first seen restarted (wall clock), so the test's own waits do not delay what it measures."""

    def __init__(self, runs: RunEnv) -> None:
        from kubernetes import client

        self.runs = runs
        self.leases = client.CoordinationV1Api(runs.testbed.api_client())
        self.custom = client.CustomObjectsApi(runs.testbed.api_client())
        self.holders = _holders(runs)
        self.changed: dict[int, float] = {}
        self.restarted: dict[str, float] = {}
        self.done = threading.Event()
        self.thread = threading.Thread(target=self._loop, name="watch", daemon=True)

    def _loop(self) -> None:
        while not self.done.wait(0.2):
            try:
                self._poll()
            except Exception as error:  # shown by the test's waits timing out, with this
                print(f"watch: {type(error).__name__}: {error}", flush=True)

    def _poll(self) -> None:
        holders = _holders(self.runs, self.leases)
        now = time.time()
        for shard, holder in holders.items():
            if self.holders.get(shard) != holder:
                self.changed[shard] = now
        self.holders = holders
        for run in self.custom.list_namespaced_custom_object(
                api.GROUP, api.VERSION, self.runs.namespace, api.PLURAL)["items"]:
            if (run.get("status") or {}).get("restarts", 0):
                self.restarted.setdefault(run["metadata"]["name"], now)

    def __enter__(self) -> Watch:
        self.thread.start()
        return self

    def __exit__(self, *_: Any) -> None:
        self.done.set()
        self.thread.join(timeout=30)


def _balanced(replicas: tuple[str, ...]) -> dict[int, str]:
    return {shard: str(shards.assign(shard, replicas)) for shard in range(SHARDS)}


def _holders(runs: RunEnv, leases_api: Any = None) -> dict[int, str]:
    """Shard -> its Lease's holder, for the shards held now."""
    from kubernetes import client

    leases_api = leases_api or client.CoordinationV1Api(runs.testbed.api_client())
    leases = leases_api.list_namespaced_lease(runs.namespace).items
    return {int(lease.metadata.name.removeprefix(shards.SHARD_PREFIX)): lease.spec.holder_identity
            for lease in leases if lease.metadata.name.startswith(shards.SHARD_PREFIX) and lease.spec.holder_identity}


def _runs(runs: RunEnv) -> list[dict[str, Any]]:
    out = runs.testbed.kubectl("get", "dr", "-n", runs.namespace, "-o", "json").stdout
    return list(json.loads(out)["items"])
