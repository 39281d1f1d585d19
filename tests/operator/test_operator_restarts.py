"""The operator keeps no state a restart would lose, and two operators at once still make one pod per epoch."""

from __future__ import annotations

import signal

import pytest

from durablerun_testbed import procs
from tests.helpers.runs import RunEnv, StartOperator

pytestmark = pytest.mark.testbed


def attempts_started(runs: RunEnv, name: str) -> list[str]:
    return [e["message"] for e in runs.events(name) if e["reason"] == "AttemptStarted"]


def assert_one_pod_per_epoch(runs: RunEnv, name: str) -> None:
    run = runs.get(name)
    started = attempts_started(runs, name)
    assert len(started) == run["status"]["attempt"], started
    epochs = [m.split("(epoch ")[1].split(")")[0] for m in started]
    assert len(epochs) == len(set(epochs)), f"an epoch was started twice: {started}"


@pytest.mark.parametrize("moment", ["before-first-pod", "mid-run", "during-backoff"])
def test_operator_killed_and_restarted(start_operator: StartOperator, runs: RunEnv, moment: str) -> None:
    operator = start_operator("operator-1")
    node = runs.testbed.node
    assert node
    if moment == "before-first-pod":
        operator.process.signal_group(signal.SIGKILL)
        runs.apply(runs.manifest("survivor", "optest_flows:steps", {"steps": 4, "sleep": 0.3}))
    else:
        # s1 runs until released: the pod is mid-run when it or the operator is killed, however slow the machine.
        runs.apply(runs.manifest("survivor", "optest_flows:steps", {"steps": 4, "sleep": 0.3, "hold": "s1"},
                                 policy={"backoff": {"initial": "3s", "max": "3s"}}))
        procs.wait_for(lambda: "start s1" in runs.ledger(), timeout=60, what="step s1")
        if moment == "during-backoff":
            node.kill(runs.namespace, runs.get("survivor")["status"]["pod"])
            runs.wait_phase("survivor", "Backoff", timeout=30)
        operator.process.signal_group(signal.SIGKILL)
        (runs.ledger_dir / "release-s1").touch()
    operator.process.popen.wait(10)

    start_operator("operator-2")
    run = runs.wait_phase("survivor", "Succeeded", timeout=90)
    assert run["status"]["restarts"] == (1 if moment == "during-backoff" else 0)
    assert_one_pod_per_epoch(runs, "survivor")
    assert [runs.executions(f"s{i}") for i in range(4)][:1] == [1]


def test_two_operators_at_once(start_operator: StartOperator, runs: RunEnv) -> None:
    start_operator("operator-a")
    start_operator("operator-b")
    names = [f"twin-{i}" for i in range(3)]
    for name in names:
        runs.apply(runs.manifest(name, "optest_flows:steps", {"steps": 4, "sleep": 0.3}))
    node = runs.testbed.node
    assert node
    procs.wait_for(lambda: runs.ledger().count("done s1") >= 1, timeout=60, what="some progress")
    victim = runs.get(names[0])["status"]["pod"]
    node.kill(runs.namespace, victim)
    for name in names:
        runs.wait_phase(name, "Succeeded", timeout=120)
        assert_one_pod_per_epoch(runs, name)
    assert runs.get(names[0])["status"]["restarts"] == 1
