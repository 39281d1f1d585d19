"""Budgets, human events, suspend and bad input, driven with kubectl as a user would."""

from __future__ import annotations

import json
import threading
from datetime import UTC, datetime, timedelta

import pytest

from durablerun import api
from durablerun_testbed import procs
from tests.helpers.runs import Operator, RunEnv

pytestmark = pytest.mark.testbed
OPERATOR_PER_MODULE = True  # the tests asking for `operator` share one, each in its own namespace (conftest.py)


def live_pods(runs: RunEnv, name: str) -> list[str]:
    return [p["metadata"]["name"] for p in runs.pods(name)
            if p["status"].get("phase") in ("Pending", "Running") and not p["metadata"].get("deletionTimestamp")]


def test_cost_ceiling_aborts_and_raising_it_resumes(operator: Operator, runs: RunEnv) -> None:
    runs.apply(runs.manifest("budget", "optest_flows:steps", {"steps": 5, "sleep": 0.05, "usd": "0.10"},
                             policy={"costCeilingUSD": "0.25"}))
    run = runs.wait_phase("budget", "Aborted", timeout=60)
    assert run["status"]["abortReason"] == "BudgetExhausted"
    assert run["status"]["cost"]["usd"] == "0.30"
    # The advice is kubectl's, not the local CLI's flags.
    assert f"kubectl patch dr budget -n {runs.namespace} --type merge -p" in run["status"]["message"]
    assert "--max-cost" not in run["status"]["message"]
    done_before = [runs.executions(f"s{i}") for i in range(5)]
    assert done_before == [1, 1, 1, 0, 0]
    row = runs.testbed.kubectl("get", "dr", "budget", "-n", runs.namespace, "-o", "wide").stdout.splitlines()[1]
    assert "BudgetExhausted" in row.split()

    runs.testbed.kubectl("patch", "dr", "budget", "-n", runs.namespace, "--type=merge",
                         "-p", '{"spec": {"policy": {"costCeilingUSD": "10"}}}')
    run = runs.wait_phase("budget", "Succeeded", timeout=60)
    assert [runs.executions(f"s{i}") for i in range(5)] == [1] * 5
    assert run["status"]["cost"]["usd"] == "0.50"


def test_the_step_column_shows_the_last_step_of_a_finished_run(operator: Operator, runs: RunEnv) -> None:
    # Steps faster than the runner's status flushes: the last ones reach the status only with the outcome.
    runs.apply(runs.manifest("quick", "optest_flows:steps", {"steps": 5, "sleep": 0.05}))
    runs.apply(runs.manifest("capped", "optest_flows:steps", {"steps": 5, "sleep": 0.05, "usd": "0.10"},
                             policy={"costCeilingUSD": "0.25"}))
    assert runs.wait_phase("quick", "Succeeded", timeout=60)["status"]["progress"]["stepName"] == "s4"
    assert runs.wait_phase("capped", "Aborted", timeout=60)["status"]["progress"]["stepName"] == "s2"
    table = runs.testbed.kubectl("get", "dr", "quick", "capped", "-n", runs.namespace).stdout.splitlines()
    header = table[0].split()
    rows = {row.split()[0]: row.split() for row in table[1:]}
    assert rows["quick"][header.index("STEP")] == "s4"
    assert rows["capped"][header.index("STEP")] == "s2"


def test_human_event_wakes_a_waiting_run_with_no_pod(operator: Operator, runs: RunEnv) -> None:
    runs.apply(runs.manifest("review", "optest_flows:approval"))
    run = runs.wait_phase("review", "Waiting", timeout=60)
    assert run["status"]["waitingFor"]["event"] == "review"
    procs.wait_for(lambda: not live_pods(runs, "review"), timeout=30, what="no pod while waiting")

    runs.testbed.kubectl("patch", "dr", "review", "-n", runs.namespace, "--type=merge",
                         "-p", '{"spec": {"events": {"review": {"status": "approved"}}}}')
    runs.wait_phase("review", "Succeeded", timeout=60)
    assert 'decision {"status": "approved"}' in runs.ledger()
    assert runs.executions("draft") == 1
    assert runs.executions("publish") == 1


