"""decide() as the pure function it is: every transition on plain dicts (no test bed).

TRANSITIONS is the table of every way a run moves (admit, start, crash ->
backoff -> RetryLimitExceeded, OOM, lease expiry, each disruption, wait and
wake, suspend and resume, abort and resume on a raised limit, retry, TTL);
the test bed's tests (test_crash_resume, test_lease, test_policy_and_waits,
test_retry, test_deletion) prove the same transitions end to end. The tests
after the table cover what the test bed cannot reach or time exactly.
"""

from __future__ import annotations

import json
from datetime import timedelta
from typing import Any

import pytest

from durablerun import api, resource
from durablerun_operator import decide
from tests.operator.run_bodies import POLICY, T0, apply, at, body, ended, plan_for, runner_pod, running, waiting_report


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


def test_retry_acts_once_per_value_and_only_on_finished_runs() -> None:
    for run_body in (body(failed(retry="1"), annotations={api.ANNOTATION_RETRY: "1"}),
                     body({"phase": "Succeeded", "completionTime": at(100), "retry": "1"},
                          annotations={api.ANNOTATION_RETRY: "1"})):
        assert plan_for(run_body)[0].empty
        assert decide.quiet_until(decide.RunView.from_body(run_body)) == decide.NEVER
    # A Succeeded run is retried too: `kubectl durablerun rerun` cut its journal back first.
    rerun = body({"phase": "Succeeded", "completionTime": at(100)}, annotations={api.ANNOTATION_RETRY: "2"})
    status = plan_for(rerun)[1]
    assert (status["phase"], status["retry"]) == ("Pending", "2")


def test_a_retry_asked_while_the_run_is_active_is_seen_and_not_acted_on_once_it_ends() -> None:
    # retry clicked twice: the first value started the attempt, the second arrives while it runs.
    active = body(running(retry="1"), annotations={api.ANNOTATION_RETRY: "2"})
    plan, status = plan_for(active, [runner_pod()], seconds=120)
    assert (status["phase"], status["retry"]) == ("Running", "2")
    assert [reason for _, reason, _ in plan.events] == ["RetryIgnored"]
    ended = body({"phase": "Succeeded", "completionTime": at(100), "retry": status["retry"]},
                 annotations={api.ANNOTATION_RETRY: "2"})
    assert plan_for(ended)[0].empty
    # While an abort is being carried out the retry waits for the Aborted run.
    aborting = {"reason": "UserRequested", "message": "stop", "deadline": at(400)}
    in_grace = body(running(retry="1", aborting=aborting), annotations={api.ANNOTATION_RETRY: "2"})
    assert plan_for(in_grace, [runner_pod()], seconds=120)[1].get("retry") == "1"


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


def starting() -> dict[str, Any]:
    """Running, its pod not created yet (the create failed): no lease for this epoch."""
    return running(lease={}, attemptStartTime=at(190))


@pytest.mark.parametrize("failure_epoch", [None, 1])
def test_a_running_run_without_its_pod_creates_it_again(failure_epoch: int | None) -> None:
    # No failure seen, or one of an older attempt: the create was interrupted, so it is made again, once the API
    # server has confirmed the run is still at that attempt (a patch of tests alone: test_stale_decider.py).
    failure = decide.CreateFailure(f"run-a{failure_epoch}", "quota", permanent=True) if failure_epoch else None
    plan = decide.decide(decide.RunView.from_body(body(starting())), [], T0 + timedelta(seconds=200),
                         create_failure=failure)
    assert plan.create_pod_epoch == 2
    assert plan.patch == [{"op": "test", "path": "/status/epoch", "value": 2},
                          {"op": "test", "path": "/status/phase", "value": "Running"}]


