"""The SDK side of child runs and signals, attempt by attempt, with a recording broker in place of the pod's.

What the runner pod's broker does with a request (the status patch) and what the operator does with it
are proven on the test bed (tests/operator/test_children.py); here: a request is made once however
often the workflow replays, outcomes come from the journal, failures are catchable, a local run fails
with a clear error.
"""

from __future__ import annotations

import copy
import dataclasses
from typing import Any

import pytest

from durablerun import ChildRunFailed, DurableContext, api, errors, relations
from durablerun._private.engine.children import PodBroker
from durablerun._private.records.layout import RunRef
from durablerun.api import Outcome
from durablerun.engine import Run
from durablerun.stores import open_store
from durablerun.testing import WorkflowTest


class Broker:
    def __init__(self) -> None:
        self.children: list[tuple[str, dict[str, Any]]] = []
        self.signals: list[tuple[str, str, str, Any]] = []
        self.reads: list[tuple[str, str]] = []

    def request_child(self, name: str, request: dict[str, Any]) -> str:
        self.children.append((name, request))
        return f"test-{name}"

    def request_signal(self, signal_id: str, run: str, event: str, value: Any) -> None:
        self.signals.append((signal_id, run, event, value))

    def read_result(self, run: str, uid: str) -> Any:
        self.reads.append((run, uid))
        return {"big": "x" * 10}


async def fan_out(ctx: DurableContext, input: dict[str, Any]) -> dict[str, Any]:
    a = await ctx.start_child("a", "m:worker", {"n": 1}, policy={"maxSteps": 5})
    b = await ctx.start_child("b", "m:worker", {"n": 2})
    results = await ctx.gather(a, b, return_exceptions=True)
    failed = [(r.child, r.run, r.phase, r.reason, r.message) for r in results if isinstance(r, ChildRunFailed)]
    big = await ctx.run_child("c", "m:worker")
    await ctx.signal("other", "go", {"from": "test"})
    return {"a": results[0], "failed": failed, "big": big}


def test_children_are_asked_for_once_and_their_outcomes_replay_from_the_journal() -> None:
    broker = Broker()
    t = WorkflowTest(fan_out, {})
    t.config = dataclasses.replace(t.config, runs=broker)
    first = t.attempt()
    assert first.outcome == Outcome.WAITING
    assert first.waiting is not None
    assert first.waiting.event == relations.child_event("a")
    assert broker.children == [("a", {"workflow": "m:worker", "input": {"n": 1}, "policy": {"maxSteps": 5}}),
                               ("b", {"workflow": "m:worker", "input": {"n": 2}, "policy": {}})]

    # Outcomes as the operator sends them: compact (the child's name is the parent's to know).
    t.send_event(relations.child_event("a"), {"phase": "Succeeded", "uid": "u", "result": {"sq": 1}})
    t.send_event(relations.child_event("b"), {"phase": "Aborted", "uid": "u2",
                                        "abortReason": "BudgetExhausted", "message": "over budget"})
    second = t.attempt()
    assert second.waiting is not None
    assert second.waiting.event == relations.child_event("c")
    t.send_event(relations.child_event("c"), {"phase": "Succeeded", "uid": "u3"})  # no inline result
    done = t.attempt()
    assert done.outcome == Outcome.COMPLETED, done.message
    assert done.result == {"a": {"sq": 1}, "failed": [["b", "test-b", "Aborted", "BudgetExhausted", "over budget"]],
                           "big": {"big": "xxxxxxxxxx"}}
    assert [name for name, _ in broker.children] == ["a", "b", "c"]  # each once, over three attempts
    assert broker.reads == [("test-c", "u3")]
    [(signal_id, run, event, value)] = broker.signals
    assert (run, event, value) == ("other", "go", {"from": "test"})
    assert signal_id  # the signal step's position: stable across replays

    again = t.attempt()  # a completed run replays from its journal: nothing is asked or read again
    assert again.result == done.result
    assert len(broker.children) == 3
    assert len(broker.reads) == 1
    assert len(broker.signals) == 1


async def bad_name(ctx: DurableContext, input: dict[str, Any]) -> None:
    await ctx.start_child("Not_A_Name", "m:worker")


def test_a_bad_child_name_fails_the_run_naming_the_fix_before_anything_is_asked() -> None:
    broker = Broker()
    t = WorkflowTest(bad_name, {})
    t.config = dataclasses.replace(t.config, runs=broker)
    result = t.attempt()
    assert result.outcome == Outcome.FAILED
    assert "child name 'Not_A_Name': use lowercase letters, digits and '-'" in result.message
    assert broker.children == []

    async def long_name(ctx: DurableContext, input: dict[str, Any]) -> None:
        await ctx.start_child("x" * 70, "m:worker")

    t = WorkflowTest(long_name, {})
    t.config = dataclasses.replace(t.config, runs=broker)
    result = t.attempt()
    assert result.outcome == Outcome.FAILED
    assert "a run's name may have at most 63 (it labels the run's pods): use a child name of at most 58" \
        in result.message


