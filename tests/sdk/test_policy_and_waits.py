"""Budgets, event waits, durable sleeps, graceful stop, fencing and progress sinks."""

from __future__ import annotations

import asyncio
import io
import json
import logging
import threading
import time
import uuid
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from typing import Any

import pytest

from durablerun import DurableContext, EventTimeout, StepError
from durablerun._private.storage.backends import memory
from durablerun._private.storage.backends.memory import MemoryBackend
from durablerun._private.storage.stores import Store
from durablerun.api import AbortReason, Outcome
from durablerun.engine import AttemptResult, EngineConfig, Run
from durablerun.resource import AskAt, Policy
from durablerun.sinks import EventKind, JsonLinesSink, ProgressEvent, ProgressSink
from durablerun.stores import RunRef
from tests.helpers.local_runs import StoreSpec, wait_until

from .helpers import FAST, REF, Ledger, attempt

# --- budgets -------------------------------------------------------------------------------


async def charging(ctx: DurableContext, input: Any) -> Any:
    out = []
    for i in range(input["steps"]):
        def call(i: int = i) -> int:
            ctx.add_cost(usd=Decimal("0.25"), tokens=100)
            return i
        out.append(await ctx.step(f"llm-{i}", call))
    return out


def test_cost_ceiling_aborts_and_raising_it_resumes(store_spec: StoreSpec) -> None:
    store = store_spec.open()
    r1 = attempt(store, charging, {"steps": 8}, policy=Policy(costCeilingUSD="1.00"))
    assert r1.outcome == Outcome.ABORTED
    assert r1.exit_code == 3
    assert r1.abort_reason == AbortReason.BUDGET_EXHAUSTED
    assert "$1.00" in r1.message
    assert "raise policy.costCeilingUSD" in r1.message  # embedded: the CLI and the pod say how
    assert r1.totals.usd == Decimal("1.00")
    assert r1.totals.steps == 4
    info = store.read_run(run=REF)
    assert info.status
    assert info.status["outcome"] == "Aborted"
    assert info.snapshot_seq == 3  # the final checkpoint covers every record
    # Same limit: still aborted, nothing executed again.
    again = attempt(store, charging, {"steps": 8}, policy=Policy(costCeilingUSD="1.00"))
    assert again.outcome == Outcome.ABORTED
    assert again.totals.steps == 4
    r2 = attempt(store, charging, {"steps": 8}, policy=Policy(costCeilingUSD="5"))
    assert r2.outcome == Outcome.COMPLETED
    assert r2.result == list(range(8))
    assert r2.totals.usd == Decimal("2.00")
    assert r2.totals.tokens == 800
    assert r2.totals.steps == 8


@pytest.mark.parametrize(("ask", "raised", "reached"), [
    (AskAt(costUSD="1.00"), AskAt(costUSD="1.50"), "costUSD"),
    (AskAt(tokens=300), AskAt(tokens=500), "tokens"),
], ids=["cost", "tokens"])
def test_a_soft_budget_waits_for_a_person_and_a_raised_one_goes_on(
        mem: Store, ask: AskAt, raised: AskAt, reached: str) -> None:
    ledger = Ledger()

    async def wf(ctx: DurableContext, input: Any) -> Any:
        out = []
        for i in range(8):
            def call(i: int = i) -> int:
                ledger.hit(f"llm-{i}")
                ctx.add_cost(usd=Decimal("0.25"), tokens=100)
                return i
            out.append(await ctx.step(f"llm-{i}", call))
        return out

    asked = attempt(mem, wf, policy=Policy(costCeilingUSD="10", askAt=ask))
    assert asked.outcome == Outcome.WAITING
    assert asked.waiting is not None
    assert asked.waiting.budget == reached
    assert f"policy.askAt.{reached} reached" in asked.message
    steps_at_ask = asked.totals.steps
    # The same limit: it asks again, and runs nothing.
    again = attempt(mem, wf, policy=Policy(costCeilingUSD="10", askAt=ask))
    assert (again.outcome, again.totals.steps) == (Outcome.WAITING, steps_at_ask)
    more = attempt(mem, wf, policy=Policy(costCeilingUSD="10", askAt=raised))
    assert more.outcome == Outcome.WAITING
    assert more.totals.steps > steps_at_ask
    done = attempt(mem, wf, policy=Policy(costCeilingUSD="10"))  # removed: no more asking
    assert done.outcome == Outcome.COMPLETED
    assert ledger.calls == {f"llm-{i}": 1 for i in range(8)}  # nothing ran twice
    # The ceiling still aborts, before the soft limit asks.
    hard = attempt(mem, wf, ref=RunRef.local("hard"), policy=Policy(costCeilingUSD="0.50", askAt=ask))
    assert (hard.outcome, hard.abort_reason) == (Outcome.ABORTED, AbortReason.BUDGET_EXHAUSTED)


