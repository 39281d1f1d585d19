"""wakeups.next_wakeup against decide itself (pure logic, no test bed).

The operator no longer looks at every run on a fixed period: a run decide has
nothing to do for is decided again at its next wake-up, or on a watch event.
So for every settled state, decide must have nothing to do before the wake-up
and something right after it (test_quiet.py checks the same for the run's own
clock; here: the clocks pods add, and the states quiet_until leaves to
the reconciler).
"""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any

import pytest

from durablerun import api
from durablerun_operator import decide, wakeups
from durablerun_operator.decide import lifecycle
from tests.operator.clocked_runs import CLOCKED, decides_something
from tests.operator.run_bodies import POLICY, T0, at, body, runner_pod, running

STUCK = 60.0


def terminating_pod(name: str, epoch: int, deleted_at: float) -> dict[str, Any]:
    pod = runner_pod()
    pod["metadata"].update(name=name, labels={api.LABEL_RUN: "run", api.LABEL_EPOCH: str(epoch)},
                           deletionTimestamp=at(deleted_at), deletionGracePeriodSeconds=30)
    return pod


def image_pull_backoff() -> dict[str, Any]:
    pod = runner_pod()
    pod["status"]["containerStatuses"][0]["state"] = {
        "waiting": {"reason": "ImagePullBackOff", "message": "Back-off pulling image"}}
    return pod


def views(pods: list[dict[str, Any]], now: datetime) -> list[decide.PodView]:
    return [decide.PodView.from_pod(p, now, STUCK) for p in pods]


def wakeup(run_body: dict[str, Any], pods: list[dict[str, Any]], now: datetime) -> datetime:
    return wakeups.next_wakeup(decide.RunView.from_body(run_body), views(pods, now), now, STUCK)


# Settled states whose next decision the reconciler must schedule itself, and when it is due.
SETTLED = {
    "pending behind an older pod that is still terminating: it counts as lost STUCK seconds later": (
        body({"phase": "Pending", "epoch": 3, "message": "waiting for pod run-a2 to terminate before the next "
              "attempt"}), [terminating_pod("run-a2", 2, 10)], T0 + timedelta(seconds=10 + STUCK)),
    "running, its container up but the lease never acquired: one lease after the container started": (
        body(running(lease={})), [runner_pod()], T0 + timedelta(seconds=60) + decide.CLOCK_SKEW_MARGIN),
    "running, lease not acquired yet, maxDuration runs out first": (
        body(running(lease={}, attemptStartTime=at(0)), spec={"policy": {**POLICY, "maxDuration": "40s"}}),
        [runner_pod()], T0 + timedelta(seconds=40)),
    "running, its pod cannot get its image: the start timeout fails the run": (
        body(running(lease={}, attemptStartTime=at(0), reason="ImagePullBackOff",
                     message="pod run-a2 cannot start: ImagePullBackOff: Back-off pulling image")),
        [image_pull_backoff()], T0 + lifecycle.START_TIMEOUT),
}


@pytest.mark.parametrize("case", SETTLED)
def test_nothing_to_decide_before_the_wakeup_and_something_right_after(case: str) -> None:
    run_body, pods, due = SETTLED[case]
    before = due - timedelta(seconds=5)
    assert not decides_something(run_body, pods, before)
    assert wakeup(run_body, pods, before) == due
    assert decides_something(run_body, pods, due + timedelta(milliseconds=50))


@pytest.mark.parametrize("case", CLOCKED)
def test_the_runs_own_clock_is_the_wakeup_when_its_pods_have_none(case: str) -> None:
    run_body, pods, deadline = CLOCKED[case]
    assert wakeup(run_body, pods, deadline - timedelta(seconds=20)) == deadline


def test_a_terminating_pod_wakes_a_run_before_its_own_clock() -> None:
    # A Waiting run for a day, with its last pod stuck Terminating: the pod's moment comes first.
    run_body = body({"phase": "Waiting", "waitingFor": {"wakeTime": at(86400), "since": at(0)}})
    pods = [terminating_pod("run-a1", 1, 5)]
    assert wakeup(run_body, pods, T0) == T0 + timedelta(seconds=5 + STUCK)
    assert wakeups.pods_until(views(pods, T0), STUCK) == T0 + timedelta(seconds=5 + STUCK)


def test_waiting_and_suspended_runs_never_wake_by_themselves() -> None:
    # No periodic look: only their event (a watch event) or their own moments wake them.
    for status, spec in (({"phase": "Waiting", "waitingFor": {"event": "approve", "since": at(0)}}, {}),
                         ({"phase": "Suspended"}, {"suspend": True}),
                         ({"phase": "Succeeded", "completionTime": at(5)}, {})):
        assert wakeup(body(status, spec=spec), [], T0) == wakeups.NEVER


def test_a_state_without_a_known_clock_is_looked_at_again_after_the_fallback() -> None:
    # Pending with nothing in its way is never settled (decide starts it), but were it, it would not be lost.
    assert wakeup(body({"phase": "Pending"}), [], T0) == T0 + wakeups.FALLBACK


@pytest.mark.parametrize(("run_until", "pod_until", "expected"), [
    (None, T0, None),
    (T0, None, T0),
    (T0 + timedelta(seconds=5), T0, T0),
    (wakeups.NEVER, wakeups.NEVER, wakeups.NEVER),
])
def test_combine_takes_the_earlier_moment_and_none_means_now(
        run_until: datetime | None, pod_until: datetime | None, expected: datetime | None) -> None:
    assert wakeups.combine(run_until, pod_until) == expected
