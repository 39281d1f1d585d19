"""decide's transitions that the test bed cannot reach or time exactly (pure logic, no test bed)."""

from __future__ import annotations

import json
from datetime import timedelta
from typing import Any

from durablerun import api
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


def failed(**extra: Any) -> dict[str, Any]:
    return {"phase": "Failed", "epoch": 3, "restarts": 2, "disruptions": 1, "completionTime": at(100),
            "message": "step 'x' failed", **extra}


def test_a_changed_input_fails_the_run_before_any_pod_starts() -> None:
    # Only reachable where the API server does not refuse the change (a CRD without its rules).
    run_body = body({"phase": "Pending"}, spec={"input": {"topic": "b"}})
    plan, status = plan_for(run_body)
    assert status["phase"] == "Failed"
    assert status["message"].startswith("InputMismatch: spec.input changed after the first attempt")
    assert plan.create_pod_epoch is None


def test_retry_of_a_failed_run_starts_over_from_the_journal_with_a_new_restart_budget() -> None:
    run_body = body(failed(), annotations={api.ANNOTATION_RETRY: "1"})
    plan, status = plan_for(run_body)
    assert status["phase"] == "Pending"
    assert (status["restarts"], status["disruptions"]) == (0, 0)
    assert status["retry"] == "1"
    assert status["retryTime"] == (T0 + timedelta(seconds=200)).isoformat(timespec="microseconds")[:-6] + "Z"
    assert "completionTime" not in status
    assert [reason for _, reason, _ in plan.events] == ["Retrying"]
    assert decide.quiet_until(decide.RunView.from_body(run_body)) is None


def test_retry_acts_once_per_value_and_only_on_failed_or_aborted_runs() -> None:
    for run_body in (body(failed(retry="1"), annotations={api.ANNOTATION_RETRY: "1"}),
                     body({"phase": "Succeeded", "completionTime": at(100)},
                          annotations={api.ANNOTATION_RETRY: "1"})):
        assert plan_for(run_body)[0].empty
        assert decide.quiet_until(decide.RunView.from_body(run_body)) == decide.NEVER


def test_retry_with_the_abort_annotation_still_set_is_refused_once() -> None:
    annotations = {api.ANNOTATION_RETRY: "1", api.ANNOTATION_ABORT: "stop"}
    run_body = body({**failed(), "phase": "Aborted", "abortReason": "UserRequested"}, annotations=annotations)
    plan, status = plan_for(run_body)
    assert status["phase"] == "Aborted"
    assert status["retry"] == "1"
    assert [reason for _, reason, _ in plan.events] == ["RetryRefused"]
    assert plan_for(body({**run_body["status"], **status}, annotations=annotations))[0].empty


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