def test_token_and_step_budgets(mem: Store) -> None:
    r = attempt(mem, charging, {"steps": 8}, policy=Policy(maxTokens=300))
    assert r.outcome == Outcome.ABORTED
    assert r.totals.tokens == 300
    assert "maxTokens" in r.message
    other = RunRef.local("steps")
    r = attempt(mem, charging, {"steps": 8}, ref=other, policy=Policy(maxSteps=5))
    assert r.outcome == Outcome.ABORTED
    assert r.totals.steps == 5
    assert "maxSteps" in r.message
    r = attempt(mem, charging, {"steps": 8}, ref=other, policy=Policy(maxSteps=8))
    assert r.outcome == Outcome.COMPLETED


def test_the_step_budget_counts_steps_still_running(mem: Store) -> None:
    async def wf(ctx: DurableContext, input: Any) -> Any:
        await ctx.step("a", lambda: 0)
        return await ctx.gather(ctx.step("b", lambda: 1), ctx.step("c", lambda: 2))

    r = attempt(mem, wf, policy=Policy(maxSteps=2))
    assert r.outcome == Outcome.ABORTED
    # c was refused while b ran: the message counts b, and the journal ends with 2 steps.
    assert "1 step journaled and 1 running, limit 2 (policy.maxSteps, checked before each step " \
        "starts)" in r.message
    assert r.totals.steps == 2


def test_a_cost_charged_past_the_ceiling_by_the_last_step_is_reported(mem: Store) -> None:
    r = attempt(mem, charging, {"steps": 3}, policy=Policy(costCeilingUSD="0.60"))
    assert r.outcome == Outcome.COMPLETED  # each step started below the ceiling
    assert r.totals.usd == Decimal("0.75")
    expected = "budget overshoot: cost $0.75 is past policy.costCeilingUSD $0.60"
    assert expected in r.message
    assert r.overshoot is not None
    assert r.to_json()["overshoot"] == r.overshoot
    status = mem.read_run(run=REF).status or {}
    assert expected in status["overshoot"]
    assert expected in status["message"]
    assert attempt(mem, charging, {"steps": 3}, ref=RunRef.local("under"),
                   policy=Policy(costCeilingUSD="0.75")).overshoot is None


def test_abort_messages_on_kubernetes_give_kubectl_advice(mem: Store) -> None:
    from durablerun._private.pod.attempt import kubectl_advice

    config = EngineConfig(policy_advice=kubectl_advice("team", "agent"))
    r = Run(store=mem, run=RunRef.kubernetes("team", "agent", "u1"), workflow=charging,
            input={"steps": 8}, policy=Policy(costCeilingUSD="0.50"), config=config).run_attempt()
    assert r.outcome == Outcome.ABORTED
    assert ("raise it and the run resumes: kubectl patch dr agent -n team --type merge -p "
            """'{"spec":{"policy":{"costCeilingUSD":"<higher>"}}}'""") in r.message
    assert "--max" not in r.message
    assert "run again" not in r.message


