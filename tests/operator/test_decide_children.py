"""decide() for child runs and signals, as a pure function on plain dicts (no test bed).

The test bed proves the same end to end (tests/operator/test_children.py); these pin each rule:
create once, report an outcome once, narrow never widen, suspend/abort pass down and are lifted,
the children's cost counts toward the parent's ceiling, a signal is delivered once, first value wins.
"""

from __future__ import annotations

import json
from datetime import timedelta
from typing import Any

import pytest

from durablerun import api, relations
from durablerun_operator import builders, decide
from tests.operator.run_bodies import T0, body, runner_pod, running

REQUEST = {"workflow": "m:child", "input": {"n": 1}}


def child(name: str = "run-w1", *, phase: str | None = "Running", owner: str = "u1", spec: dict[str, Any] | None = None,
          annotations: dict[str, str] | None = None, **status: Any) -> dict[str, Any]:
    b = body({"phase": phase, **status} if phase else {}, spec=spec, annotations=annotations)
    b["metadata"].update(name=name, uid=f"uid-{name}", labels={api.LABEL_PARENT: "run"},
                         ownerReferences=[{"kind": api.KIND, "uid": owner, "controller": True, "name": "run"}])
    return b


def plan(run_body: dict[str, Any], related: dict[str, dict[str, Any] | None] | None = None,
         pods: list[dict[str, Any]] | None = None) -> tuple[decide.Plan, dict[str, Any]]:
    now = T0 + timedelta(seconds=110)
    views = {n: (decide.RunView.from_body(b) if b else None) for n, b in (related or {}).items()}
    p = decide.decide(decide.RunView.from_body(run_body), [decide.PodView.from_pod(x, now, 60.0) for x in pods or []],
                      now, related=views)
    status = dict(run_body["status"])
    for op in p.patch:
        if op["op"] == "add":
            status[op["path"].split("/")[2]] = op["value"]
        elif op["op"] == "remove":
            del status[op["path"].split("/")[2]]
    return p, status


def test_a_requested_child_is_created_once_owned_and_labelled_with_the_parent_template_and_store() -> None:
    parent = body(running(childRequests={"w1": REQUEST}), spec={"template": {"spec": {"nodeName": "n"}}})
    p, _ = plan(parent, {"run-w1": None}, [runner_pod()])
    [manifest] = p.create_runs
    assert manifest["metadata"]["name"] == "run-w1"
    assert manifest["metadata"]["labels"][api.LABEL_PARENT] == "run"
    assert manifest["metadata"]["ownerReferences"][0]["uid"] == "u1"
    assert manifest["spec"]["template"] == {"spec": {"nodeName": "n"}}
    assert manifest["spec"]["checkpoint"]["uri"] == "s3://bucket/runs"
    assert manifest["spec"]["input"] == {"n": 1}
    # The parent's trace id: the operator links the child's trace to the parent's at the child's admission.
    assert manifest["metadata"]["annotations"] == {api.ANNOTATION_PARENT_TRACE: api.trace_id("ns/run/u1")}
    assert ("Normal", "ChildStarted", "child run run-w1 (m:child)") in p.events
    assert decide.quiet_until(decide.RunView.from_body(parent)) is None  # a request is acted on at once

    # Once it exists its name is recorded (its state is its own DurableRun), and it is never created again;
    # not even after it disappears.
    p, status = plan(parent, {"run-w1": child()}, [runner_pod()])
    assert not p.create_runs
    assert status["childrenCreated"] == ["w1"]
    assert "children" not in status
    seen = body(running(childRequests={"w1": REQUEST}, childrenCreated=["w1"],
                        childrenTotal=status["childrenTotal"]))
    p, _ = plan(seen, {"run-w1": child(phase="Pending")}, [runner_pod()])
    assert p.empty  # a child's phase changes write nothing into its parent until the child finishes
    gone = body(running(childRequests={"w1": REQUEST}, childrenCreated=status["childrenCreated"]))
    p, _ = plan(gone, {"run-w1": None}, [runner_pod()])
    assert not p.create_runs
    assert p.add_events[relations.child_event("w1")]["phase"] == "Failed"
    assert "was deleted before it finished" in p.add_events[relations.child_event("w1")]["message"]