def test_a_pod_that_cannot_be_created_fails_the_run_with_an_event_and_a_condition() -> None:
    failure = decide.CreateFailure("run-a2", 'Pod "run-a2" is invalid: spec.containers[0].name: Invalid value', True)
    run_body = body(starting())
    plan = decide.decide(decide.RunView.from_body(run_body), [], T0 + timedelta(seconds=200), create_failure=failure)
    status = apply(run_body, plan)
    assert status["phase"] == "Failed"
    assert status["epoch"] == 3  # a retry starts a new attempt, with a new pod name
    assert status["message"].startswith('FailedCreate: pod run-a2 could not be created: Pod "run-a2" is invalid')
    assert "kubectl durablerun retry run" in status["message"]
    conditions = {c["type"]: c for c in status["conditions"]}
    assert conditions["Failed"]["status"] == "True"
    assert "FailedCreate" in conditions["Failed"]["message"]
    assert ("Warning", "FailedCreate") in [(kind, reason) for kind, reason, _ in plan.events]
    assert plan.completion == "Failed"
    assert plan.create_pod_epoch is None


def test_a_pod_creation_that_may_pass_is_a_restart_bounded_by_max_restarts() -> None:
    failure = decide.CreateFailure("run-a2", "exceeded quota: pods=1", False)
    run_body = body(starting())
    plan = decide.decide(decide.RunView.from_body(run_body), [], T0 + timedelta(seconds=200), create_failure=failure)
    status = apply(run_body, plan)
    assert (status["phase"], status["restarts"], status["epoch"]) == ("Backoff", 1, 3)
    assert status["message"].startswith("FailedCreate: pod run-a2 could not be created: exceeded quota")
    assert ("Warning", "FailedCreate") in [(kind, reason) for kind, reason, _ in plan.events]
    exhausted = body({**starting(), "restarts": 3})
    plan = decide.decide(decide.RunView.from_body(exhausted), [], T0 + timedelta(seconds=200),
                         create_failure=failure)
    status = apply(exhausted, plan)
    assert (status["phase"], status["abortReason"]) == ("Aborted", "RetryLimitExceeded")


# --- the table -------------------------------------------------------------------------

ABSENT = object()  # in an expected status: the field must not be there
MAX_DURATION_ABORTING = {"reason": "MaxDurationExceeded", "message": "over maxDuration", "deadline": at(150)}


class _AnyText(str):
    def __eq__(self, other: object) -> bool:
        return isinstance(other, str) and bool(other)

    __hash__ = str.__hash__


ANY_TEXT = _AnyText("any text")


def lost_pod(by: str, grace: int) -> dict[str, Any]:
    """The current attempt's pod deleted (``by``) while running on a node that is gone and reports nothing."""
    pod = runner_pod()
    pod["metadata"].update(deletionTimestamp=at(105), deletionGracePeriodSeconds=grace)
    pod["status"]["conditions"] = [{"type": "DisruptionTarget", "status": "True", "reason": by}]
    return pod


def old_pod() -> dict[str, Any]:
    """A pod of the previous attempt (epoch 1), still running."""
    pod = runner_pod()
    pod["metadata"].update(name="run-a1", uid="p0", labels={api.LABEL_RUN: "run", api.LABEL_EPOCH: "1"})
    return pod


EVICTED = [{"type": "DisruptionTarget", "status": "True", "reason": "EvictionByEvictionAPI"}]
PREEMPTED = [{"type": "DisruptionTarget", "status": "True", "reason": "PreemptionByScheduler"}]
ABORTED_BUDGET = {"phase": "Aborted", "abortReason": "BudgetExhausted", "completionTime": at(100),
                  "cost": {"usd": "5.00", "tokens": 10}, "observedGeneration": 1}
SUCCEEDED = {"phase": "Succeeded", "completionTime": at(50)}
# What ends an attempt: the epoch is bumped (fencing its pod), the lease cleared.
FENCED = {"epoch": 3, "lease": {}}
RESTART_1 = {**FENCED, "phase": "Backoff", "restarts": 1, "nextAttemptTime": at(130)}


def case(run_body: dict[str, Any], pods: list[dict[str, Any]] | None = None, *, seconds: float = 120,
         status: dict[str, Any] | None = None, events: list[str] | None = None, **plan: Any) -> Any:
    """One row: the run and its pods at T0 + seconds -> the status fields, Event reasons (when given, all
    of them, in order) and plan fields."""
    return (run_body, pods or [], seconds, status or {}, events, plan)