def test_a_declared_total_is_the_progress_denominator_while_running_and_on_replay(
        mem: Store) -> None:
    from durablerun._private.pod.lease import StatusSink

    async def wf(ctx: DurableContext, input: Any) -> Any:
        ctx.set_total_steps(input["n"])
        await ctx.step("a", lambda: 1)
        await ctx.step("b", lambda: 2)
        await ctx.wait_for_event("go")
        ctx.set_total_steps(input["n"] + 1)  # the estimate grew
        await ctx.step("c", lambda: 3)
        return await ctx.step("d", lambda: 4)

    sink, log = StatusSink(), io.StringIO()
    first = Run(store=mem, run=REF, workflow=wf, input={"n": 3}, sinks=[sink, JsonLinesSink(log)],
                config=FAST).run_attempt()
    assert first.outcome == Outcome.WAITING
    # What the runner pod puts in status.progress (the Progress column, the ratio metric).
    assert sink.take()["progress"] == {"completedSteps": 2, "totalSteps": 3, "fraction": "0.6667",
                                       "summary": "2/3", "step": 1, "stepName": "b",
                                       "lastProgressTime": ANY_TIME, "inFlight": None}
    assert '"event":"total_steps","total":3,"steps":0' in log.getvalue()
    assert (mem.read_run(run=REF).status or {})["totalSteps"] == 3
    mem.put_event(run=REF, name="go", payload=None)
    again = StatusSink()
    done = Run(store=mem, run=REF, workflow=wf, input={"n": 3}, sinks=[again],
               config=FAST).run_attempt()
    assert done.outcome == Outcome.COMPLETED
    progress = again.take()["progress"]
    assert (progress["totalSteps"], progress["summary"], progress["fraction"]) == (4, "4/4", "1")

    async def in_a_step(ctx: DurableContext, input: Any) -> Any:
        return await ctx.step("s", lambda: ctx.set_total_steps(3))

    r = attempt(mem, in_a_step, ref=RunRef.local("in-step"))
    assert r.outcome == Outcome.FAILED
    assert "ctx.set_total_steps() was called inside a step" in r.message


def test_the_step_in_flight_is_reported_until_it_is_journaled(mem: Store) -> None:
    """status.progress.inFlight: what the operator names when the attempt ends mid-step (a crash, a fence)."""
    from durablerun._private.pod.lease import StatusSink, _status_ops

    sink = StatusSink()
    seen: list[dict[str, Any]] = []

    def b() -> int:
        seen.append(sink.take()["progress"])  # what the next lease renewal would ship, from inside the step
        return 2

    async def wf(ctx: DurableContext, input: Any) -> Any:
        await ctx.step("a", lambda: 1)
        return await ctx.step("b", b)

    assert Run(store=mem, run=REF, workflow=wf, input={}, sinks=[sink], config=FAST).run_attempt().outcome \
        == Outcome.COMPLETED
    (during,) = seen
    assert during["inFlight"] == {"name": "b", "position": ANY_TEXT, "attempt": 1, "startTime": ANY_TIME}
    assert during["stepName"] == "b"
    # Journaled: the renewal clears it from the status, keeping the rest of the progress.
    shipped = _status_ops(sink.take(), {"progress": during})
    (op,) = (o for o in shipped if o["path"] == "/status/progress")
    assert "inFlight" not in op["value"]
    assert op["value"]["stepName"] == "b"


class _AnyText:
    def __eq__(self, other: object) -> bool:
        return isinstance(other, str) and bool(other)


ANY_TEXT = _AnyText()


class _AnyTime:
    def __eq__(self, other: object) -> bool:
        return isinstance(other, str) and other.endswith("Z")


ANY_TIME = _AnyTime()


def test_max_duration_counts_from_the_first_start(mem: Store) -> None:
    async def wf(ctx: DurableContext, input: Any) -> Any:
        await ctx.step("a", lambda: 1)
        await ctx.wait_for_event("e")
        return await ctx.step("b", lambda: 2)

    assert attempt(mem, wf).outcome == Outcome.WAITING
    mem.put_event(run=REF, name="e", payload=None)
    time.sleep(0.02)
    r = attempt(mem, wf, policy=Policy(maxDuration="10ms"))
    assert r.outcome == Outcome.ABORTED
    assert r.abort_reason == AbortReason.MAX_DURATION_EXCEEDED
    assert attempt(mem, wf, policy=Policy(maxDuration="1h")).result == 2


