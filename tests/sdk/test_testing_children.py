"""WorkflowTest runs a supervisor's child runs in-process, as the operator would on Kubernetes.

Each child is a run of its own (its own journal in the test's store), attempted after the parent's
attempt that asked for it; its outcome reaches the parent as the operator's event, a failed child is a
catchable ChildRunFailed, a signal lands in its target's events, a parent that ends aborts its
unfinished children, and the children's cost counts toward the parent's ceiling. Children can also be
stubbed (ChildStub) or replaced by other workflow functions.
"""

from __future__ import annotations

from typing import Any

import fanout
import pytest
import supervisor  # examples/supervisor: its children are imported by name, as their pods would

from durablerun import DurableContext, relations
from durablerun.api import AbortReason, Outcome, Phase
from durablerun.resource import Policy
from durablerun.testing import ChildStub, WorkflowTest


@pytest.fixture(autouse=True)
def _fresh_counts() -> None:
    fanout.calls.clear()


def test_children_run_in_process_with_their_own_journals_and_each_step_runs_once() -> None:
    t = WorkflowTest(fanout.pipeline, {"fan": [{"n": 4}, {"n": 5, "fail": True}, {"n": 6, "big": True}]})
    try:
        first = t.attempt()  # asks for "first" and waits; the child then runs to its end
        assert first.outcome == Outcome.WAITING
        assert first.waiting is not None
        assert first.waiting.event == relations.child_event("first")
        assert t.runs["test-first"].outcome is not None
        assert t.runs["test-first"].outcome["phase"] == Phase.SUCCEEDED

        done = t.run_to_end()
        assert done.outcome == Outcome.COMPLETED, done.message
        assert done.result["first"] == {"sq": 4}
        second, w0, w1, w2 = done.result["rest"]
        assert second == {"go": {"after": 4}, "sq": 9}  # the parent's signal, delivered to the child
        assert w0 == {"sq": 16}
        assert w1["failed"] == Phase.FAILED
        assert "cannot square 5" in w1["message"]
        assert w2 == {"sq": 36, "big": "x" * 5000}  # too big for the outcome event: read from its journal
        assert len(t.attempts) == 3  # waits for "first", then for the rest, then done

        # Each child has its own journal in the store; each step ran once, whatever was replayed.
        assert set(t.runs) == {"test", "test-first", "test-second", "test-w0", "test-w1", "test-w2"}
        assert set(t.store.list_local_runs()) >= set(t.runs)
        assert fanout.calls == {f"{name}:square": 1 for name in t.runs if name != "test"}
        assert [s.state for s in t.signals.values()] == ["Delivered", "NotFound"]

        again = t.attempt()  # a finished run replays: no child is asked for or run again
        assert again.result == done.result
        assert sum(len(r.attempts) for r in t.runs.values()) == 4 + 5
    finally:
        t.close()


def test_children_can_be_stubbed_or_replaced() -> None:
    async def fake_worker(ctx: DurableContext, input: dict[str, Any]) -> dict[str, Any]:
        return {"sq": -input["n"], **({"go": await ctx.wait_for_event("go")} if input.get("wait") else {})}

    t = WorkflowTest(fanout.pipeline, {"fan": [{"n": 4}]}, children={"fanout:worker": fake_worker})
    try:
        done = t.run_to_end()
        assert done.outcome == Outcome.COMPLETED, done.message
        assert done.result == {"first": {"sq": -2}, "rest": [{"go": {"after": -2}, "sq": -3}, {"sq": -4}]}
        assert not fanout.calls  # the real worker never ran
    finally:
        t.close()

    for stub, expected in (
        (ChildStub({"sq": 7}), {"sq": 7}),
        (ChildStub(phase=Phase.FAILED, message="no quota"),
         {"failed": Phase.FAILED, "message": "no quota", "reason": None}),
        (ChildStub(phase=Phase.ABORTED, abort_reason=AbortReason.BUDGET_EXHAUSTED, message="over"),
         {"failed": Phase.ABORTED, "message": "over", "reason": AbortReason.BUDGET_EXHAUSTED}),
    ):
        t = WorkflowTest(fanout.pipeline, {"fan": [{"n": 4}]}, children={"fanout:worker": stub})
        try:
            result = t.run_to_end()
            if stub.phase == Phase.SUCCEEDED:
                assert result.outcome == Outcome.COMPLETED, result.message
                assert result.result == {"first": {"sq": 7}, "rest": [{"sq": 7}, {"sq": 7}]}
            else:  # run_child raises the first child's failure: the supervisor fails with it
                assert result.outcome == Outcome.FAILED
                assert f"child run test-first {expected['failed']}" in result.message
                assert expected["message"] in result.message
            assert not t.runs["test-first"].attempts
        finally:
            t.close()
    with pytest.raises(ValueError, match="a stub ends at once"):
        ChildStub(phase=Phase.RUNNING)