def test_a_name_taken_by_another_run_or_too_long_is_refused_to_the_parent() -> None:
    parent = body(running(childRequests={"w1": REQUEST}))
    p, _ = plan(parent, {"run-w1": child(owner="someone-else")}, [runner_pod()])
    assert not p.create_runs
    assert "is not a child of run" in p.add_events[relations.child_event("w1")]["message"]
    long = "x" * 70
    p, _ = plan(body(running(childRequests={long: REQUEST})), {}, [runner_pod()])
    assert "at most 63" in p.add_events[relations.child_event(long)]["message"]


def test_a_child_may_narrow_its_parents_budgets_but_never_widen_them() -> None:
    parent = {"metadata": {"name": "run", "namespace": "ns", "uid": "u1"},
              "spec": {"workflow": "m:f", "checkpoint": {"uri": "s3://b/r"},
                       "policy": {"costCeilingUSD": "5", "maxDuration": "1h"}}}
    narrowed = builders.child_run(parent, "w1", relations.ChildRequest(
        workflow="m:c", policy={"costCeilingUSD": "1.5", "maxRetries": 9}))
    assert narrowed["spec"]["policy"]["costCeilingUSD"] == "1.5"
    assert narrowed["spec"]["policy"]["maxRetries"] == 9
    assert narrowed["spec"]["policy"]["maxDuration"] == "1h"
    with pytest.raises(ValueError, match=r"policy.costCeilingUSD: 6 is above the parent's 5"):
        builders.child_run(parent, "w1", relations.ChildRequest(workflow="m:c", policy={"costCeilingUSD": "6"}))
    with pytest.raises(ValueError, match=r"policy.maxDuration: 2h is above the parent's 1h"):
        builders.child_run(parent, "w1", relations.ChildRequest(workflow="m:c", policy={"maxDuration": "2h"}))
    with pytest.raises(ValueError, match=r"policy.costCeiling: not a policy field"):
        builders.child_run(parent, "w1", relations.ChildRequest(workflow="m:c", policy={"costCeiling": "1"}))


def test_a_finished_childs_outcome_reaches_the_waiting_parent_once_and_wakes_it() -> None:
    waiting = {"phase": "Waiting", "waitingFor": {"event": relations.child_event("w1")},
               "childRequests": {"w1": REQUEST}}
    done = child(phase="Succeeded", result={"ref": "r", "size": 2, "sha256": "x", "inline": '{"a": 1}'},
                 cost={"usd": "0.5", "tokens": 3})
    p, status = plan(body(waiting), {"run-w1": done})
    # Compact, since a parent holds one per child: the cost is in childrenTotal, the rest in the child's status.
    assert p.add_events == {relations.child_event("w1"): {"phase": "Succeeded", "result": {"a": 1}}}
    assert status["childrenTotal"] == {"runs": 1, "finished": 1, "summary": "1/1", "usd": "0.5", "tokens": 3}
    # With the event in spec.events: the parent wakes, and nothing is sent again.
    delivered = body({**waiting, "childrenCreated": status["childrenCreated"],
                      "childrenTotal": status["childrenTotal"]}, spec={"events": p.add_events})
    p, status = plan(delivered, {"run-w1": done})
    assert not p.add_events
    assert status["phase"] == "Pending"


def test_a_failed_child_reaches_the_parent_as_a_failure_with_its_message() -> None:
    failed = child(phase="Aborted", abortReason="BudgetExhausted", message="over budget")
    p, _ = plan(body(running(childRequests={"w1": REQUEST})), {"run-w1": failed}, [runner_pod()])
    outcome = p.add_events[relations.child_event("w1")]
    assert (outcome["phase"], outcome["abortReason"], outcome["message"]) == ("Aborted", "BudgetExhausted",
                                                                              "over budget")
    assert any(reason == "ChildFailed" for _, reason, _ in p.events)