def test_progress_timeout_aborts_a_hanging_step(mem: Store) -> None:
    async def hang() -> None:
        await asyncio.sleep(60)

    async def wf(ctx: DurableContext, input: Any) -> Any:
        await ctx.step("ok", lambda: 1)
        return await ctx.step("hang", hang)

    started = time.monotonic()
    r = attempt(mem, wf, policy=Policy(progressTimeout="300ms"))
    assert r.outcome == Outcome.ABORTED
    assert r.abort_reason == AbortReason.PROGRESS_TIMEOUT
    assert time.monotonic() - started < 10
    assert r.totals.steps == 1


# --- events --------------------------------------------------------------------------------------


async def approval_flow(ctx: DurableContext, input: Any) -> Any:
    draft = await ctx.step("draft", lambda: "draft-1")
    try:
        decision = await ctx.wait_for_event(
            "review", timeout=timedelta(seconds=input.get("timeout", 3600)))
    except EventTimeout:
        return {"draft": draft, "decision": "timed out"}
    return {"draft": draft, "decision": decision}


def test_event_wait_send_and_deliver(store_spec: StoreSpec) -> None:
    store = store_spec.open()
    r1 = attempt(store, approval_flow)
    assert r1.outcome == Outcome.WAITING
    assert r1.exit_code == 4
    assert r1.waiting
    assert r1.waiting.event == "review"
    assert r1.waiting.deadline is not None
    status = store.read_run(run=REF).status
    assert status
    assert status["waitingFor"]["event"] == "review"
    assert store.put_event(run=REF, name="review", payload={"status": "approved"})
    assert not store.put_event(run=REF, name="review", payload={"status": "rejected"})
    r2 = attempt(store, approval_flow)
    assert r2.outcome == Outcome.COMPLETED
    assert r2.result == {"draft": "draft-1", "decision": {"status": "approved"}}


def test_event_timeout_in_process_and_after_a_restart(mem: Store) -> None:
    r = attempt(mem, approval_flow, {"timeout": 0.3})
    assert r.outcome == Outcome.COMPLETED
    assert r.result["decision"] == "timed out"

    # A deadline too far for an in-process wait: Waiting, and later the timeout.
    cfg = EngineConfig(inline_sleep_max=timedelta(milliseconds=50),
                       retry_initial=timedelta(milliseconds=1))
    ref = RunRef.local("late")
    r1 = attempt(mem, approval_flow, {"timeout": 1.5}, ref=ref, config=cfg)
    assert r1.outcome == Outcome.WAITING
    assert r1.waiting is not None
    deadline = r1.waiting.deadline
    assert deadline is not None
    wait_until(lambda: datetime.now(UTC) >= deadline, timeout=10, what="the deadline")
    r2 = attempt(mem, approval_flow, {"timeout": 1.5}, ref=ref, config=cfg)
    assert r2.result["decision"] == "timed out"
    # The timeout is journaled: an event arriving afterwards changes nothing.
    mem.put_event(run=ref, name="review", payload="too late")
    r3 = attempt(mem, approval_flow, {"timeout": 1.5}, ref=ref, config=cfg)
    assert r3.result["decision"] == "timed out"


class _RaceBackend(MemoryBackend):
    """Delivers the event right after the runner's first look found nothing."""

    def __init__(self, name: str, after_status: bool) -> None:
        super().__init__(name)
        self.after_status = after_status
        self.sent: bool | None = None
        self.status_when_sent: Any = None
        self.store: Store | None = None

    def get(self, key: str) -> bytes | None:
        data = super().get(key)
        if (key.endswith("/events/review.json") and data is None and self.sent is None
                and not self.after_status):
            self._send()
        return data

    def cas(self, key: str, data: bytes, *, etag: str | None) -> str | None:
        written = super().cas(key, data, etag=etag)
        # Right after the attempt published that it waits (not its claim of status.json when it started).
        if key.endswith("/status.json") and b"Waiting" in data and self.after_status and self.sent is None:
            self._send()
        return written

    def _send(self) -> None:
        assert self.store is not None
        self.sent = self.store.put_event(run=REF, name="review", payload="raced")
        self.status_when_sent = self.store.read_run(run=REF).status


