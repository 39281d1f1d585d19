"""A hung or partitioned runner loses its lease; the next attempt takes over; the old one is fenced."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from durablerun_testbed import procs
from tests.helpers.pods import PodRecorder, process_of, wait_pod_exit
from tests.helpers.runs import Operator, RunEnv, without_logs

pytestmark = pytest.mark.testbed
OPERATOR_PER_MODULE = True  # the tests asking for `operator` share one, each in its own namespace (conftest.py)


def test_paused_runner_is_replaced_and_then_fenced(operator: Operator, runs: RunEnv) -> None:
    pods = PodRecorder(runs.testbed, runs.namespace)
    try:
        check_paused_runner_is_replaced_and_then_fenced(runs, pods)
    finally:
        pods.stop()


def check_paused_runner_is_replaced_and_then_fenced(runs: RunEnv, pods: PodRecorder) -> None:
    runs.apply(runs.manifest("hung", "optest_flows:steps", {"steps": 8, "sleep": 0.3},
                             policy={"leaseDuration": "4s"}))
    procs.wait_for(lambda: "done s1" in runs.ledger(), timeout=60, what="step s1 to finish")
    old_pod = str(runs.get("hung")["status"]["pod"])
    node = runs.testbed.node
    assert node
    node.pause(runs.namespace, old_pod)

    # The lease expires, the epoch is bumped, and a new attempt finishes the run.
    run = runs.wait_phase("hung", "Succeeded", timeout=120)
    assert run["status"]["restarts"] == 1
    assert run["status"]["pod"] != old_pod
    assert any(e["reason"] == "LeaseExpired" for e in runs.events("hung"))
    objects_before_wakeup = runs.store_objects()
    ledger_before_wakeup = runs.ledger()

    # The old runner wakes up: it must notice it was superseded and exit Fenced. Its pod was deleted with the
    # lease, so the node forgets the process as soon as it has reported the exit: the ending is read from the
    # pod's status as a watch saw it.
    entry = process_of(runs.testbed, runs.namespace, old_pod)
    assert entry, f"the process node forgot the paused runner {old_pod}"
    node.cont(runs.namespace, old_pod)
    ending = wait_pod_exit(runs, pods, old_pod, timeout=60)
    assert ending["exitCode"] == 5, Path(entry["log"]).read_text()[-2000:]
    assert json.loads(ending["message"])["outcome"] == "Fenced"
    # It wrote nothing after waking: not one object in the store but its own attempt's logs (a folder no other
    # attempt writes, layout.py), no new step, no status change.
    assert without_logs(runs.store_objects()) == without_logs(objects_before_wakeup)
    assert not [line for line in runs.ledger()[len(ledger_before_wakeup):] if line.startswith("start")]
    assert runs.get("hung")["status"]["phase"] == "Succeeded"
    assert runs.get("hung")["status"]["epoch"] == run["status"]["epoch"]


def test_lease_is_judged_on_the_duration_its_holder_published(operator: Operator, runs: RunEnv) -> None:
    # The runner renews every 2s on the 6s it started with. Shortening the policy's leaseDuration to 1s
    # while it runs must not read as an expired lease: the holder never agreed to renew that often.
    runs.apply(runs.manifest("steady", "optest_flows:steps", {"steps": 12, "sleep": 0.5},
                             policy={"leaseDuration": "6s"}))
    procs.wait_for(lambda: runs.get("steady").get("status", {}).get("lease", {}).get("durationSeconds") == 6,
                   timeout=60, what="the runner to publish its 6s lease")
    runs.testbed.kubectl("patch", "dr", "steady", "-n", runs.namespace, "--type=merge",
                         "-p", '{"spec": {"policy": {"leaseDuration": "1s"}}}')
    run = runs.wait_phase("steady", "Succeeded", "Failed", "Aborted", timeout=90)
    assert run["status"]["phase"] == "Succeeded", run["status"].get("message")
    assert run["status"]["restarts"] == 0
    assert not [e for e in runs.events("steady") if e["reason"] == "LeaseExpired"]
    assert [runs.executions(f"s{i}") for i in range(12)] == [1] * 12
