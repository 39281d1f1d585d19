"""Settled runs (the operator has done everything it can) and the moment their clock runs out, and whether decide
has something to do: the cases of quiet_until's tests (test_quiet.py) and of the reconciler's wake-ups
(test_wakeups.py)."""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any

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
