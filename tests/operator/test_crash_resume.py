"""Pods crash, are OOM-killed, deleted, evicted or lose their node: the run resumes from its journal."""

from __future__ import annotations

import json

import pytest
from kubernetes import client

from durablerun_testbed import procs
from tests.helpers.runs import Operator, RunEnv

pytestmark = pytest.mark.testbed
OPERATOR_PER_MODULE = True  # the tests asking for `operator` share one, each in its own namespace (conftest.py)

STEPS = 6
REFERENCE = [f"S{i}" for i in range(STEPS)]  # what an uncrashed run returns


def start_and_wait_for_step(runs: RunEnv, name: str, next_step: str, **policy: object) -> str:
    """Applies the run and waits until ``next_step`` starts: every step before it is journaled then (its
    own "done" line comes before its journal write, and a crash between the two rightly runs it again)."""
    runs.apply(runs.manifest(name, "optest_flows:steps", {"steps": STEPS, "sleep": 0.4}, policy=dict(policy)))
    procs.wait_for(lambda: f"start {next_step}" in runs.ledger(), timeout=60, what=f"step {next_step} to start")
    return str(runs.get(name)["status"]["pod"])


def assert_resumed_without_redoing(runs: RunEnv, completed_before: int) -> None:
    ledger = runs.ledger()
    assert f"result {json.dumps(REFERENCE)}" in ledger, ledger
    counts = [runs.executions(f"s{i}") for i in range(STEPS)]
    assert counts[:completed_before] == [1] * completed_before, f"a completed step ran again: {counts}"
    assert sum(counts) <= STEPS + 1, f"more than the one in-flight step ran twice: {counts}"


def reasons(runs: RunEnv, name: str) -> list[str]:
    return [f"{e['reason']}: {e['message']}" for e in runs.events(name)]


@pytest.mark.parametrize("how", ["sigkill", "oom"])
def test_crash_resumes_in_a_new_pod(operator: Operator, runs: RunEnv, how: str) -> None:
    pod = start_and_wait_for_step(runs, "crash", "s2")
    assert runs.testbed.node
    (runs.testbed.node.kill if how == "sigkill" else runs.testbed.node.oom)(runs.namespace, pod)
    run = runs.wait_phase("crash", "Succeeded", timeout=90)
    assert run["status"]["restarts"] == 1
    assert run["status"]["disruptions"] == 0
    assert run["status"]["attempt"] == 2
    assert run["status"]["pod"] != pod
    assert_resumed_without_redoing(runs, completed_before=2)
    if how == "sigkill":
        assert any("Restarting: Crash" in r and "exit code 137" in r for r in reasons(runs, "crash"))
    else:
        assert any("OOMKilled" in r and "limits.memory" in r for r in reasons(runs, "crash"))


@pytest.mark.parametrize("how", ["pod-deleted", "node-lost", "evicted"])
def test_disruptions_do_not_consume_max_restarts(operator: Operator, runs: RunEnv, how: str) -> None:
    # s2 runs until released, so the disruption lands while the attempt is at work (a timed run could finish
    # first on a loaded machine, and the run would succeed with no disruption to count).
    runs.apply(runs.manifest("disrupted", "optest_flows:steps", {"steps": STEPS, "sleep": 0.4, "hold": "s2"},
                             policy={"maxRestarts": 0}))
    procs.wait_for(lambda: "start s2" in runs.ledger(), timeout=60, what="step s2 to start")
    pod = str(runs.get("disrupted")["status"]["pod"])
    assert runs.testbed.node
    if how == "pod-deleted":
        runs.testbed.kubectl("delete", "pod", pod, "-n", runs.namespace, "--wait=false")
    elif how == "node-lost":
        runs.testbed.node.lose(runs.namespace, pod)
    else:
        core = client.CoreV1Api(runs.testbed.api_client())
        core.create_namespaced_pod_eviction(pod, runs.namespace, client.V1Eviction(
            metadata=client.V1ObjectMeta(name=pod, namespace=runs.namespace)))
    if how != "node-lost":  # released before its SIGTERM, the runner could finish every step first
        runs.wait_stop_requested(pod)
    (runs.ledger_dir / "release-s2").touch()
    run = runs.wait_phase("disrupted", "Succeeded", timeout=90)
    assert run["status"]["restarts"] == 0
    assert run["status"]["disruptions"] == 1
    expected = {"pod-deleted": "PodDeleted", "node-lost": "NodeLost", "evicted": "Evicted"}[how]
    assert any(r.startswith(f"Restarting: {expected}") for r in reasons(runs, "disrupted")), reasons(runs, "disrupted")
    assert_resumed_without_redoing(runs, completed_before=2)


def test_restarts_exhausted_abort_the_run(operator: Operator, runs: RunEnv) -> None:
    runs.apply(runs.manifest("doomed", "optest_flows:crasher", policy={"maxRestarts": 1}))
    run = runs.wait_phase("doomed", "Aborted", timeout=90)
    assert run["status"]["abortReason"] == "RetryLimitExceeded"
    assert run["status"]["restarts"] == 2
    assert runs.executions("ok") == 1, "a completed step ran again after a crash"
    assert runs.executions("boom") == 2
    assert "maxRestarts=1" in run["status"]["message"]
    conditions = {c["type"]: c for c in run["status"]["conditions"]}
    assert conditions["Failed"]["status"] == "True"
    assert conditions["Failed"]["reason"] == "RetryLimitExceeded"