def test_a_big_result_or_a_long_message_stays_in_the_child_and_the_outcome_stays_small() -> None:
    big = json.dumps({"text": "x" * relations.CHILD_RESULT_INLINE_MAX})
    done = child(phase="Succeeded", result={"ref": "r", "size": len(big), "sha256": "x", "inline": big})
    p, _ = plan(body(running(childRequests={"w1": REQUEST})), {"run-w1": done}, [runner_pod()])
    # No result: the parent's runner reads it from the child's journal, by the uid.
    assert p.add_events[relations.child_event("w1")] == {"phase": "Succeeded", "uid": "uid-run-w1"}
    failed = child(phase="Failed", message="boom " * 200)
    p, _ = plan(body(running(childRequests={"w1": REQUEST})), {"run-w1": failed}, [runner_pod()])
    message = p.add_events[relations.child_event("w1")]["message"]
    assert len(message) == relations.CHILD_MESSAGE_MAX
    assert message.startswith("boom boom")


def test_an_older_operators_status_children_is_understood_and_moved_to_the_names() -> None:
    # As the operator before childrenCreated left it: a state per child. w1 finished, w2 was deleted while
    # it ran, w3 runs.
    legacy = {"w1": {"run": "run-w1", "uid": "uid-run-w1", "phase": "Succeeded"},
              "w2": {"run": "run-w2", "uid": "uid-run-w2", "phase": "Running"},
              "w3": {"run": "run-w3", "uid": "uid-run-w3", "phase": "Running"}}
    requests = {c: REQUEST for c in legacy}
    parent = body({"phase": "Waiting", "waitingFor": {"event": relations.child_event("w3")}, "childRequests": requests,
                   "children": legacy}, spec={"events": {relations.child_event("w1"): {"phase": "Succeeded"}}})
    p, status = plan(parent, {"run-w1": child("run-w1", phase="Succeeded"), "run-w2": None,
                              "run-w3": child("run-w3")})
    assert not p.create_runs  # w2 is not created again
    assert p.add_events == {relations.child_event("w2"): {
        "phase": "Failed", "uid": "", "message": "child run run-w2 was deleted before it finished"}}
    # Kept until its outcome is in spec.events: w1's is; w2's is only being sent.
    assert status["childrenCreated"] == ["w2", "w3"]
    assert "children" not in status
    assert {"op": "remove", "path": "/status/children"} in p.patch
    events = {"events": {**parent["spec"]["events"], **p.add_events}}
    p, status = plan(body(status, spec=events), {"run-w1": child("run-w1", phase="Succeeded"), "run-w2": None,
                                                 "run-w3": child("run-w3")})
    assert status["childrenCreated"] == ["w3"]
    assert not p.create_runs
    p, _ = plan(body(status, spec=events), {"run-w1": child("run-w1", phase="Succeeded"), "run-w2": None,
                                            "run-w3": child("run-w3")})
    assert p.empty


def test_suspend_and_abort_pass_down_to_running_children_and_are_lifted_with_the_parent() -> None:
    requests = {"childRequests": {"w1": REQUEST}}
    p, _ = plan(body({"phase": "Suspended", **requests}, spec={"suspend": True}), {"run-w1": child()})
    # Guarded by the child's resourceVersion: a child that changed since it was read is decided on again.
    assert p.patch_runs == [("run-w1", {"metadata": {"resourceVersion": "7",
                                                     "annotations": {api.ANNOTATION_SUSPENDED_BY_PARENT: "true"}},
                                        "spec": {"suspend": True}})]
    suspended = child(spec={"suspend": True}, annotations={api.ANNOTATION_SUSPENDED_BY_PARENT: "true"})
    p, _ = plan(body({"phase": "Suspended", **requests}), {"run-w1": suspended})
    assert ("run-w1", {"metadata": {"resourceVersion": "7", "annotations": {api.ANNOTATION_SUSPENDED_BY_PARENT: None}},
                       "spec": {"suspend": False}}) in p.patch_runs
    # A child created while its parent is suspended starts suspended, marked so that it resumes with it.
    p, _ = plan(body({"phase": "Suspended", **requests}, spec={"suspend": True}), {"run-w1": None})
    [manifest] = p.create_runs
    assert manifest["spec"]["suspend"] is True
    assert manifest["metadata"]["annotations"][api.ANNOTATION_SUSPENDED_BY_PARENT] == "true"
    # A child the user suspended stays suspended.
    p, _ = plan(body({"phase": "Waiting", **requests}), {"run-w1": child(spec={"suspend": True})})
    assert not p.patch_runs

    aborted = {"phase": "Aborted", "abortReason": "UserRequested", "completionTime": "2026-11-22T12:00:00Z",
               **requests}
    p, _ = plan(body(aborted), {"run-w1": child()})
    [(_name, patch)] = p.patch_runs
    assert patch["metadata"]["annotations"][api.ANNOTATION_ABORTED_BY_PARENT] == "run"
    assert "its parent run Aborted" in patch["metadata"]["annotations"][api.ANNOTATION_ABORT]
    assert not p.add_events  # the parent ended: nothing is delivered to it
    # The parent retried: the abort it passed down is lifted, and the aborted child retried.
    marked = child(phase="Aborted", annotations={api.ANNOTATION_ABORT: "its parent run Aborted",
                                                 api.ANNOTATION_ABORTED_BY_PARENT: "run"})
    p, _ = plan(body({"phase": "Waiting", **requests}), {"run-w1": marked})
    [(_, patch)] = p.patch_runs
    lift = patch["metadata"]["annotations"]
    assert lift[api.ANNOTATION_ABORT] is None
    assert lift[api.ANNOTATION_ABORTED_BY_PARENT] is None
    assert lift[api.ANNOTATION_RETRY].startswith("parent-")
    assert not p.add_events  # its abort was the parent's doing, not its outcome


