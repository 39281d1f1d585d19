"""decide's transitions that the test bed cannot reach or time exactly (pure logic, no test bed)."""

from __future__ import annotations

import json
from datetime import timedelta
from typing import Any

from durablerun_operator import decide
from tests.operator.test_quiet import T0, at, body, runner_pod, running


def plan_for(run_body: dict[str, Any], pods: list[dict[str, Any]] | None = None,
             seconds: float = 200) -> tuple[decide.Plan, dict[str, Any]]:
    """The plan at T0 + ``seconds``, and the status it writes (the whole new status)."""
    now = T0 + timedelta(seconds=seconds)
    views = [decide.PodView.from_pod(p, now, 60.0) for p in pods or []]
    plan = decide.decide(decide.RunView.from_body(run_body), views, now)
    status = dict(run_body["status"])
    for op in plan.patch:
        if op["op"] == "add":
            status[op["path"].split("/")[-1]] = op["value"]
        elif op["op"] == "remove":
            status.pop(op["path"].split("/")[-1])
    return plan, status


def test_a_changed_input_fails_the_run_before_any_pod_starts() -> None:
    # Only reachable where the API server does not refuse the change (a CRD without its rules).
    run_body = body({"phase": "Pending"}, spec={"input": {"topic": "b"}})
    plan, status = plan_for(run_body)
    assert status["phase"] == "Failed"
    assert status["message"].startswith("InputMismatch: spec.input changed after the first attempt")
    assert plan.create_pod_epoch is None


def test_an_attempt_adds_its_time_with_a_pod_to_active_seconds() -> None:
    # Started at T0 (attemptStartTime), its pod ended at T0+150 waiting for an event; 40s from earlier attempts.
    pod = runner_pod()
    pod["status"] = {"phase": "Failed", "containerStatuses": [{"name": "runner", "state": {"terminated": {
        "exitCode": 4, "finishedAt": at(150),
        "message": json.dumps({"outcome": "Waiting", "message": "waiting", "waitingFor": {"event": "go"}})}}}]}
    run_body = body(running(attemptStartTime=at(0), activeSeconds=40))
    _, status = plan_for(run_body, [pod], seconds=400)
    assert status["phase"] == "Waiting"
    assert status["activeSeconds"] == 190
    assert "attemptStartTime" not in status