def test_a_parent_that_ends_aborts_its_unfinished_children_and_hears_nothing_back() -> None:
    t = WorkflowTest(fanout.doomed, {})
    try:
        failed = t.attempt()
        assert failed.outcome == Outcome.FAILED
        assert "the supervisor gave up" in failed.message
        waiter = t.runs["test-waiter"]
        assert [a.outcome for a in waiter.attempts] == [Outcome.ABORTED]
        assert waiter.attempts[0].abort_reason == AbortReason.USER_REQUESTED
        assert "its parent test Failed" in waiter.attempts[0].message
        assert t.store.get_event(run=t.ref, name=relations.child_event("waiter")) is None
    finally:
        t.close()


def test_children_narrow_their_parents_budgets_and_their_cost_counts_toward_its_ceiling() -> None:
    async def wide(ctx: DurableContext, input: dict[str, Any]) -> Any:
        return await ctx.run_child("wide", "fanout:worker", {"n": 1}, policy={"maxSteps": 50})

    t = WorkflowTest(wide, {}, policy=Policy(maxSteps=10))
    try:
        refused = t.run_to_end()
        assert refused.outcome == Outcome.FAILED
        assert "refused: policy.maxSteps: 50 is above the parent's 10" in refused.message
        assert "test-wide" not in t.runs or not t.runs["test-wide"].attempts
    finally:
        t.close()

    t = WorkflowTest(fanout.pipeline, {"fan": [{"n": 1, "usd": "0.40"}, {"n": 2, "usd": "0.40"}]},
                     policy=Policy(costCeilingUSD="0.50"))
    try:
        aborted = t.run_to_end()
        assert aborted.outcome == Outcome.ABORTED
        assert aborted.abort_reason == AbortReason.BUDGET_EXHAUSTED
        assert "its child runs' $0.80 reach policy.costCeilingUSD $0.50" in aborted.message
    finally:
        t.close()


def test_the_example_supervisor_fans_out_in_process_as_docs_sdk_md_shows() -> None:
    t = WorkflowTest(supervisor.supervisor, {"question": "q", "agents": 2})
    try:
        done = t.run_to_end()
        assert done.outcome == Outcome.COMPLETED, done.message
        assert done.result == {"report": "q: q (angle 1): 3 sources; q (angle 2): 3 sources", "failed": []}
        assert len(t.runs["test-agent-0"].attempts) == 1
        assert t.runs["test-agent-1"].policy.maxSteps == 20  # narrowed by the request
        assert t.runs["test-agent-1"].totals.tokens == 900
    finally:
        t.close()

    stubbed = WorkflowTest(supervisor.supervisor, {"question": "q", "agents": 2}, children={
        "supervisor:sub_agent": ChildStub(phase=Phase.FAILED, message="no quota")})
    try:
        assert stubbed.run_to_end().result == {"report": "q: ", "failed": ["agent-0", "agent-1"]}
    finally:
        stubbed.close()


def test_a_signals_first_value_wins_and_a_child_can_be_sent_events_by_the_test() -> None:
    async def twice(ctx: DurableContext, input: dict[str, Any]) -> Any:
        child = await ctx.start_child("c", "fanout:worker", {"n": 1, "wait": True})
        await ctx.signal(child.run, "go", 1)
        await ctx.signal(child.run, "go", 2)
        other = await ctx.start_child("d", "fanout:worker", {"n": 2, "wait": True})
        return [await child, await other]

    t = WorkflowTest(twice, {})
    try:
        waiting = t.attempt()  # "d" waits for an event no run here sends
        assert waiting.outcome == Outcome.WAITING
        assert t.runs["test-d"].last is not None
        assert t.runs["test-d"].last.outcome == Outcome.WAITING
        assert [(s.state, s.message) for s in t.signals.values()] == [
            ("Delivered", None), ("Ignored", "test-c already had another value for event 'go': the first value wins")]
        t.send_event("go", "from the test", run="test-d")  # the child moves on at once
        done = t.run_to_end()
        assert done.result == [{"go": 1, "sq": 1}, {"go": "from the test", "sq": 4}]
    finally:
        t.close()