@pytest.mark.parametrize("after_status", [False, True])
def test_an_event_sent_while_the_run_decides_to_wait_is_never_lost(after_status: bool) -> None:
    """The runner publishes 'waiting' and then looks again; a sender writes the
    event and then reads the status. Whichever side goes second sees the other."""
    name = uuid.uuid4().hex
    backend = _RaceBackend(name, after_status)
    store = Store(backend, f"memory://{name}")
    backend.store = store
    r = attempt(store, approval_flow)
    assert backend.sent is True
    # Delivered within the same attempt: no Waiting outcome, no lost wake-up.
    assert r.outcome == Outcome.COMPLETED
    assert r.result["decision"] == "raced"
    if after_status:
        # The sender saw the run waiting for its event (it would wake the run).
        assert backend.status_when_sent["outcome"] == "Waiting"
    memory.reset(name)


# --- sleeps ---------------------------------------------------------------------------------------


async def sleepy(ctx: DurableContext, input: Any) -> Any:
    await ctx.step("before", lambda: 1)
    await ctx.sleep(timedelta(seconds=input["seconds"]))
    return await ctx.step("after", lambda: 2)


def test_short_sleeps_sleep_in_process(mem: Store) -> None:
    started = time.monotonic()
    assert attempt(mem, sleepy, {"seconds": 0.2}).result == 2
    assert time.monotonic() - started >= 0.2


def test_long_sleeps_end_the_attempt_with_a_wake_time(mem: Store) -> None:
    cfg = EngineConfig(inline_sleep_max=timedelta(milliseconds=50))
    before = datetime.now(UTC)
    r1 = attempt(mem, sleepy, {"seconds": 2}, config=cfg)
    assert r1.outcome == Outcome.WAITING
    assert r1.waiting is not None
    wake = r1.waiting.wake_time
    assert wake is not None
    assert r1.waiting.event is None
    assert before + timedelta(seconds=1.99) <= wake
    # Too early: still waiting, for the same wake time (it is journaled).
    r2 = attempt(mem, sleepy, {"seconds": 2}, config=cfg)
    if datetime.now(UTC) < wake - timedelta(milliseconds=100):
        assert r2.outcome == Outcome.WAITING
        assert r2.waiting is not None
        assert r2.waiting.wake_time == wake
    wait_until(lambda: datetime.now(UTC) >= wake, timeout=10, what="wake time")
    assert attempt(mem, sleepy, {"seconds": 2}, config=cfg).result == 2


# --- stop and fence ----------------------------------------------------------------------------------


def _start(run: Run) -> tuple[threading.Thread, list[AttemptResult]]:
    out: list[AttemptResult] = []
    t = threading.Thread(target=lambda: out.append(run.run_attempt()))
    t.start()
    return t, out


def test_stop_waits_for_the_running_step_then_suspends(mem: Store) -> None:
    ledger = Ledger()
    in_step = threading.Event()
    release = threading.Event()

    def slow(i: int) -> int:
        ledger.hit(f"s{i}")
        if i == 1:
            in_step.set()
            assert release.wait(10)
        return i

    async def wf(ctx: DurableContext, input: Any) -> Any:
        return [await ctx.step(f"s{i}", slow, i) for i in range(4)]

    run = Run(store=mem, run=REF, workflow=wf, config=FAST)
    t, out = _start(run)
    assert in_step.wait(10)
    run.request_stop(grace=timedelta(seconds=10))
    release.set()
    t.join(10)
    assert out[0].outcome == Outcome.SUSPENDED
    assert out[0].exit_code == 4
    assert out[0].totals.steps == 2  # the running step finished and was journaled
    r = attempt(mem, wf)
    assert r.result == [0, 1, 2, 3]
    assert all(ledger.calls[f"s{i}"] == 1 for i in range(4))


