"""A burst of events to waiting runs, through a replica's death, a shard handover and an API server restart.

A control plane of the test's own (so no other test loses its API server),
two operator replicas splitting the runs over shard Leases, and BURST runs
taken to Waiting (for event "go") by the bench's stand-in runners, as a runner
reaching ``ctx.wait_for_event`` ends its attempt. The stand-ins then stop, and
the event is patched into every run, paced over the burst; meanwhile one
replica is killed (its shards are taken over), the API server is stopped and
started again, and the killed replica comes back (the shards are handed back).
Each run must wake exactly once: one new attempt (attempt up by one, at the
epoch its wait bumped, in one new pod), none lost, none doubled.

50 runs in ``make test`` (enough to spread over both replicas' shards), 1,000 in ``make faults``
(FAULT_TRIALS=120).
"""

from __future__ import annotations

import json
import os
import signal
import sys
import threading
import time
import uuid
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from durablerun import api
from durablerun_testbed import procs
from durablerun_testbed.testbed import TestBed
from tests.helpers import bed
from tests.helpers.session import SESSION_ID

pytestmark = pytest.mark.testbed

# The bench's stand-in runners (bench/ is outside the installed packages, as tests/bench/conftest.py says).
BENCH = Path(__file__).resolve().parents[2] / "bench"
if str(BENCH) not in sys.path:
    sys.path.insert(0, str(BENCH))
from durablerun_bench import resume, scale  # noqa: E402

BURST = 1000 if int(os.environ.get("FAULT_TRIALS", "8")) >= 100 else 50
PACE = 10.0 if BURST <= 100 else 60.0  # seconds the burst of event patches is spread over
SHARDS, SHARD_LEASE = 8, 10
LEASE = 300  # the runs' lease: no attempt may lapse while the test looks


def step(what: str) -> None:
    print(f"{time.strftime('%X')} {what}", flush=True)  # shown with a failure: how far the test got, and when


