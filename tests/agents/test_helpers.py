"""The agent helpers: tools that declare side effects, sagas, bounded history (durablerun.agents)."""

from __future__ import annotations

import dataclasses
import json
import threading
import time
from collections.abc import Callable
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest

from durablerun import AbortReason, DurableContext, NonRetryableError, Outcome, Policy, StepError, WorkflowError
from durablerun.agents import Saga, bound_history, tool
from durablerun.engine import Run
from durablerun.testing import WorkflowTest
from tests.agents.helpers import cli, kill, launch


def _lines(path: Path) -> list[str]:
    return path.read_text().splitlines() if path.exists() else []


def wait_until(condition: Callable[[], bool], what: str, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, f"timed out after {timeout}s waiting for {what}"
        time.sleep(0.01)

# --- tools ------------------------------------------------------------------------------------------


def test_each_side_effect_kind_replays_as_documented() -> None:
    calls: dict[str, int] = {"none": 0, "read": 0, "write": 0}
    stock = {"n": 5}

    @tool("none")
    def add(a: int, b: int) -> int:
        calls["none"] += 1
        return a + b

    @tool("read")
    def read_stock() -> int:
        calls["read"] += 1
        return stock["n"]

    @tool("write", idempotency_key=True)
    def reserve(n: int, *, idempotency_key: str) -> str:
        calls["write"] += 1
        return f"{idempotency_key}:{n}"

    async def wf(ctx: DurableContext, input: Any) -> Any:
        seen = await read_stock(ctx)
        total = await add(ctx, seen, 1)
        receipt = await reserve(ctx, total, idempotency_key="order-7")
        await ctx.wait_for_event("go")
        return [seen, total, receipt]

    t = WorkflowTest(wf)
    assert t.attempt().outcome == Outcome.WAITING
    stock["n"] = 99  # the world changed; a replay must not see it
    t.send_event("go", True)
    done = t.attempt()
    assert done.result == [5, 6, "order-7:6"]
    # none ran again on the replay; read and write did not.
    assert calls == {"none": 2, "read": 1, "write": 1}


def test_a_tool_that_requires_a_key_refuses_to_run_without_one() -> None:
    sent: list[str] = []

    @tool("external", idempotency_key=True)
    def send_email(to: str, *, idempotency_key: str) -> None:
        sent.append(to)

    async def wf(ctx: DurableContext, input: Any) -> Any:
        await send_email(ctx, "ada@example.com")

    done = WorkflowTest(wf).attempt()
    assert done.outcome == Outcome.FAILED
    assert "tool 'send_email' (external side effect) requires an idempotency key" in (done.message or "")
    assert sent == []


def test_an_external_tool_without_a_key_is_not_retried() -> None:
    attempts: list[int] = []

    @tool("external")
    def charge() -> None:
        attempts.append(1)
        raise ConnectionError("lost the answer")

    async def wf(ctx: DurableContext, input: Any) -> Any:
        await charge(ctx)

    done = WorkflowTest(wf).attempt()
    assert done.outcome == Outcome.FAILED
    assert len(attempts) == 1


def test_an_unknown_side_effect_is_refused() -> None:
    with pytest.raises(WorkflowError, match="side_effect must be one of 'none', 'read', 'write', 'external'"):
        tool("delete")

# --- saga -------------------------------------------------------------------------------------------


def test_compensations_run_in_reverse_and_a_crash_while_compensating_resumes_it(tmp_path: Path) -> None:
    log, go = tmp_path / "steps.log", tmp_path / "go"
    env = {"STEP_LOG": str(log), "GO_FILE": str(go)}
    args = ["run", "saga_trip:trip", "--run-id", "s1", "--store", f"file://{tmp_path / 'store'}", "--quiet"]
    first = launch(args, env, tmp_path)
    try:
        wait_until(lambda: "cancel flight-1 started" in _lines(log), "the flight's compensation to start")
    finally:
        kill(first)
    assert _lines(log) == ["book flight", "book hotel", "charge", "cancel hotel-1 started", "cancel hotel-1 done",
                           "cancel flight-1 started"]
    go.touch()
    done = cli(args, env, tmp_path)
    assert done.returncode == 1, done.stderr
    assert "card declined" in done.stderr
    # Only the compensation in flight at the kill ran again; nothing journaled did.
    assert _lines(log)[6:] == ["cancel flight-1 started", "cancel flight-1 done"]
    records = json.loads(cli(["inspect", "--run-id", "s1", "--store", f"file://{tmp_path / 'store'}", "--json"],
                             env, tmp_path).stdout)["records"]
    assert [r["name"] for r in records if r["kind"] == "step"] == [
        "book-flight", "book-hotel", "charge", "compensate:cancel-hotel", "compensate:cancel-flight"]


def test_a_completed_saga_compensates_nothing() -> None:
    async def wf(ctx: DurableContext, input: Any) -> Any:
        async with Saga(ctx) as saga:
            saga.add("never", lambda: pytest.fail("compensated a success"))
            return await ctx.step("ok", lambda: 1)

    assert WorkflowTest(wf).attempt().result == 1


def test_compensation_steps_are_journaled_once() -> None:
    log: list[str] = []

    def fail() -> None:
        raise NonRetryableError("no")

    async def wf(ctx: DurableContext, input: Any) -> Any:
        try:
            async with Saga(ctx) as saga:
                saga.add("a", log.append, "undo a")
                saga.add("b", log.append, "undo b")
                await ctx.step("fail", fail)
        except StepError as e:
            await ctx.wait_for_event("ack")
            return f"compensated after {e.step}"
        return "unreachable"

    t = WorkflowTest(wf)
    assert t.attempt().outcome == Outcome.WAITING
    assert log == ["undo b", "undo a"]
    done = t.run_to_end(events={"ack": True})
    assert done.result == "compensated after fail"
    assert log == ["undo b", "undo a"]

STAYS_ABORTED = "inside a Saga, which undid the work before it, so this run stays Aborted whatever the limits"


def test_a_budget_abort_compensates_in_reverse_and_a_raised_limit_does_not_redo_the_work() -> None:
    log: list[str] = []

    def act(what: str) -> None:
        log.append(what)

    async def wf(ctx: DurableContext, input: Any) -> Any:
        async with Saga(ctx) as saga:
            await ctx.step("book-flight", act, "book flight")
            ctx.add_cost(tokens=100)
            saga.add("cancel-flight", act, "cancel flight")
            await ctx.step("book-hotel", act, "book hotel")
            ctx.add_cost(tokens=100)
            saga.add("cancel-hotel", act, "cancel hotel")
            await ctx.step("charge", act, "charge")
        return "booked"

    t = WorkflowTest(wf, policy=Policy(maxTokens=200))
    first = t.attempt()
    assert first.outcome == Outcome.ABORTED
    assert first.abort_reason == AbortReason.BUDGET_EXHAUSTED
    assert "200 tokens used, limit 200 (policy.maxTokens" in (first.message or "")
    assert STAYS_ABORTED in (first.message or "")
    assert log == ["book flight", "book hotel", "cancel hotel", "cancel flight"]
    # Raising the limit does not charge after the bookings were cancelled: the run stays Aborted, as it was.
    again = t.attempt(policy=Policy(maxTokens=10_000))
    assert (again.outcome, again.abort_reason, again.message) == (first.outcome, first.abort_reason, first.message)
    assert log == ["book flight", "book hotel", "cancel hotel", "cancel flight"]
    assert done_steps(t) == ["book-flight", "book-hotel", "charge", "compensate:cancel-hotel",
                             "compensate:cancel-flight"]


def test_a_budget_abort_outside_a_saga_still_resumes_when_the_limit_is_raised() -> None:
    log: list[str] = []

    async def wf(ctx: DurableContext, input: Any) -> Any:
        async with Saga(ctx) as saga:
            saga.add("never", lambda: pytest.fail("compensated a finished block"))
            await ctx.step("inside", log.append, "inside")
        ctx.add_cost(tokens=100)
        await ctx.step("after", log.append, "after")
        return "done"

    t = WorkflowTest(wf, policy=Policy(maxTokens=100))
    aborted = t.attempt()
    assert aborted.outcome == Outcome.ABORTED
    assert STAYS_ABORTED not in (aborted.message or "")
    assert t.attempt(policy=Policy(maxTokens=1000)).result == "done"
    assert log == ["inside", "after"]


def test_a_budget_abort_kill_while_compensating_resumes_the_compensation(tmp_path: Path) -> None:
    log, go = tmp_path / "steps.log", tmp_path / "go"
    env = {"STEP_LOG": str(log), "GO_FILE": str(go)}
    store = ["--store", f"file://{tmp_path / 'store'}"]
    args = ["run", "saga_trip:trip_on_budget", "--run-id", "b1", *store, "--max-cost", "2", "--quiet"]
    first = launch(args, env, tmp_path)
    try:
        wait_until(lambda: "cancel flight-1 started" in _lines(log), "the flight's compensation to start")
    finally:
        kill(first)
    assert _lines(log) == ["book flight", "book hotel", "cancel hotel-1 started", "cancel hotel-1 done",
                           "cancel flight-1 started"]
    go.touch()
    done = cli(args, env, tmp_path)
    assert done.returncode == Outcome.ABORTED.exit_code, done.stderr
    assert "Aborted (BudgetExhausted)" in done.stderr
    assert "cost $2 reached the ceiling $2" in done.stderr
    assert STAYS_ABORTED in done.stderr
    # Only the compensation in flight at the kill ran again; the charge never ran.
    assert _lines(log)[5:] == ["cancel flight-1 started", "cancel flight-1 done"]
    records = json.loads(cli(["inspect", "--run-id", "b1", *store, "--json"], env, tmp_path).stdout)["records"]
    steps = [(r["name"], r["ok"]) for r in records if r["kind"] == "step"]
    assert steps == [("book-flight", True), ("book-hotel", True), ("charge", False),
                     ("compensate:cancel-hotel", True), ("compensate:cancel-flight", True)]


def test_a_user_abort_compensates_and_stays_final() -> None:
    log: list[str] = []
    hotel_booking = threading.Event()
    aborted = threading.Event()

    def book_hotel() -> None:
        hotel_booking.set()
        assert aborted.wait(30), "the test did not abort the run"
        log.append("book hotel")

    async def wf(ctx: DurableContext, input: Any) -> Any:
        async with Saga(ctx) as saga:
            await ctx.step("book-flight", log.append, "book flight")
            saga.add("cancel-flight", log.append, "cancel flight")
            await ctx.step("book-hotel", book_hotel)
            saga.add("cancel-hotel", log.append, "cancel hotel")
            await ctx.step("charge", log.append, "charge")
        return "booked"

    t = WorkflowTest(wf)
    run = Run(store=t.store, run=t.ref, workflow=wf, config=t.config)
    out: list[Any] = []
    runner = threading.Thread(target=lambda: out.append(run.run_attempt()), daemon=True)
    runner.start()
    assert hotel_booking.wait(30), "the hotel step did not start"
    run.request_abort(AbortReason.USER_REQUESTED, "aborted by request: no longer needed")
    aborted.set()
    runner.join(30)
    assert out, "the attempt did not end"
    result = out[0]
    assert (result.outcome, result.abort_reason) == (Outcome.ABORTED, AbortReason.USER_REQUESTED)
    assert (result.message or "").startswith("aborted by request: no longer needed; but it stopped 'charge'")
    # The step running at the abort finished and was journaled, then the abort stopped the charge.
    assert log == ["book flight", "book hotel", "cancel hotel", "cancel flight"]
    # The next attempt (no abort requested now) replays the abort rather than charging.
    again = t.attempt()
    assert (again.outcome, again.abort_reason, again.message) == (result.outcome, result.abort_reason,
                                                                  result.message)
    assert log == ["book flight", "book hotel", "cancel hotel", "cancel flight"]


def test_an_abort_while_compensating_a_failure_still_undoes_everything() -> None:
    log: list[str] = []
    runs: list[Run] = []

    def fail() -> None:
        raise NonRetryableError("card declined")

    def undo_hotel() -> None:
        log.append("cancel hotel")
        runs[0].request_abort(AbortReason.USER_REQUESTED, "aborted by request: stop")

    async def wf(ctx: DurableContext, input: Any) -> Any:
        async with Saga(ctx) as saga:
            saga.add("cancel-car", log.append, "cancel car")
            saga.add("cancel-flight", log.append, "cancel flight")
            saga.add("cancel-hotel", undo_hotel)
            await ctx.step("charge", fail)
        return "booked"

    t = WorkflowTest(wf)
    runs.append(Run(store=t.store, run=t.ref, workflow=wf, config=t.config))
    result = runs[0].run_attempt()
    assert (result.outcome, result.abort_reason) == (Outcome.ABORTED, AbortReason.USER_REQUESTED)
    assert log == ["cancel hotel", "cancel flight", "cancel car"]
    again = t.attempt()
    assert (again.outcome, again.message) == (result.outcome, result.message)
    assert log == ["cancel hotel", "cancel flight", "cancel car"]

def test_a_compensation_outlasting_max_duration_is_not_cancelled() -> None:
    log: list[str] = []

    def slow_cancel() -> None:
        time.sleep(2.5)  # longer than the engine's once-a-second maxDuration check while a step runs
        log.append("cancel flight")

    async def wf(ctx: DurableContext, input: Any) -> Any:
        async with Saga(ctx) as saga:
            await ctx.step("book-flight", log.append, "book flight")
            saga.add("cancel-flight", slow_cancel)
            await ctx.wait_for_event("go")
            await ctx.step("charge", log.append, "charge")
        return "booked"

    t = WorkflowTest(wf)
    assert t.attempt().outcome == Outcome.WAITING
    t.send_event("go", True)
    # The next attempt starts past policy.maxDuration (8h): the charge is refused, the flight cancelled.
    t.config = dataclasses.replace(t.config, active_before=timedelta(hours=9))
    result = t.attempt()
    assert (result.outcome, result.abort_reason) == (Outcome.ABORTED, AbortReason.MAX_DURATION_EXCEEDED)
    assert log == ["book flight", "cancel flight"]

# --- bounded history --------------------------------------------------------------------------------


def test_history_stays_in_budget_and_replays_the_same() -> None:
    summaries: list[int] = []

    def summarize(older: list[dict[str, Any]]) -> dict[str, Any]:
        summaries.append(len(older))
        # Progressive: a previous summary is among the older messages and is folded in.
        turns = sum(m.get("turns", 1) for m in older)
        return {"role": "system", "content": f"summary of {turns} turns", "turns": turns}

    async def agent(ctx: DurableContext, input: Any) -> Any:
        history: list[dict[str, Any]] = []
        for turn in range(12):
            history = [*history, {"role": "user", "content": f"turn {turn}: " + "x" * 10}]
            history = await bound_history(ctx, history, max_tokens=60, keep_last=2, summarize=summarize,
                                          count_tokens=lambda m: len(m["content"]))
            if turn == 6:
                await ctx.wait_for_event("half")
        return history

    t = WorkflowTest(agent)
    assert t.attempt().outcome == Outcome.WAITING
    first_attempt = list(summaries)
    t.send_event("half", True)
    done = t.attempt()
    assert done.outcome == Outcome.COMPLETED, done.message
    history = done.result
    assert sum(len(m["content"]) for m in history) <= 60
    assert history[0] == {"role": "system", "content": "summary of 10 turns", "turns": 10}
    assert [m["content"][:7] for m in history[1:]] == ["turn 10", "turn 11"]
    # The replay took the first attempt's summaries from the journal: summarize ran only for later turns,
    # and every call of it is one journaled step.
    assert first_attempt
    assert len(summaries) == len([n for n in done_steps(t) if n == "summarize"]) > len(first_attempt)


def done_steps(t: WorkflowTest) -> list[str]:
    rs = t.store.run_store(t.ref)
    try:
        return [r.name for r in rs.read_all() if r.kind == "step"]
    finally:
        rs.close()


def test_a_run_aborted_while_it_waits_inside_a_saga_compensates_on_its_next_attempt() -> None:
    log: list[str] = []

    async def wf(ctx: DurableContext, input: Any) -> Any:
        async with Saga(ctx) as saga:
            saga.add("never", lambda: pytest.fail("compensated a finished block"))
        async with Saga(ctx) as saga:
            await ctx.step("book-flight", log.append, "book flight")
            saga.add("cancel-flight", log.append, "cancel flight")
            await ctx.step("book-hotel", log.append, "book hotel")
            saga.add("cancel-hotel", log.append, "cancel hotel")
            await ctx.wait_for_event("approval", timeout=timedelta(days=2))
            await ctx.step("charge", log.append, "charge")
        return "booked"

    t = WorkflowTest(wf)
    waiting = t.attempt()
    assert waiting.outcome == Outcome.WAITING
    assert waiting.waiting is not None
    # The wait reports what an abort would have to undo (the operator starts an attempt for it).
    assert waiting.waiting.compensations == 2
    assert waiting.to_json()["waitingFor"]["compensations"] == 2
    # The attempt the operator starts with the abort: the wait aborts instead of waiting again, the Saga undoes.
    run = Run(store=t.store, run=t.ref, workflow=wf, config=t.config)
    run.request_abort(AbortReason.USER_REQUESTED, "aborted by request: trip cancelled")
    aborted = run.run_attempt()
    assert (aborted.outcome, aborted.abort_reason) == (Outcome.ABORTED, AbortReason.USER_REQUESTED)
    assert (aborted.message or "").startswith("aborted by request: trip cancelled; but it stopped 'approval'")
    assert log == ["book flight", "book hotel", "cancel hotel", "cancel flight"]
    # The approval arriving afterwards changes nothing: the journaled abort replays.
    t.send_event("approval", True)
    assert t.attempt().outcome == Outcome.ABORTED
    assert log == ["book flight", "book hotel", "cancel hotel", "cancel flight"]


def test_a_wait_outside_any_saga_reports_nothing_to_undo() -> None:
    async def wf(ctx: DurableContext, input: Any) -> Any:
        async with Saga(ctx) as saga:
            saga.add("never", lambda: pytest.fail("compensated a finished block"))
            await ctx.step("inside", lambda: 1)
        return await ctx.wait_for_event("go")

    waiting = WorkflowTest(wf).attempt()
    assert waiting.waiting is not None
    assert waiting.waiting.compensations == 0
    assert "compensations" not in waiting.to_json()["waitingFor"]
