"""durablerun.testing: what users unit-test their workflows with."""

from __future__ import annotations

from collections import Counter
from typing import Any

from durablerun import DurableContext
from durablerun.api import Outcome
from durablerun.resource import Policy
from durablerun.testing import WorkflowTest

calls: Counter[str] = Counter()


async def onboarding(ctx: DurableContext, input: dict[str, Any]) -> dict[str, Any]:
    def create(user: str) -> str:
        calls["create"] += 1
        ctx.add_cost(usd="0.10")
        return f"acct-{user}"

    account = await ctx.step("create", create, input["user"])
    verified = await ctx.wait_for_event("email-verified")
    welcome = await ctx.step("welcome", lambda: calls.update(["welcome"]) or "sent")
    return {"account": account, "verified": verified, "welcome": welcome}


def test_workflow_test_runs_attempts_and_delivers_events() -> None:
    calls.clear()
    t = WorkflowTest(onboarding, {"user": "ada"})
    try:
        first = t.attempt()
        assert first.outcome == Outcome.WAITING
        assert first.waiting is not None
        assert first.waiting.event == "email-verified"
        done = t.run_to_end(events={"email-verified": True})
        assert done.outcome == Outcome.COMPLETED
        assert done.result == {"account": "acct-ada", "verified": True, "welcome": "sent"}
        assert calls == Counter({"create": 1, "welcome": 1})
        assert len(t.attempts) == 3
        assert t.send_event("email-verified", False) is False  # first write won
    finally:
        t.close()


def test_workflow_test_stops_when_no_event_can_help() -> None:
    t = WorkflowTest(onboarding, {"user": "bob"}, policy=Policy(costCeilingUSD="0.05"))
    try:
        assert t.run_to_end(events={"other": 1}).outcome == Outcome.WAITING
        aborted = WorkflowTest(onboarding, {"user": "eve"}, policy=Policy(maxSteps=1))
        assert aborted.run_to_end(events={"email-verified": True}).outcome == Outcome.ABORTED
        aborted.close()
    finally:
        t.close()