def test_stop_after_the_grace_period_cancels_the_step(mem: Store) -> None:
    ledger = Ledger()
    started = threading.Event()

    async def stuck() -> str:
        ledger.hit("stuck")
        started.set()
        await asyncio.sleep(30)
        return "never"

    async def wf(ctx: DurableContext, input: Any) -> Any:
        await ctx.step("first", lambda: 1)
        return await ctx.step("stuck", stuck)

    run = Run(store=mem, run=REF, workflow=wf, config=FAST)
    t, out = _start(run)
    assert started.wait(10)
    run.request_stop(grace=timedelta(milliseconds=100))
    t.join(10)
    assert out[0].outcome == Outcome.SUSPENDED
    assert out[0].totals.steps == 1


def test_fence_stops_at_once_and_writes_nothing_more(store_spec: StoreSpec) -> None:
    store = store_spec.open()
    started = threading.Event()

    async def slow(i: int) -> int:
        started.set()
        await asyncio.sleep(0.05)
        return i

    async def wf(ctx: DurableContext, input: Any) -> Any:
        return [await ctx.step(f"s{i}", slow, i) for i in range(1000)]

    run = Run(store=store, run=REF, workflow=wf, config=FAST)
    t, out = _start(run)
    assert started.wait(10)
    run.fence("lease lost to pod x-a2")
    t.join(10)
    assert out[0].outcome == Outcome.FENCED
    assert out[0].exit_code == 5
    assert "lease lost" in out[0].message
    count = store.read_run(run=REF).journal_records
    time.sleep(0.2)
    assert store.read_run(run=REF).journal_records == count
    assert store.read_run(run=REF).status is None  # a fenced attempt records nothing


# --- sinks ------------------------------------------------------------------------------------------


class Recorder(ProgressSink):
    def __init__(self) -> None:
        self.events: list[tuple[str, Any]] = []

    def step_started(self, *, position: str, name: str, attempt: int) -> None:
        self.events.append(("started", (position, name, attempt)))

    def step_completed(self, *, position: str, name: str, seq: int, ok: bool,
                       duration: float) -> None:
        self.events.append(("completed", (position, name, seq, ok)))

    def cost_updated(self, *, usd: Decimal, tokens: int, steps: int) -> None:
        self.events.append(("cost", (usd, tokens, steps)))

    def checkpoint_saved(self, *, seq: int, key: str) -> None:
        self.events.append(("checkpoint", seq))

    def heartbeat(self, *, time: datetime) -> None:
        self.events.append(("heartbeat", None))

    def run_finished(self, *, result: AttemptResult) -> None:
        self.events.append(("finished", result.outcome))


class Broken(ProgressSink):
    def step_started(self, *, position: str, name: str, attempt: int) -> None:
        raise RuntimeError("sink bug")


def test_progress_sinks_see_steps_cost_checkpoints_and_the_outcome(mem: Store) -> None:
    rec = Recorder()
    stream = io.StringIO()
    cfg = EngineConfig(heartbeat_interval=timedelta(milliseconds=20), snapshot_every=100)

    async def slow() -> None:
        await asyncio.sleep(0.1)

    async def wf(ctx: DurableContext, input: Any) -> Any:
        await ctx.step("a", lambda: ctx.add_cost(usd="0.5", tokens=5))
        await ctx.step("slow", slow)
        return "ok"

    r = attempt(mem, wf, config=cfg, sinks=[Broken(), rec, JsonLinesSink(stream)])
    assert r.outcome == Outcome.COMPLETED
    kinds = [k for k, _ in rec.events]
    assert ("started", ("0", "a", 1)) in rec.events
    assert ("completed", ("0", "a", 0, True)) in rec.events
    assert ("cost", (Decimal("0.5"), 5, 1)) in rec.events
    assert ("checkpoint", 0) in rec.events
    assert "heartbeat" in kinds
    assert kinds[-1] == "finished"
    lines = [json.loads(line) for line in stream.getvalue().splitlines()]
    assert lines[0]["event"] == "run_started"
    assert lines[-1] == {**lines[-1], "event": "run_finished", "outcome": "Completed"}