def test_event_sent_while_the_runner_decides_to_wait_is_not_lost(operator: Operator, runs: RunEnv) -> None:
    names = [f"race-{i}" for i in range(3)]
    for name in names:
        runs.apply(runs.manifest(name, "optest_flows:approval"))

    def approve_when_drafted(name: str) -> None:
        # The moment the draft step finishes, the runner is deciding whether to wait.
        procs.wait_for(lambda: runs.get(name).get("status", {}).get("progress", {}).get("completedSteps", 0) >= 1
                       or "done draft" in runs.ledger(), timeout=60, interval=0.01, what="the draft")
        runs.testbed.kubectl("patch", "dr", name, "-n", runs.namespace, "--type=merge",
                             "-p", json.dumps({"spec": {"events": {"review": {"by": name}}}}))

    threads = [threading.Thread(target=approve_when_drafted, args=(n,)) for n in names]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    for name in names:
        runs.wait_phase(name, "Succeeded", timeout=60)
        assert f'decision {{"by": "{name}"}}' in runs.ledger()


def test_a_wait_longer_than_max_duration_does_not_abort_the_run(operator: Operator, runs: RunEnv) -> None:
    # maxDuration counts the time the run has a pod; a human may take longer than that to answer.
    runs.apply(runs.manifest("patient", "optest_flows:approval", policy={"maxDuration": "12s"}))
    run = runs.wait_phase("patient", "Waiting", timeout=60)
    started = datetime.fromisoformat(run["status"]["startTime"])
    procs.wait_for(lambda: datetime.now(UTC) > started + timedelta(seconds=15), timeout=60,
                   what="15s since the first start, past maxDuration")
    assert runs.get("patient")["status"]["phase"] == "Waiting"
    runs.testbed.kubectl("patch", "dr", "patient", "-n", runs.namespace, "--type=merge",
                         "-p", '{"spec": {"events": {"review": {"ok": true}}}}')
    run = runs.wait_phase("patient", "Succeeded", "Aborted", "Failed", timeout=60)
    assert run["status"]["phase"] == "Succeeded", run["status"].get("message")
    assert 0 < run["status"]["activeSeconds"] < 12
    assert runs.executions("publish") == 1


def test_first_event_value_wins(operator: Operator, runs: RunEnv) -> None:
    # Two answers one after the other while the run waits with no pod: the second is refused, so the
    # workflow sees the first, however soon the next attempt starts.
    runs.apply(runs.manifest("first", "optest_flows:approval"))
    runs.wait_phase("first", "Waiting", timeout=60)
    runs.testbed.kubectl("patch", "dr", "first", "-n", runs.namespace, "--type=merge",
                         "-p", '{"spec": {"events": {"review": {"v": 1}}}}')
    second = runs.testbed.kubectl("patch", "dr", "first", "-n", runs.namespace, "--type=merge",
                                  "-p", '{"spec": {"events": {"review": {"v": 2}}}}', check=False)
    assert second.returncode != 0
    assert "an event already set cannot be changed" in second.stderr, second.stderr
    runs.wait_phase("first", "Succeeded", timeout=60)
    assert 'decision {"v": 1}' in runs.ledger()


def test_suspend_and_resume(operator: Operator, runs: RunEnv) -> None:
    runs.apply(runs.manifest("pausable", "optest_flows:steps", {"steps": 6, "sleep": 0.5, "hold": "s2"}))
    procs.wait_for(lambda: "start s2" in runs.ledger(), timeout=60, what="step s2")
    runs.testbed.kubectl("patch", "dr", "pausable", "-n", runs.namespace, "--type=merge",
                         "-p", '{"spec": {"suspend": true}}')
    asked = api.now()
    # A renewal after the patch hands the runner the spec (its answer is the run): only then is s2 let go, so
    # the suspension meets a step in flight however slow the machine (s3-s5 take 1.5 s).
    procs.wait_for(lambda: api.parse_time(runs.get("pausable")["status"]["lease"].get("renewTime")) > asked,
                   timeout=30, what="a lease renewal after spec.suspend was set")
    (runs.ledger_dir / "release-s2").touch()
    run = runs.wait_phase("pausable", "Suspended", timeout=60)
    procs.wait_for(lambda: not live_pods(runs, "pausable"), timeout=30, what="no pod while suspended")
    assert run["status"]["restarts"] == 0
    runs.testbed.kubectl("patch", "dr", "pausable", "-n", runs.namespace, "--type=merge",
                         "-p", '{"spec": {"suspend": false}}')
    runs.wait_phase("pausable", "Succeeded", timeout=60)
    # Suspension waits for the running step: nothing runs twice.
    assert [runs.executions(f"s{i}") for i in range(6)] == [1] * 6


