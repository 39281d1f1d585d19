"""decide.quiet_until against decide itself (pure logic, no test bed).

The reconciler skips a settled run until quiet_until says its clock has run
out. That is only safe if decide really has nothing to do before then, and
only prompt if it has something to do right after: both are checked here for
every phase, on both sides of each deadline.
"""

from __future__ import annotations

from datetime import timedelta

import pytest

from durablerun import api
from durablerun_operator import decide
from tests.operator.clocked_runs import CLOCKED, decides_something
from tests.operator.run_bodies import T0, at, body, running


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