TRANSITIONS: dict[str, Any] = {
    # admit and start
    # A new run is admitted and its first attempt started in one status write (issue 42: a start costs one).
    "a new run is admitted with epoch 1 and its input's hash, and starts attempt 1 at once": case(
        {**body({}, spec={"input": {"topic": "a"}}), "status": None},
        status={"phase": "Running", "epoch": 1, "attempt": 1, "pod": "run-a1",
                "inputHash": api.input_hash({"topic": "a"}), "startTime": at(120), "attemptStartTime": at(120),
                "traceID": api.trace_id("ns/run/u1")},
        events=["AttemptStarted"], create_pod_epoch=1),
    "a new run created suspended is admitted and starts nothing": case(
        {**body({}, spec={"suspend": True}), "status": None},
        status={"phase": "Pending", "epoch": 1, "attempt": 0}, create_pod_epoch=None),
    "a new run created with an abort request is admitted and starts nothing": case(
        {**body({}, annotations={api.ANNOTATION_ABORT: "no"}), "status": None},
        status={"phase": "Pending", "attempt": 0}, create_pod_epoch=None),
    "a run continuing another run id's journal joins that run id's trace": case(
        {**body({}, spec={"checkpoint": {"uri": "s3://b/r", "runId": "nightly"}}), "status": None},
        status={"phase": "Running", "traceID": api.trace_id("_local/nightly")}),
    "a new run gets the operator's finalizer first": case(
        body({"phase": "Pending"}, finalizers=()), add_run_finalizer=True),
    "a pending run starts its attempt in a pod named by its epoch": case(
        body({"phase": "Pending"}), status={"phase": "Running", "attempt": 2, "pod": "run-a2",
                                            "attemptStartTime": at(120)},
        events=["AttemptStarted"], create_pod_epoch=2),
    "a pending run waits until the previous attempt's pod is gone": case(
        body({"phase": "Pending"}), [old_pod()], status={"phase": "Pending", "attempt": 1},
        delete_pods=["run-a1"], create_pod_epoch=None),
    "a running run with a healthy lease is left alone": case(body(running()), [runner_pod()], empty=True),
    # crashes count against maxRestarts, with a doubling backoff
    "a crash restarts after the initial backoff": case(
        body(running()), [ended(1)], status=RESTART_1, events=["Restarting"],
        restart_reason="Crash", delete_pods=["run-a2"], release_pods=["run-a2"]),
    "the second crash waits twice as long": case(
        body(running(restarts=1)), [ended(1)],
        status={**FENCED, "phase": "Backoff", "restarts": 2, "nextAttemptTime": at(140)}, restart_reason="Crash"),
    "the last crash maxRestarts allows still restarts": case(
        body(running(restarts=2)), [ended(1)],
        status={**FENCED, "phase": "Backoff", "restarts": 3, "nextAttemptTime": at(160)}, restart_reason="Crash"),
    "a crash past maxRestarts aborts the run": case(
        body(running(restarts=3)), [ended(1)],
        status={**FENCED, "phase": "Aborted", "restarts": 4, "abortReason": "RetryLimitExceeded",
                "completionTime": at(120)},
        events=["Aborted"], restart_reason="Crash", abort_reason="RetryLimitExceeded", completion="Aborted"),
    "a backoff that is over starts the next attempt": case(
        body({"phase": "Backoff", "restarts": 1, "nextAttemptTime": at(100)}),
        status={"phase": "Pending", "nextAttemptTime": ABSENT}),
    "a backoff that is not over waits": case(
        body({"phase": "Backoff", "restarts": 1, "nextAttemptTime": at(130)}), empty=True),
    "an OOM kill restarts with backoff and names the memory limit to raise": case(
        body(running()), [ended(137, reason="OOMKilled")], status=RESTART_1, restart_reason="OOMKilled"),
    "an expired lease restarts, guarded by the lease it judged": case(
        body(running()), [runner_pod()], seconds=200,
        status={**RESTART_1, "nextAttemptTime": at(210)}, events=["LeaseExpired", "Restarting"],
        restart_reason="LeaseExpired", delete_pods=["run-a2"]),
    "the current pod fenced by a zombie write counts as a restart": case(
        body(running()), [ended(5, report={"outcome": "Fenced", "message": "lost position 4"})],
        status=RESTART_1, restart_reason="Fenced"),
    # disruptions count against maxDisruptions, restart at once
    "an evicted pod restarts at once as a disruption": case(
        body(running()), [ended(143, conditions=EVICTED)],
        status={**FENCED, "phase": "Pending", "disruptions": 1, "restarts": 0}, events=["Restarting"],
        restart_reason="Evicted", delete_pods=["run-a2"], release_pods=["run-a2"]),
    "a preempted pod restarts at once as a disruption": case(
        body(running()), [ended(143, conditions=PREEMPTED)],
        status={**FENCED, "phase": "Pending", "disruptions": 1}, restart_reason="Preempted"),
    "a pod deleted by someone else restarts at once as a disruption": case(
        body(running()), [ended(143, deleting=True)],
        status={**FENCED, "phase": "Pending", "disruptions": 1}, restart_reason="PodDeleted", delete_pods=[],
        release_pods=["run-a2"]),
    "a pod that vanished after holding the lease restarts as deleted": case(
        body(running()), status={**FENCED, "phase": "Pending", "disruptions": 1}, restart_reason="PodDeleted"),
    "a pod the pod GC force-deleted with its node restarts as node lost": case(
        body(running()), [lost_pod("DeletionByPodGC", 0)], status={**FENCED, "phase": "Pending", "disruptions": 1},
        restart_reason="NodeLost", delete_pods=[], release_pods=["run-a2"]),
    "a pod stuck Terminating on a lost node is waited for a while": case(
        body(running()), [lost_pod("DeletionByTaintManager", 30)], seconds=160, empty=True),
    "a pod the taint manager is removing whose lease lapses first restarts as node lost, not lease expired": case(
        body(running()), [lost_pod("DeletionByTaintManager", 30)], seconds=164,
        status={**FENCED, "phase": "Pending", "disruptions": 1, "restarts": 0}, events=["Restarting"],
        restart_reason="NodeLost"),
    "a pod stuck Terminating on a lost node past the limit restarts as node lost": case(
        body(running()), [lost_pod("DeletionByTaintManager", 30)], seconds=166,
        status={**FENCED, "phase": "Pending", "disruptions": 1}, restart_reason="NodeLost"),
    "the last disruption maxDisruptions allows still restarts": case(
        body(running(disruptions=19)), [ended(143, conditions=EVICTED)],
        status={"phase": "Pending", "disruptions": 20}, restart_reason="Evicted"),
    "a disruption past maxDisruptions aborts the run": case(
        body(running(disruptions=20)), [ended(143, conditions=EVICTED)],
        status={"phase": "Aborted", "disruptions": 21, "abortReason": "RetryLimitExceeded"},
        abort_reason="RetryLimitExceeded"),
    # the runner's own outcomes
    "a completed attempt succeeds the run and keeps its pod": case(
        body(running()), [ended(0, report={"outcome": "Completed", "message": "done"})],
        status={**FENCED, "phase": "Succeeded", "outcome": "Completed", "completionTime": at(120),
                "lastPodEndTime": at(110)},
        events=["Succeeded"], completion="Succeeded", delete_pods=[], release_pods=["run-a2"]),
    "a failed attempt fails the run": case(
        body(running()), [ended(1, report={"outcome": "Failed", "message": "step 'x' failed"})],
        status={"phase": "Failed", "outcome": "Failed", "message": "step 'x' failed", "restarts": 0},
        events=["Failed"], completion="Failed", delete_pods=[]),
    "a budget the runner ran out of aborts the run": case(
        body(running()), [ended(3, report={"outcome": "Aborted", "message": "cost ceiling",
                                           "abortReason": "BudgetExhausted"})],
        status={"phase": "Aborted", "abortReason": "BudgetExhausted"}, abort_reason="BudgetExhausted"),
    "a run over maxDuration gives its runner abortGracePeriod to end Aborted by itself": case(
        body(running(), spec={"policy": {**POLICY, "maxDuration": "100s"}}), [runner_pod()],
        status={"epoch": 2, "phase": "Running", "aborting": {
            "reason": "MaxDurationExceeded", "deadline": at(150), "message": ANY_TEXT}},
        events=["Aborting"], delete_pods=[]),
    "a run over maxDuration is aborted even if its runner hangs": case(
        body(running(aborting=MAX_DURATION_ABORTING), spec={"policy": {**POLICY, "maxDuration": "100s"}}),
        [runner_pod()], seconds=150,
        status={**FENCED, "phase": "Aborted", "abortReason": "MaxDurationExceeded", "aborting": ABSENT},
        abort_reason="MaxDurationExceeded", delete_pods=["run-a2"]),
    "a runner that ends Aborted within the grace aborts the run with its reason": case(
        body(running(aborting=MAX_DURATION_ABORTING), spec={"policy": {**POLICY, "maxDuration": "100s"}}),
        [ended(3, report={"outcome": "Aborted", "message": "undone by 2 compensations",
                          "abortReason": "MaxDurationExceeded"})], seconds=140,
        status={**FENCED, "phase": "Aborted", "abortReason": "MaxDurationExceeded", "aborting": ABSENT,
                "message": "undone by 2 compensations"},
        events=["Aborted"], abort_reason="MaxDurationExceeded", delete_pods=[]),
    "a runner that crashes while aborting restarts at once to finish undoing": case(
        body(running(aborting=MAX_DURATION_ABORTING)), [ended(1)], seconds=130,
        status={**FENCED, "phase": "Pending", "restarts": 1, "aborting": MAX_DURATION_ABORTING},
        events=["Restarting"], restart_reason="Crash"),
    "the next attempt of an aborting run starts without waiting": case(
        body({"phase": "Pending", "aborting": MAX_DURATION_ABORTING}, spec={"policy": {**POLICY, "maxDuration": "1s"}}),
        seconds=130, status={"phase": "Running", "attempt": 2}, create_pod_epoch=2),
    "an aborting run past its grace is aborted without another attempt": case(
        body({"phase": "Pending", "aborting": MAX_DURATION_ABORTING}), seconds=150,
        status={"phase": "Aborted", "abortReason": "MaxDurationExceeded", "aborting": ABSENT},
        create_pod_epoch=None),
    "an abortGracePeriod of 0s fences the running attempt at once": case(
        body(running(), spec={"policy": {**POLICY, "maxDuration": "100s", "abortGracePeriod": "0s"}}),
        [runner_pod()], status={**FENCED, "phase": "Aborted", "abortReason": "MaxDurationExceeded"},
        abort_reason="MaxDurationExceeded", delete_pods=["run-a2"]),
    "a run with no completed step for progressTimeout is aborted": case(
        body(running(), spec={"policy": {**POLICY, "progressTimeout": "1m"}}), [runner_pod()], seconds=155,
        status={**FENCED, "phase": "Aborted", "abortReason": "ProgressTimeout"},
        abort_reason="ProgressTimeout", delete_pods=["run-a2"]),
    # waits: for an event, or a durable sleep; no pod runs meanwhile
    "an attempt waiting for an event leaves the run Waiting without a pod": case(
        body(running()), [ended(4, report=waiting_report(event="approve", since=at(100)))],
        status={**FENCED, "phase": "Waiting", "waitingFor": {"event": "approve", "since": at(100)}},
        events=["Waiting"], delete_pods=["run-a2"], release_pods=["run-a2"]),
    "an attempt in a durable sleep leaves the run Waiting for its wake time": case(
        body(running()), [ended(4, report=waiting_report(wakeTime=at(600)))],
        status={"phase": "Waiting", "waitingFor": {"wakeTime": at(600), "since": at(120)}}),
    "the awaited event wakes the run": case(
        body({"phase": "Waiting", "waitingFor": {"event": "approve", "since": at(0)}},
             spec={"events": {"approve": {"by": "dana"}}}),
        status={"phase": "Pending"}, events=["EventReceived"]),
    "another event does not wake the run": case(
        body({"phase": "Waiting", "waitingFor": {"event": "approve", "since": at(0)}}, spec={"events": {"x": 1}}),
        empty=True),
    "the wake time wakes a sleeping run": case(
        body({"phase": "Waiting", "waitingFor": {"wakeTime": at(100), "since": at(0)}}),
        status={"phase": "Pending"}, events=["Resumed"]),
    "a sleeping run sleeps until its wake time": case(
        body({"phase": "Waiting", "waitingFor": {"wakeTime": at(600), "since": at(0)}}), empty=True),
    "a wait's deadline wakes the run": case(
        body({"phase": "Waiting", "waitingFor": {"event": "approve", "deadline": at(100), "since": at(0)}}),
        status={"phase": "Pending"}, events=["Resumed"]),
    # suspend and resume
    "a runner stopped at a step boundary for spec.suspend suspends the run": case(
        body(running(), spec={"suspend": True}), [ended(4, report={"outcome": "Suspended", "message": "SIGTERM"})],
        status={**FENCED, "phase": "Suspended"}, events=["Suspended"]),
    "a runner stopped cleanly without spec.suspend resumes at once": case(
        body(running()), [ended(4, report={"outcome": "Suspended", "message": "SIGTERM"})],
        status={"phase": "Pending", "restarts": 0}),
    "spec.suspend suspends a run in backoff": case(
        body({"phase": "Backoff", "nextAttemptTime": at(300)}, spec={"suspend": True}),
        status={"phase": "Suspended"}, events=["Suspended"]),
    "lifting spec.suspend resumes the run": case(
        body({"phase": "Suspended"}), status={"phase": "Pending"}, events=["Resumed"]),
    # aborts, and resuming an aborted run
    "the abort annotation asks the running attempt to end Aborted within the grace": case(
        body(running(), annotations={api.ANNOTATION_ABORT: "wrong input"}), [runner_pod()],
        status={"epoch": 2, "phase": "Running", "aborting": {
            "reason": "UserRequested", "message": "aborted by request: wrong input", "deadline": at(150)}},
        events=["Aborting"], delete_pods=[]),
    "the abort annotation fences a running attempt that does not end within the grace": case(
        body(running(aborting={"reason": "UserRequested", "message": "aborted by request: wrong input",
                               "deadline": at(150)}), annotations={api.ANNOTATION_ABORT: "wrong input"}),
        [runner_pod()], seconds=151,
        status={**FENCED, "phase": "Aborted", "abortReason": "UserRequested", "aborting": ABSENT,
                "message": "aborted by request: wrong input; pod run-a2 did not end within "
                           "policy.abortGracePeriod=30s, so it was stopped; it was stopped between steps "
                           "(3 journaled)"},
        events=["Aborted"], abort_reason="UserRequested", delete_pods=["run-a2"]),
    "the abort annotation fences at once an attempt that does not hold its lease yet": case(
        body(running(lease={}), annotations={api.ANNOTATION_ABORT: "wrong input"}), [runner_pod()],
        status={**FENCED, "phase": "Aborted", "abortReason": "UserRequested",
                "message": "aborted by request: wrong input; it was stopped between steps (3 journaled)"},
        events=["Aborted"], abort_reason="UserRequested", delete_pods=["run-a2"]),
    "a waiting attempt reports the Saga compensations an abort would run": case(
        body(running()), [ended(4, report={"outcome": "Waiting", "message": "waiting", "waitingFor": {
            "event": "approve", "since": at(100), "compensations": 2}})],
        status={"phase": "Waiting", "waitingFor": {"event": "approve", "since": at(100), "compensations": 2}}),
    "the abort annotation on a run waiting inside a Saga starts an attempt to undo its work": case(
        body({"phase": "Waiting", "waitingFor": {"event": "approve", "since": at(0), "compensations": 2}},
             annotations={api.ANNOTATION_ABORT: "trip cancelled"}),
        status={"phase": "Pending", "aborting": {
            "reason": "UserRequested", "message": "aborted by request: trip cancelled", "deadline": at(150)}},
        events=["Aborting"], create_pod_epoch=None),
    "a run that began to wait inside a Saga before it read the abort gets the attempt to undo its work": case(
        body({"phase": "Waiting", "aborting": MAX_DURATION_ABORTING,
              "waitingFor": {"event": "approve", "since": at(100), "compensations": 1}}), seconds=130,
        status={"phase": "Pending", "aborting": MAX_DURATION_ABORTING}, events=["Aborting"]),
    "the abort annotation aborts a waiting run": case(
        body({"phase": "Waiting", "waitingFor": {"event": "approve", "since": at(0)}},
             annotations={api.ANNOTATION_ABORT: ""}),
        status={"phase": "Aborted", "abortReason": "UserRequested", "waitingFor": ABSENT}),
    "a raised cost ceiling resumes a run aborted for its budget": case(
        body(ABORTED_BUDGET, spec={"policy": {**POLICY, "costCeilingUSD": "10"}}, generation=2),
        status={"phase": "Pending", "abortReason": ABSENT, "completionTime": ABSENT, "observedGeneration": 2},
        events=["Resumed"]),
    "a spec change that does not lift the budget leaves the run aborted": case(
        body(ABORTED_BUDGET, spec={"policy": {**POLICY, "costCeilingUSD": "5.00"}}, generation=2),
        status={"phase": "Aborted", "abortReason": "BudgetExhausted"}, events=[]),
    "a raised maxRestarts resumes a run that ran out of restarts": case(
        body({"phase": "Aborted", "abortReason": "RetryLimitExceeded", "restarts": 4, "completionTime": at(100),
              "observedGeneration": 1}, spec={"policy": {**POLICY, "maxRestarts": 5}}, generation=2),
        status={"phase": "Pending", "abortReason": ABSENT, "restarts": 4}),
    # retry annotation, TTL
    "a new retry value restarts a failed run from its journal": case(
        body(failed(), annotations={api.ANNOTATION_RETRY: "1"}),
        status={"phase": "Pending", "restarts": 0, "disruptions": 0, "retry": "1"}, events=["Retrying"]),
    "a new retry value restarts an aborted run from its journal": case(
        body({**failed(), "phase": "Aborted", "abortReason": "RetryLimitExceeded"},
             annotations={api.ANNOTATION_RETRY: "2"}),
        status={"phase": "Pending", "abortReason": ABSENT, "restarts": 0, "retry": "2"}, events=["Retrying"]),
    "a finished run is deleted once its TTL has passed": case(
        body(SUCCEEDED, spec={"ttlSecondsAfterFinished": 60}), delete_run=True, patch=[]),
    "a finished run is kept until its TTL has passed": case(
        body(SUCCEEDED, spec={"ttlSecondsAfterFinished": 100}), empty=True),
    "a finished run without a TTL is kept": case(body(SUCCEEDED), empty=True),
}