@pytest.mark.parametrize(("stop_grace", "s1_runs"), [(None, 1), ("0s", 2)], ids=["default grace", "stopGracePeriod 0s"])
def test_a_pod_deleted_mid_step_lets_its_step_finish_within_the_stop_grace(
        operator: Operator, runs: RunEnv, stop_grace: str | None, s1_runs: int) -> None:
    """A pod deleted under its runner (a drain, an eviction, someone's kubectl delete) gets SIGTERM: the step in
    flight finishes within policy.stopGracePeriod and is journaled, and the run resumes after it (a disruption);
    with 0s it is cancelled and runs again."""
    policy = {} if stop_grace is None else {"stopGracePeriod": stop_grace}
    manifest = runs.manifest("drained", "optest_flows:steps", {"steps": 3, "sleep": 0.2, "hold": "s1"}, policy=policy)
    del manifest["spec"]["template"]["spec"]["terminationGracePeriodSeconds"]  # the default's 30 s
    runs.apply(manifest)
    procs.wait_for(lambda: "start s1" in runs.ledger(), timeout=60, what="step s1")
    pod = runs.get("drained")["status"]["pod"]
    runs.testbed.kubectl("delete", "pod", pod, "-n", runs.namespace, "--wait=false")

    said = runs.wait_stop_requested(pod)  # it took the SIGTERM while s1 was held
    assert f"the steps in flight get {stop_grace or '20s'} to finish" in said
    (runs.ledger_dir / "release-s1").touch()
    done = runs.wait_phase("drained", "Succeeded", timeout=90)["status"]
    assert (done["disruptions"], done.get("restarts", 0)) == (1, 0)
    assert [runs.executions(f"s{i}") for i in range(3)] == [1, s1_runs, 1]


def test_unknown_workflow_fails_once_with_a_clear_message(operator: Operator, runs: RunEnv) -> None:
    runs.apply(runs.manifest("typo", "optest_flows:no_such_flow"))
    run = runs.wait_phase("typo", "Failed", timeout=60)
    assert run["status"]["restarts"] == 0
    assert run["status"]["attempt"] == 1
    assert "no_such_flow" in run["status"]["message"]


def test_durable_sleep_holds_no_pod_and_wakes_at_its_time(operator: Operator, runs: RunEnv) -> None:
    manifest = runs.manifest("napper", "optest_flows:sleeper", {"seconds": 6})
    manifest["spec"]["template"]["spec"]["containers"][0]["env"].append(
        {"name": api.Env.INLINE_SLEEP_MAX_SECONDS, "value": "1"})
    runs.apply(manifest)
    run = runs.wait_phase("napper", "Waiting", timeout=60)
    assert run["status"]["waitingFor"]["wakeTime"]
    procs.wait_for(lambda: not live_pods(runs, "napper"), timeout=30, what="no pod while sleeping")
    runs.wait_phase("napper", "Succeeded", timeout=60)
    assert runs.executions("before") == 1
    assert runs.executions("after") == 1


def test_progress_timeout_aborts_a_hung_runner(operator: Operator, runs: RunEnv) -> None:
    # The lease is long, so only the operator's own progress check can catch this hang.
    runs.apply(runs.manifest("stalled", "optest_flows:steps", {"steps": 5, "sleep": 0.3},
                             policy={"leaseDuration": "120s", "progressTimeout": "4s"}))
    procs.wait_for(lambda: "done s0" in runs.ledger(), timeout=60, what="step s0")
    pod = runs.get("stalled")["status"]["pod"]
    assert runs.testbed.node
    runs.testbed.node.pause(runs.namespace, pod)
    try:
        run = runs.wait_phase("stalled", "Aborted", timeout=60)
    finally:
        runs.testbed.node.cont(runs.namespace, pod)
    assert run["status"]["abortReason"] == "ProgressTimeout"
    assert "progressTimeout=4s" in run["status"]["message"]
    procs.wait_for(lambda: not live_pods(runs, "stalled"), timeout=60, what="the hung pod to be gone")