def test_the_childrens_cost_counts_toward_the_parents_ceiling() -> None:
    parent = body({"phase": "Waiting", "waitingFor": {"event": relations.child_event("w1")}, "cost": {"usd": "1"},
                   "childRequests": {"w1": REQUEST}}, spec={"policy": {"costCeilingUSD": "3"}})
    cheap = child(cost={"usd": "1.5"})
    p, status = plan(parent, {"run-w1": cheap})
    assert status["phase"] == "Waiting"
    assert status["childrenTotal"]["usd"] == "1.5"
    dear = child(cost={"usd": "1.5"}, childrenTotal={"runs": 1, "usd": "0.5", "summary": "0/1"})
    p, status = plan(parent, {"run-w1": dear})
    assert (status["phase"], status["abortReason"]) == ("Aborted", "BudgetExhausted")
    assert "child runs' $2.0 reach policy.costCeilingUSD $3" in status["message"]
    assert p.patch_runs
    assert p.patch_runs[0][1]["metadata"]["annotations"][api.ANNOTATION_ABORTED_BY_PARENT] == "run"


def test_a_signal_is_delivered_once_and_the_first_value_wins() -> None:
    signal = {"signalRequests": {"3": {"run": "other", "event": "go", "value": json.dumps({"v": 1})}}}
    target = body({"phase": "Waiting"})
    target["metadata"]["name"] = "other"
    p, status = plan(body(running(**signal)), {"other": target}, [runner_pod()])
    assert p.patch_runs == [("other", {"spec": {"events": {"go": {"v": 1}}}})]
    assert "signals" not in status
    target["spec"]["events"] = {"go": {"v": 1}}
    p, status = plan(body(running(**signal)), {"other": target}, [runner_pod()])
    assert status["signals"] == {"3": {"state": "Delivered"}}
    assert not p.patch_runs
    target["spec"]["events"] = {"go": {"v": 0}}
    p, status = plan(body(running(**signal)), {"other": target}, [runner_pod()])
    assert status["signals"]["3"]["state"] == "Ignored"
    p, status = plan(body(running(**signal)), {"other": None}, [runner_pod()])
    assert status["signals"]["3"]["state"] == "NotFound"
    done = body(running(**signal, signals=status["signals"]))
    assert decide.related_names(decide.RunView.from_body(done)) == set()


def test_the_operator_never_writes_the_runners_requests_back() -> None:
    parent = body(running(childRequests={"w1": REQUEST}, signalRequests={}), spec={"suspend": True})
    p, _ = plan(parent, {"run-w1": child()}, [runner_pod()])
    assert not any(op["path"].startswith(("/status/childRequests", "/status/signalRequests")) for op in p.patch)