def test_a_stop_ends_an_in_process_wait_promptly(mem: Store) -> None:
    """A short event deadline is waited out in process; SIGTERM must not wait for it."""
    cfg = EngineConfig(inline_sleep_max=timedelta(seconds=60))
    run = Run(store=mem, run=REF, workflow=approval_flow, input={"timeout": 50}, config=cfg)
    t, out = _start(run)
    wait_until(lambda: (mem.read_run(run=REF).status or {}).get("outcome") == "Waiting",
               timeout=10, what="the run to wait in process")
    started = time.monotonic()
    run.request_stop()
    t.join(10)
    assert out, "the attempt did not end"
    assert time.monotonic() - started < 5
    assert out[0].outcome == Outcome.WAITING
    assert out[0].waiting is not None
    assert out[0].waiting.event == "review"


def test_control_requests_are_safe_from_a_signal_handler_holding_the_lock(mem: Store) -> None:
    """A signal handler runs on the main thread, possibly while it holds the run's
    control lock: requesting a stop from there must not deadlock."""
    run = Run(store=mem, run=REF, workflow=approval_flow, config=FAST)
    done = threading.Event()

    def handler_while_locked() -> None:
        with run._lock:  # what the main thread may hold when the signal lands
            run.request_stop()
            run.request_abort()
            run.fence("x")
        done.set()

    t = threading.Thread(target=handler_while_locked, daemon=True)
    t.start()
    assert done.wait(5), "deadlock"


# --- sync step functions: threads -----------------------------------------------------------------


def test_sync_steps_in_a_gather_run_in_parallel(mem: Store) -> None:
    """Four sync steps that can only finish together (a barrier of four): they must run at
    the same time, each on its own thread."""
    barrier = threading.Barrier(4, timeout=10)
    threads: set[str] = set()

    def meet(i: int) -> int:
        threads.add(threading.current_thread().name)
        barrier.wait()
        return i

    async def wf(ctx: DurableContext, input: Any) -> Any:
        return await ctx.gather(*[ctx.step(f"m{i}", meet, i) for i in range(4)])

    r = attempt(mem, wf)
    assert r.outcome == Outcome.COMPLETED, r.message
    assert r.result == [0, 1, 2, 3]
    assert len(threads) == 4
    assert threading.current_thread().name not in threads


def test_a_stuck_sync_step_is_abandoned_after_the_grace_period(mem: Store) -> None:
    started = threading.Event()
    release = threading.Event()
    finished = threading.Event()

    def stuck() -> str:
        started.set()
        release.wait(30)
        finished.set()
        return "late"

    async def wf(ctx: DurableContext, input: Any) -> Any:
        await ctx.step("first", lambda: 1)
        return await ctx.step("stuck", stuck)

    run = Run(store=mem, run=REF, workflow=wf, config=FAST)
    t, out = _start(run)
    try:
        assert started.wait(10)
        run.request_stop(grace=timedelta(milliseconds=100))
        t.join(10)
        assert not t.is_alive()
        assert out[0].outcome == Outcome.SUSPENDED
        assert out[0].totals.steps == 1
    finally:
        release.set()
    # The abandoned step finishing later writes nothing (its attempt, and loop, are gone).
    assert finished.wait(10)
    assert mem.read_run(run=REF).journal_records == 1


def test_a_fence_ends_the_attempt_while_a_sync_step_runs(mem: Store) -> None:
    started = threading.Event()
    release = threading.Event()

    def slow() -> str:
        started.set()
        release.wait(30)
        return "late"

    async def wf(ctx: DurableContext, input: Any) -> Any:
        return await ctx.step("slow", slow)

    run = Run(store=mem, run=REF, workflow=wf, config=FAST)
    t, out = _start(run)
    try:
        assert started.wait(10)
        run.fence("lease lost")
        t.join(10)
        assert not t.is_alive()
        assert out[0].outcome == Outcome.FENCED
    finally:
        release.set()
    assert mem.read_run(run=REF).journal_records == 0


