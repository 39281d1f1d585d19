"""DurableRuns admitted through a real Kueue: quota caps the runner pods, and a waiting run holds no quota."""

from __future__ import annotations

import json
import time
import uuid

import pytest

from durablerun import api
from durablerun_testbed import procs
from durablerun_testbed.kueue import Kueue
from tests.helpers.kueue import wait_active
from tests.helpers.runs import RunEnv, StartOperator
from tests.kueue.helpers import apply, live_pods, phases, queued_run, queues, reasons

pytestmark = pytest.mark.testbed

KUEUE_ON = {api.OperatorEnv.KUEUE: "true"}


def cluster_queue(runs: RunEnv, cpu: str) -> str:
    """A ClusterQueue with ``cpu`` of quota and the LocalQueue ``lq`` in the test's namespace; its name."""
    name = f"cq-{uuid.uuid4().hex[:6]}"
    apply(runs.testbed, queues(name, "lq", runs.namespace, cpu=cpu))
    wait_active(runs.testbed, "localqueues.kueue.x-k8s.io", "lq", runs.namespace)
    return name


def test_six_runs_in_a_queue_with_quota_for_two_never_run_more_than_two_pods(
        kueue: Kueue, start_operator: StartOperator, runs: RunEnv) -> None:
    cluster_queue(runs, cpu="1")  # two runners of 500m
    start_operator(**KUEUE_ON)
    names = [f"r{i}" for i in range(6)]
    for name in names:
        runs.apply(queued_run(runs, name, "lq", steps=3, sleep=0.5))

    most_pods, most_queued = 0, 0
    deadline = time.monotonic() + 180
    while (seen := phases(runs)) and not all(seen.get(n) == "Succeeded" for n in names):
        assert time.monotonic() < deadline, f"not all Succeeded in 180s: {seen}"
        pods = live_pods(runs)
        assert len(pods) <= 2, f"more runner pods than the quota admits: {pods}"
        most_pods = max(most_pods, len(pods))
        most_queued = max(most_queued, sum(phase == "Queued" for phase in seen.values()))
        time.sleep(0.2)
    kueue.check_alive()

    assert most_pods == 2  # the quota was used, not just respected
    assert most_queued >= 3  # kubectl showed runs Queued while two ran
    for name in names:
        assert [runs.ledger().count(f"start {name}-s{i}") for i in range(3)] == [1, 1, 1], name
        assert "Queued" in reasons(runs, name)
    # Every run released its quota: no Workload is left.
    left = runs.testbed.kubectl("get", "workloads.kueue.x-k8s.io", "-n", runs.namespace, "-o", "name").stdout
    assert left.strip() == ""


def test_a_waiting_run_releases_its_quota_and_queues_again_when_its_event_comes(
        kueue: Kueue, start_operator: StartOperator, runs: RunEnv) -> None:
    cluster_queue(runs, cpu="500m")  # one runner at a time
    start_operator(**KUEUE_ON)
    runs.apply(queued_run(runs, "waiter", "lq", steps=2, sleep=0.1, wait_after=0))
    runs.wait_phase("waiter", "Waiting", timeout=90)

    # The waiter holds no quota: a second run is admitted and finishes while it waits.
    runs.apply(queued_run(runs, "other", "lq", steps=1, sleep=0.1))
    runs.wait_phase("other", "Succeeded", timeout=90)
    assert runs.get("waiter")["status"]["phase"] == "Waiting"

    runs.testbed.kubectl("patch", "dr", "waiter", "-n", runs.namespace, "--type=merge",
                         "-p", json.dumps({"spec": {"events": {"go": {"ok": True}}}}))
    runs.wait_phase("waiter", "Succeeded", timeout=90)
    assert [runs.ledger().count(f"start waiter-s{i}") for i in range(2)] == [1, 1]
    # It queued once per attempt with a pod: before the first, and again when the event woke it.
    assert reasons(runs, "waiter").count("Queued") == 2
    procs.wait_for(lambda: runs.testbed.kubectl("get", "workloads.kueue.x-k8s.io", "-n", runs.namespace,
                                                "-o", "name").stdout.strip() == "",
                   timeout=30, what="every Workload to be released")
