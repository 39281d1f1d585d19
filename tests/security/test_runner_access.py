"""A run started when every run had its own ServiceAccount keeps running after the operator moves to the
namespace's runner account (docs/install.md, "Each runner"): its pod, with its per-run token, still renews
through the runner-status policy, and its next attempt runs as the namespace's account."""

from __future__ import annotations

import pytest

from durablerun import api
from durablerun_testbed import procs
from tests.helpers.runs import RunEnv, StartOperator

pytestmark = pytest.mark.testbed


def service_account(runs: RunEnv, pod: str) -> str:
    return str(next(p for p in runs.pods("old") if p["metadata"]["name"] == pod)["spec"]["serviceAccountName"])


def test_a_per_run_runner_keeps_working_when_access_moves_to_the_namespace(
    start_operator: StartOperator, runs: RunEnv
) -> None:
    before = start_operator("per-run", **{api.OperatorEnv.RUNNER_ACCESS: api.RUNNER_ACCESS_RUN})
    runs.apply(runs.manifest("old", "optest_flows:steps", {"steps": 3, "sleep": 0.2, "hold": "s1"}))
    procs.wait_for(lambda: "start s1" in runs.ledger(), timeout=60, what="step s1 of attempt 1")
    first = runs.get("old")["status"]["pod"]
    assert service_account(runs, first) == api.runner_account("old")
    before.stop()

    start_operator("namespace")
    # Attempt 1's renewals, with its per-run token, still pass: its lease is renewed after the switch.
    renewed = runs.get("old")["status"]["lease"]["renewTime"]
    procs.wait_for(lambda: runs.get("old")["status"]["lease"]["renewTime"] != renewed, timeout=30,
                   what="attempt 1 renewing its lease under the new operator")
    assert runs.get("old")["status"]["pod"] == first

    # Its next attempt runs as the namespace's account, resumes after s0 and finishes.
    node = runs.testbed.node
    assert node
    node.kill(runs.namespace, first)
    procs.wait_for(lambda: runs.get("old")["status"].get("pod") not in (None, first), timeout=60,
                   what="attempt 2's pod")
    second = runs.get("old")["status"]["pod"]
    procs.wait_for(lambda: any(p["metadata"]["name"] == second for p in runs.pods("old")), timeout=30,
                   what=f"pod {second}")
    assert service_account(runs, second) == api.RUNNER_ACCOUNT
    procs.wait_for(lambda: runs.ledger().count("start s1") == 2, timeout=60, what="step s1 of attempt 2")
    (runs.ledger_dir / "release-s1").touch()
    run = runs.wait_phase("old", "Succeeded", timeout=60)
    assert run["status"]["restarts"] == 1
    assert [runs.executions(f"s{i}") for i in range(3)] == [1, 2, 1]