@pytest.mark.timeout(1800)
# No node: the woken attempts' pods stay Pending, so the new attempt is the operator's doing alone.
@pytest.mark.parametrize("own_bed", [{"node": False}], indirect=True, ids=["no-node"])
def test_each_waiting_run_wakes_exactly_once_through_a_replica_death_a_handover_and_an_apiserver_restart(
        own_bed: TestBed, testbed_root: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # The stand-ins are processes of their own: they find the bench through PYTHONPATH.
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(filter(None, [str(BENCH), os.environ.get("PYTHONPATH")])))
    namespace = "t-" + uuid.uuid4().hex[:10]
    resume.prepare_namespace(own_bed, namespace)
    operators = bed.start_operator.__wrapped__(own_bed, testbed_root, namespace)
    start_operator = next(operators)
    standins = scale.StandIns(own_bed, testbed_root, SESSION_ID, namespace, max(1, BURST // 500))
    try:
        def replica(name: str) -> Any:
            return start_operator(name, **{
                api.OperatorEnv.SHARDS: str(SHARDS), api.OperatorEnv.SHARD_LEASE_SECONDS: str(SHARD_LEASE),
                api.OperatorEnv.NAMESPACE: namespace, api.OperatorEnv.POD_NAME: name,
                api.OperatorEnv.RESYNC_SECONDS: "600"})  # the watch alone, as in production

        replica("op-a")
        victim = replica("op-b")
        names = [f"wait-{i:04d}" for i in range(BURST)]
        standins.start({"namespace": namespace, "lease_seconds": LEASE, "stop": {}, "wait_event": "go"})
        scale.create_runs(own_bed, namespace, names, LEASE, standins.shards)
        procs.wait_for(lambda: _all_waiting(own_bed, namespace), timeout=max(300, BURST), interval=2.0,
                       what=f"all {BURST} runs Waiting")
        standins.stop()  # from here on, only the operators act
        before = _runs(own_bed, namespace)
        step(f"{BURST} runs Waiting")

        sent: list[str] = []
        errors: list[str] = []
        burst = threading.Thread(target=_send_events, args=(own_bed, namespace, names, sent, errors), daemon=True)
        burst.start()
        procs.wait_for(lambda: len(sent) >= BURST // 4, timeout=PACE + 60, what="a quarter of the events sent")
        victim.process.signal_group(signal.SIGKILL)
        step(f"op-b killed after {len(sent)} events")
        procs.wait_for(lambda: len(sent) >= BURST // 2, timeout=PACE + 60, what="half of the events sent")
        assert own_bed.controlplane
        own_bed.controlplane.restart_apiserver()
        step(f"API server restarted; {len(sent)} events sent")
        procs.wait_for(lambda: len(sent) >= 3 * BURST // 4, timeout=PACE + 120, what="3/4 of the events sent")
        replica("op-b")  # back: the shards rendezvous hashing gives it are handed back during the burst
        step(f"op-b back after {len(sent)} events")
        burst.join(timeout=PACE + 180)
        assert not burst.is_alive(), "the burst of event patches did not finish"
        assert not errors, errors[:5]
        step("all events sent")

        procs.wait_for(lambda: all(r["attempt"] > before[n]["attempt"] for n, r in _runs(own_bed, namespace).items()),
                       timeout=120, interval=2.0, what="every woken run's next attempt")
        step("every run woken")
        settled = time.time() + 3 * SHARD_LEASE + 5  # a duplicate wake would show by now
        procs.wait_for(lambda: time.time() > settled, timeout=60, what="time for a duplicate to show")
        after = _runs(own_bed, namespace)
        pods = _pods(own_bed, namespace)
    finally:
        standins.stop()
        next(operators, None)
        own_bed.kubectl("delete", "namespace", namespace, "--wait=false", check=False)

    # Leaving Running for Waiting bumped the epoch already; the next attempt runs at that epoch, in pod
    # <run>-a<epoch>. A second wake would be another attempt at a further epoch, in another pod.
    not_once = {n: (before[n]["epoch"], a["epoch"], before[n]["attempt"], a["attempt"]) for n, a in after.items()
                if a["attempt"] != before[n]["attempt"] + 1 or a["epoch"] != before[n]["epoch"]}
    assert not not_once, f"{len(not_once)} runs not woken exactly once (epoch before, after; attempt before, " \
        f"after): {dict(list(not_once.items())[:10])}"
    new_pods = Counter(run for run, epoch in pods if epoch >= before[run]["epoch"])
    doubled = {n: new_pods[n] for n in names if new_pods[n] != 1}
    assert not doubled, f"runs without exactly one new pod: {dict(list(doubled.items())[:10])}"


def _send_events(bed: TestBed, namespace: str, names: list[str], sent: list[str], errors: list[str]) -> None:
    """Patch event "go" into each run, paced over PACE seconds; a patch the API server did not take (it is
    restarting) is sent again until it does, as a client would."""
    from kubernetes import client

    custom = client.CustomObjectsApi(bed.api_client())
    gap = PACE / len(names)
    for name in names:
        deadline = time.time() + 120
        while True:
            try:
                custom.patch_namespaced_custom_object(api.GROUP, api.VERSION, namespace, api.PLURAL, name,
                                                      {"spec": {"events": {"go": {"approved": True}}}})
                break
            except Exception as error:  # the API server is down: try again, as kubectl would be
                if time.time() > deadline:
                    errors.append(f"{name}: {error}")
                    return
                time.sleep(0.2)
        sent.append(name)
        time.sleep(gap)


def _runs(bed: TestBed, namespace: str) -> dict[str, dict[str, Any]]:
    out = bed.kubectl("get", "dr", "-n", namespace, "-o", "json").stdout
    return {r["metadata"]["name"]: {"phase": (r.get("status") or {}).get("phase"),
                                    "epoch": (r.get("status") or {}).get("epoch", 0),
                                    "attempt": (r.get("status") or {}).get("attempt", 0)}
            for r in json.loads(out)["items"]}


def _all_waiting(bed: TestBed, namespace: str) -> bool:
    """True once every run is Waiting; until then it fails saying where the others are (shown on a timeout)."""
    runs = _runs(bed, namespace)
    phases = Counter(r["phase"] for r in runs.values())
    if phases[api.Phase.WAITING] == BURST:
        return True
    others = sorted(n for n, r in runs.items() if r["phase"] != api.Phase.WAITING)
    raise AssertionError(f"phases {dict(phases)}; not Waiting: {others[:5]}")


def _pods(bed: TestBed, namespace: str) -> list[tuple[str, int]]:
    """(run, epoch) of every runner pod in the namespace."""
    out = bed.kubectl("get", "pods", "-n", namespace, "-l", api.LABEL_RUN, "-o", "json").stdout
    return [(p["metadata"]["labels"][api.LABEL_RUN], int(p["metadata"]["labels"][api.LABEL_EPOCH]))
            for p in json.loads(out)["items"]]