@pytest.mark.parametrize("name", TRANSITIONS)
def test_transition(name: str) -> None:
    run_body, pods, seconds, want_status, want_events, want_plan = TRANSITIONS[name]
    now = T0 + timedelta(seconds=seconds)
    views = [decide.PodView.from_pod(p, now, 60.0) for p in pods]
    plan = decide.decide(decide.RunView.from_body(run_body), views, now)
    status = apply(run_body, plan)
    for key, value in want_status.items():
        if value is ABSENT:
            assert key not in status, (key, status)
        else:
            assert status.get(key) == value, (key, status.get(key))
    if want_events is not None:
        assert [reason for _, reason, _ in plan.events] == want_events
    for key, value in want_plan.items():
        assert getattr(plan, key) == value, (key, getattr(plan, key))
    resource.DurableRunStatus.model_validate(status)  # what the API server would store is a valid status


# Every Restarting, Fenced or Aborted message names the step in flight (the runner's last report, status.progress),
# never a raw log line: the kubelet's fallback termination message is the runner's last log line.
FETCH = {"completedSteps": 3, "stepName": "fetch", "lastProgressTime": at(40),
         "inFlight": {"name": "fetch", "position": "4", "attempt": 2, "startTime": at(50)}}
LOG_LINE = '{"time":"2026-11-22T12:01:49Z","event":"heartbeat"}'
IN_FLIGHT: dict[str, Any] = {
    "a crash names the step in flight and how long it had run, not the last log line": (
        body(running(progress=FETCH)), [ended(137)], 120, "Restarting",
        "the runner crashed with exit code 137 (killed by SIGKILL) during step 'fetch' (position 4, attempt 2, "
        "running for 1m): restart 1 of 3 in 10s"),
    "an expired lease names the step in flight up to now": (
        body(running(progress=FETCH)), [runner_pod()], 200, "Restarting",
        "lease expired: pod run-a2 stopped renewing it (hung, paused or partitioned) during step 'fetch' "
        "(position 4, attempt 2, running for 2m30s): restart 1 of 3 in 10s"),
    "a fenced attempt names its step": (
        body(running(progress=FETCH)), [ended(5, report={"outcome": "Fenced", "message": "lost position 4"})], 120,
        "Restarting", "lost position 4 during step 'fetch' (position 4, attempt 2, running for 1m): restart 1 of 3 "
                      "in 10s"),
    "an abort that fences the attempt names its step": (
        body(running(progress=FETCH, aborting={"reason": "UserRequested", "message": "aborted by request: x",
                                               "deadline": at(150)}),
             annotations={api.ANNOTATION_ABORT: "x"}), [runner_pod()], 151, "Aborted",
        "UserRequested: aborted by request: x; pod run-a2 did not end within policy.abortGracePeriod=30s, so it "
        "was stopped; it was stopped during step 'fetch' (position 4, attempt 2, running for 1m41s)"),
    "a crash past maxRestarts names its step in the Aborted message": (
        body(running(restarts=3, progress=FETCH)), [ended(1)], 120, "Aborted",
        "RetryLimitExceeded: the runner crashed with exit code 1 during step 'fetch' (position 4, attempt 2, "
        "running for 1m); 4 restarts exceed policy.maxRestarts=3"),
    "a crash between steps names the last step journaled": (
        body(running(progress={**FETCH, "inFlight": None})), [ended(137)], 120, "Restarting",
        "the runner crashed with exit code 137 (killed by SIGKILL) between steps, after 'fetch' (3 journaled): "
        "restart 1 of 3 in 10s"),
}


@pytest.mark.parametrize("name", IN_FLIGHT)
def test_an_ending_names_the_step_in_flight(name: str) -> None:
    run_body, pods, seconds, reason, message = IN_FLIGHT[name]
    for pod in pods:  # what the kubelet reports for a runner killed without writing its outcome
        for container in pod["status"].get("containerStatuses", []):
            terminated = container["state"].get("terminated")
            if terminated is not None and "message" not in terminated:
                terminated["message"] = LOG_LINE
    plan, status = plan_for(run_body, pods, seconds)
    events = {r: m for _, r, m in plan.events}
    assert events[reason].endswith(message), events
    assert status["message"] in events[reason]
    assert "heartbeat" not in " ".join(events.values())


def test_a_new_attempt_forgets_the_last_attempts_step_in_flight() -> None:
    _, status = plan_for(body({"phase": "Pending", "progress": FETCH}))
    assert status["phase"] == "Running"
    assert "inFlight" not in status["progress"]
    assert status["progress"]["stepName"] == "fetch"