def test_progress_timeout_aborts_a_hanging_sync_step(mem: Store) -> None:
    release = threading.Event()

    def hang() -> None:
        release.wait(30)

    async def wf(ctx: DurableContext, input: Any) -> Any:
        await ctx.step("ok", lambda: 1)
        return await ctx.step("hang", hang)

    try:
        r = attempt(mem, wf, policy=Policy(progressTimeout="300ms"))
    finally:
        release.set()
    assert r.outcome == Outcome.ABORTED
    assert r.abort_reason == AbortReason.PROGRESS_TIMEOUT
    assert r.totals.steps == 1


def test_sync_steps_see_the_step_context_and_raise_through(mem: Store) -> None:
    seen: list[str] = []

    def charged(ctx: DurableContext) -> int:
        seen.append(ctx.idempotency_key())
        ctx.add_cost(usd=Decimal("0.5"), tokens=7)
        return 1

    def broken() -> None:
        raise ValueError("bad value")

    async def wf(ctx: DurableContext, input: Any) -> Any:
        await ctx.step("charged", charged, ctx)
        try:
            await ctx.step("broken", broken, retries=0)
        except StepError as e:
            return e.type_name
        return None

    r = attempt(mem, wf)
    assert r.result == "ValueError"
    assert seen == ["_local/t:0:charged"]
    assert r.totals.usd == Decimal("0.5")
    assert r.totals.tokens == 7


def test_more_sync_steps_than_threads_queue_up_and_all_complete(mem: Store) -> None:
    threads: set[str] = set()
    lock = threading.Lock()
    running = {"now": 0, "max": 0}

    def work(i: int) -> int:
        with lock:
            threads.add(threading.current_thread().name)
            running["now"] += 1
            running["max"] = max(running["max"], running["now"])
        time.sleep(0.002)
        with lock:
            running["now"] -= 1
        return i * i

    async def wf(ctx: DurableContext, input: Any) -> Any:
        first = await ctx.gather(*[ctx.step(f"w{i}", work, i) for i in range(10)])
        then = [await ctx.step(f"s{i}", work, i) for i in range(5)]
        return [first, then]

    cfg = EngineConfig(max_sync_threads=2, snapshot_every=4)
    r = attempt(mem, wf, config=cfg)
    assert r.outcome == Outcome.COMPLETED, r.message
    assert r.result == [[i * i for i in range(10)], [i * i for i in range(5)]]
    assert len(threads) == 2
    assert running["max"] == 2


def test_a_sink_gets_every_event_through_one_emit_and_nothing_is_printed_around_it(
        mem: Store, caplog: pytest.LogCaptureFixture, capsys: pytest.CaptureFixture[str]) -> None:
    events: list[ProgressEvent] = []

    class Everything(ProgressSink):
        def emit(self, event: ProgressEvent) -> None:
            events.append(event)

    async def wf(ctx: DurableContext, input: Any) -> Any:
        await ctx.step("a", lambda: 1)
        raise ValueError("boom")

    with caplog.at_level(logging.ERROR, logger="durablerun"):
        r = attempt(mem, wf, sinks=[Everything()])
    assert r.outcome == Outcome.FAILED
    assert [e.kind for e in events] == [
        EventKind.RUN_STARTED, EventKind.STEP_STARTED, EventKind.RECORD_JOURNALED, EventKind.CHECKPOINT_SAVED,
        EventKind.COST_UPDATED, EventKind.STEP_COMPLETED,
        EventKind.CHECKPOINT_SAVED,  # the final snapshot
        EventKind.RUN_FINISHED]
    assert events[-1].fields["result"] is r
    # The traceback goes to the "durablerun" logger, not straight to stderr.
    assert "the workflow raised" in caplog.text
    assert "ValueError: boom" in caplog.text
    assert "boom" not in capsys.readouterr().err