def test_without_the_operator_children_and_signals_fail_saying_what_they_need() -> None:
    async def signals(ctx: DurableContext, input: dict[str, Any]) -> None:
        await ctx.signal("other", "go", 1)

    for workflow, call in ((fan_out, "ctx.start_child('a')"), (signals, "ctx.signal('other', 'go')")):
        # A run with no broker, as `durablerun run` starts it (WorkflowTest runs children in-process).
        result = Run(store=open_store("memory://no-operator"), run=RunRef.local("alone"), workflow=workflow,
                     input={}).run_attempt()
        assert result.outcome == Outcome.FAILED
        assert f"{call} needs the durable-run operator" in result.message


def test_the_pod_broker_asks_through_the_run_status_once_per_name() -> None:
    body: dict[str, Any] = {"status": {}}
    sent: list[list[dict[str, Any]]] = []

    def publish(ops: list[dict[str, Any]]) -> dict[str, Any]:  # the API server applying the JSON patch
        sent.append(copy.deepcopy(ops))
        for op in copy.deepcopy(ops):
            path = op["path"].split("/")[2:]
            target = body["status"]
            for part in path[:-1]:
                target = target[part]
            target[path[-1].replace("~1", "/").replace("~0", "~")] = op["value"]
        return body

    broker = PodBroker(namespace="ns", name="boss", store=open_store("memory://broker"), publish=publish,
                       latest=lambda: body)
    request = {"workflow": "m:w", "input": {}, "policy": {}}
    assert broker.request_child("w0", request) == "boss-w0"
    assert broker.request_child("w1", request) == "boss-w1"
    assert sent == [[{"op": "add", "path": "/status/childRequests", "value": {"w0": request}}],
                    [{"op": "add", "path": "/status/childRequests/w1", "value": request}]]
    # Asked again after a crash before the step was journaled: already in the status, nothing is sent.
    assert broker.request_child("w0", request) == "boss-w0"
    assert len(sent) == 2
    with pytest.raises(errors.NonRetryableError, match="already asked for 'w0' with other arguments"):
        broker.request_child("w0", {**request, "input": {"x": 1}})
    broker.request_signal("3/7.0", "other", "go", {"a": 1})
    assert body["status"]["signalRequests"] == {"3/7.0": {"run": "other", "event": "go", "value": '{"a":1}'}}
    assert sent[-1][0]["path"] == "/status/signalRequests"
    broker.request_signal("3/8", "other", "go2", None)
    assert sent[-1][0]["path"] == "/status/signalRequests/3~18"


def test_the_pod_broker_refuses_a_child_past_the_most_one_run_may_start_naming_the_limit_and_the_fix() -> None:
    request = {"workflow": "m:w", "input": {}, "policy": {}}
    body: dict[str, Any] = {"status": {"childRequests": {f"c{i}": request for i in range(api.CHILDREN_MAX)}}}
    sent: list[Any] = []
    broker = PodBroker(namespace="ns", name="boss", store=open_store("memory://broker"),
                       publish=lambda ops: sent.append(ops) or body, latest=lambda: body)
    assert broker.request_child("c7", request) == "boss-c7"  # one it asked for before: still answered
    with pytest.raises(errors.NonRetryableError) as refused:
        broker.request_child("one-more", request)
    message = str(refused.value)
    assert f"this run has started {api.CHILDREN_MAX:,} child runs, the most one run may start" in message
    assert "Start the rest from the children" in message
    assert sent == []  # nothing was published


def test_workflow_test_refuses_a_child_past_the_limit_as_the_pod_does(monkeypatch: pytest.MonkeyPatch) -> None:
    from durablerun.testing import ChildStub

    monkeypatch.setattr(api, "CHILDREN_MAX", 2)  # read at each request: three children are one too many

    async def three(ctx: DurableContext, input: dict[str, Any]) -> list[Any]:
        return [await ctx.run_child(f"c{i}", "m:worker", {}) for i in range(3)]

    result = WorkflowTest(three, {}, children={"m:worker": ChildStub({"ok": True})}).attempt()
    assert result.outcome == Outcome.FAILED
    assert "ctx.start_child('c2'): this run has started 2 child runs, the most one run may start" in result.message
