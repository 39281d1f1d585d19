"""decide.quiet_until against decide itself (pure logic, no test bed).

The reconciler skips a settled run until quiet_until says its clock has run
out. That is only safe if decide really has nothing to do before then, and
only prompt if it has something to do right after: both are checked here for
every phase, on both sides of each deadline.
"""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any

import pytest

from durablerun import api
from durablerun_operator import decide
from tests.operator.run_bodies import POLICY, T0, at, body, runner_pod, running


def decides_something(run_body: dict[str, Any], pods: list[dict[str, Any]], now: datetime) -> bool:
    views = [decide.PodView.from_pod(p, now, 60.0) for p in pods]
    return not decide.decide(decide.RunView.from_body(run_body), views, now).empty


# Settled runs (the operator has done everything it can) and the moment their clock runs out.
CLOCKED = {
    "running: the lease runs out first": (
        body(running()), [runner_pod()], T0 + timedelta(seconds=160) + decide.CLOCK_SKEW_MARGIN),
    "running: the lease runs out on the duration its holder published": (
        body(running(lease={"holder": "run-a2", "epoch": 2, "acquireTime": at(0), "renewTime": at(100),
                            "durationSeconds": 30})),
        [runner_pod()], T0 + timedelta(seconds=130) + decide.CLOCK_SKEW_MARGIN),
    "running: the progress timeout runs out first": (
        body(running(progress={"lastProgressTime": at(0)}), spec={"policy": {**POLICY, "progressTimeout": "2m"}}),
        [runner_pod()], T0 + timedelta(seconds=120)),
    "running: maxDuration runs out first": (
        body(running(), spec={"policy": {**POLICY, "maxDuration": "150s"}}), [runner_pod()],
        T0 + timedelta(seconds=150)),
    "running, aborting: the runner's grace runs out first (not the maxDuration it aborts for)": (
        body(running(aborting={"reason": "MaxDurationExceeded", "message": "m", "deadline": at(130)}),
             spec={"policy": {**POLICY, "maxDuration": "100s"}}),
        [runner_pod()], T0 + timedelta(seconds=130)),
    "running, aborting on request: the grace runs out first": (
        body(running(aborting={"reason": "UserRequested", "message": "m", "deadline": at(130)}),
             annotations={api.ANNOTATION_ABORT: "stop"}),
        [runner_pod()], T0 + timedelta(seconds=130)),
    "backoff": (body({"phase": "Backoff", "nextAttemptTime": at(30)}), [], T0 + timedelta(seconds=30)),
    "waiting for a wake time": (
        body({"phase": "Waiting", "waitingFor": {"wakeTime": at(600), "since": at(0)}}), [],
        T0 + timedelta(seconds=600)),
    "waiting for an event with a deadline": (
        body({"phase": "Waiting", "waitingFor": {"event": "approve", "deadline": at(900), "since": at(0)}}), [],
        T0 + timedelta(seconds=900)),
    "running: maxDuration runs out, counting earlier attempts' time": (
        body(running(activeSeconds=100), spec={"policy": {**POLICY, "maxDuration": "150s"}}), [runner_pod()],
        T0 + timedelta(seconds=50)),
    "finished with a TTL": (
        body({"phase": "Succeeded", "completionTime": at(50)}, spec={"ttlSecondsAfterFinished": 100}), [],
        T0 + timedelta(seconds=150)),
}


@pytest.mark.parametrize("case", CLOCKED)
def test_nothing_to_decide_before_the_deadline_and_something_right_after(case: str) -> None:
    run_body, pods, deadline = CLOCKED[case]
    assert decide.quiet_until(decide.RunView.from_body(run_body)) == deadline
    for before in (deadline - timedelta(seconds=20), deadline - timedelta(milliseconds=1)):
        assert not decides_something(run_body, pods, before), before
    assert decides_something(run_body, pods, deadline + timedelta(milliseconds=50))


def test_runs_with_nothing_on_the_clock_are_quiet_forever() -> None:
    # maxDuration counts time with a pod: a suspended or waiting run has nothing on the clock.
    for status, spec in (({"phase": "Succeeded", "completionTime": at(50)}, {}),
                         ({"phase": "Waiting", "waitingFor": {"event": "approve", "since": at(0)}}, {}),
                         ({"phase": "Suspended", "activeSeconds": 7000}, {"suspend": True})):
        run = decide.RunView.from_body(body(status, spec=spec))
        assert decide.quiet_until(run) == decide.NEVER
        assert not decides_something(run.body, [], T0 + timedelta(days=365))


# Runs decide must look at now, whatever the clock says.
ACT_NOW = {
    "being deleted": body(running(), deleting=True),
    "without the operator's finalizer": body(running(), finalizers=()),
    "with an abort request": body(running(), annotations={api.ANNOTATION_ABORT: "stop"}),
    "pending": body({"phase": "Pending"}),
    "waiting after an attempt that was aborting": body(
        {"phase": "Waiting", "waitingFor": {"event": "approve", "since": at(0)},
         "aborting": {"reason": "UserRequested", "message": "m", "deadline": at(900)}}),
    "new": {**body({}), "status": None},
    "running, lease not yet acquired": body(running(lease={})),
    "waiting, its event arrived": body({"phase": "Waiting", "waitingFor": {"event": "approve", "since": at(0)}},
                                       spec={"events": {"approve": True}}),
    "suspended, spec.suspend lifted": body({"phase": "Suspended"}),
    "backoff, spec.suspend set": body({"phase": "Backoff", "nextAttemptTime": at(30)}, spec={"suspend": True}),
    "aborted, spec changed since": body({"phase": "Aborted", "abortReason": "BudgetExhausted",
                                         "completionTime": at(50), "observedGeneration": 2}, generation=3),
}


@pytest.mark.parametrize("case", ACT_NOW)
def test_runs_that_need_a_decision_now_are_never_quiet(case: str) -> None:
    run_body = ACT_NOW[case]
    if run_body["status"] is None:
        del run_body["status"]
    assert decide.quiet_until(decide.RunView.from_body(run_body)) is None
