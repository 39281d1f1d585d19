"""The runtime of one attempt: runs the operations the workflow asks for.

:class:`AttemptCore` is what :class:`~durablerun._private.engine.context.DurableContext`
calls. It asks the replay layer (:mod:`durablerun._private.engine.replay`) whether an
operation is journaled and, when not, executes it (step functions on the
worker threads of :mod:`durablerun._private.engine.workers`), appends its record
through the writer (one record at a time, in order, behind the write guard)
and saves snapshots on a thread of its own. The loop, controls and heartbeats
around it are the engine's (:mod:`durablerun._private.engine.run`), which uses the
small interface listed in :class:`AttemptCore`'s docstring. It is one module
of several hundred lines because it is one class, every operation of which
reads as "replayed or executed, then appended" against the same state.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import random
import time
import uuid
from collections.abc import Awaitable, Callable
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from typing import Any, NoReturn, TypeVar

from durablerun import errors
from durablerun._private.engine import sagas
from durablerun._private.engine.halts import Halt, HaltKind, Waiting
from durablerun._private.engine.replay import (
    SCOPE,
    STEP,
    ContinueAsNew,
    Live,
    Scope,
    StepFrame,
    budget_halt,
    budget_overshoot,
    charge_step,
    duration_halt,
    gather,
    gen_prefix,
    in_scope,
    misuse,
    pos_str,
)
from durablerun._private.engine.results import Results, fresh, store_halt
from durablerun._private.engine.sinks import EventKind, SinkSet
from durablerun._private.engine.streams import Stream, Streams
from durablerun._private.engine.workers import StepThreads, own_traceback
from durablerun._private.engine.writer import Writer
from durablerun._private.records.model import (
    CompleteRecord,
    ContinueRecord,
    EngineConfig,
    EventRecord,
    PatchRecord,
    Payload,
    ResultRecord,
    SleepRecord,
    StepRecord,
    Totals,
    ValueRecord,
    WaitRecord,
)
from durablerun._private.storage.journal import Loaded, RunStore
from durablerun._private.storage.streams import StreamObjects
from durablerun.api import AbortReason, format_time, parse_duration, parse_time
from durablerun.resource import Policy

T = TypeVar("T")
_NO_PAYLOAD = Payload(None, None, None)


class AttemptCore:
    """Runs the operations a workflow asks for, for one attempt. Created by the engine.

    One method per DurableContext operation (step, sleep, wait_for_event, now,
    uuid, patched, add_cost, continue_as_new, gather), each reading as "replayed
    or executed, then appended": that is why it is a few hundred lines. Replay
    decisions are :mod:`durablerun._private.engine.replay`'s, appends the
    :class:`~durablerun._private.engine.writer.Writer`'s, Sagas the
    :class:`~durablerun._private.engine.sagas.Ledger`'s.

    It has two clients, each held by mypy to its own face (:mod:`durablerun._private.engine.seams`):
    the engine (:class:`~durablerun._private.engine.run.Run`) to ``EngineFace`` (its life, the controls,
    the passes, the queries an outcome is reported from), the workflow's context to ``ContextFace``
    (one operation per context method).
    """

    def __init__(
        self,
        *,
        store: RunStore,
        loaded: Loaded,
        policy: Policy,
        config: EngineConfig,
        sinks: SinkSet,
        run_key: str,
        attempt_id: str,
        first_start: datetime,
        io_pool: ThreadPoolExecutor,
    ) -> None:
        self.store = store
        #: The generation being run, and the continue_as_new record that started it.
        self.continuation: ContinueRecord | None = loaded.continuation
        self.gen = self.continuation.gen if self.continuation else 0
        # Resume in the generation the last ctx.continue_as_new started.
        self.live = live = Live(loaded, totals=loaded.totals, prefix=gen_prefix(self.gen), probe=config.replay)
        for record in loaded.records:
            live.add(record)
        self.policy = policy
        self.config = config
        self.sinks = sinks
        self.run_key = run_key
        self.attempt_id = attempt_id
        self.first_start = first_start
        self._io_pool = io_pool
        self._loop = asyncio.get_running_loop()
        self._step_threads = StepThreads(config.max_sync_threads, config.sync_steps_in_threads)
        self.writer = Writer(store=store, live=live, config=config, sinks=sinks,
                             attempt_id=attempt_id)
        self.sagas = sagas.Ledger(self.writer)
        self.streams = Streams(StreamObjects(store.backend, store.ref), attempt_id, config, self.writer.refuse_writes)
        self.results = Results(store, config, self.io)
        self.reached: set[str] = set()
        self.stop_requested = False
        self.abort_requested: tuple[AbortReason, str] | None = None
        #: Set (on the loop) once a control is applied: ends in-process waits (pause).
        self.stop_event = asyncio.Event()
        self.max_cost = Decimal(policy.costCeilingUSD) if policy.costCeilingUSD else None
        self.max_duration = parse_duration(policy.maxDuration)
        #: Set once this generation's continue_as_new record is durable.
        self.continued: ContinueRecord | None = None

    def close(self) -> None:
        self.streams.close()
        self.writer.close()
        self._step_threads.close()

    # --- the engine's interface: controls ---------------------------------------------
    def apply_controls(self, *, fence: str | None, abort: tuple[AbortReason, str] | None,
                       stop: bool) -> None:
        """Take the run's controls (each, once set, stays set). Safe from any thread and from a
        signal handler: plain attribute writes, so the very next operation sees them; waits in
        process end on the loop."""
        if fence and not self.writer.fenced:
            self.writer.fenced = fence
        if abort and not self.abort_requested:
            self.abort_requested = abort
        if stop:
            self.stop_requested = True
        if (self.writer.fenced or self.abort_requested or self.stop_requested) \
                and not self.stop_event.is_set():
            with contextlib.suppress(RuntimeError):  # the attempt's loop is closed: nothing waits
                self._loop.call_soon_threadsafe(self.stop_event.set)

    @property
    def fenced(self) -> str | None:
        """Why this attempt may write nothing more, once it may not (the writer's flag)."""
        return self.writer.fenced

    def refuses_writes(self) -> bool:
        """True once this attempt may write nothing more (asks the write guard)."""
        return self.writer.refuse_writes()

    # --- the engine's interface: passes and generations -----------------------------------
    async def workflow_input(self, first: Any) -> Any:
        """The input of the generation being run: ``first`` for the first, else its continuation's
        (decoded afresh for every pass, exactly as a resume decodes it)."""
        if self.continuation is None:
            return first
        return await self.results.recorded(self.continuation, f"the input of workflow generation {self.gen}")

    def start_workflow(self, main: Awaitable[T]) -> asyncio.Task[T]:
        """Run one pass of the workflow function (``main``) as a task, its operations numbered
        from the top, in a context of its own."""
        scope = Scope((), None)
        cv = contextvars.copy_context()
        cv.run(SCOPE.set, scope)
        cv.run(STEP.set, None)
        cv.run(sagas.LEDGER.set, self.sagas)
        return self._loop.create_task(in_scope(scope, main), context=cv)

    def new_pass(self) -> None:
        """The workflow function runs again from the top, in the same generation."""
        self.reached = set()
        self.sagas.new_pass()

    def start_generation(self, record: ContinueRecord) -> None:
        """Run generation ``record.gen`` next, from continuation ``record``."""
        self.gen = record.gen
        self.continuation = record
        self.continued = None
        self.live.reset(gen_prefix(self.gen))
        self.reached = set()

    async def complete(self, value: Any) -> tuple[CompleteRecord, Any]:
        """Journal the workflow's result ``value``: its record, and the value as a replay returns it."""
        if self.config.replay is not None:
            done = self.live.replayed_completion(self.reached)
            return done, await self.results.recorded(done, "the workflow's result")
        self.live.check_unreached(self.reached)
        payload, result = await self.results.encode(value, "the workflow")
        done = CompleteRecord(pos="end", name="result")
        done.set_result(payload)
        return await self.writer.commit(done), result

    async def final_snapshot(self) -> None:
        await self.writer.final_snapshot()

    # --- the engine's interface: queries -----------------------------------------------------
    @property
    def totals(self) -> Totals:
        """What the journal holds: cost, tokens and steps."""
        return self.live.totals

    def spent(self) -> Totals:
        """The journaled totals plus the cost charged outside steps since the last record."""
        t, live = self.live.totals, self.live
        return Totals(t.usd + live.pending_usd, t.tokens + live.pending_tokens, t.steps)

    @property
    def journal_records(self) -> int:
        return self.live.loaded.next_seq

    @property
    def total_steps(self) -> int | None:  # ctx.set_total_steps, if the workflow said
        return self.live.total_steps

    @property
    def open_compensations(self) -> int:  # what a wait reports (status.waitingFor.compensations)
        return self.sagas.open

    def stalled_for(self) -> float:
        """Seconds since the last step completed; 0 while the workflow sleeps in process."""
        return 0.0 if self.live.sleeping else time.monotonic() - self.live.last_progress

    def duration_halt(self) -> Halt | None:
        """policy.maxDuration is past: the abort, else None. None while a Saga undoes its work."""
        if self.sagas.running:
            return None
        return duration_halt(self.first_start, self.max_duration, self.policy, self.advice)

    # --- plumbing -------------------------------------------------------------------------
    async def io(self, fn: Callable[..., T], *args: Any) -> T:
        if self.store.backend.io_inline:
            return fn(*args)
        return await self._loop.run_in_executor(self._io_pool, fn, *args)

    def pstr(self, pos: tuple[int, ...]) -> str:
        """A position of the current generation as the journal writes it."""
        return self.live.prefix + pos_str(pos)

    def allocate(self, what: str) -> tuple[int, ...]:
        if self.continued is not None:
            raise ContinueAsNew()  # the generation is over: keep unwinding
        scope = SCOPE.get()
        if STEP.get() is not None:
            raise Halt(HaltKind.FAIL, f"{what} was called inside a step; steps cannot nest: "
                       "call it from the workflow function instead",
                       error=errors.WorkflowError(f"{what} called inside a step"))
        if scope.owner is not asyncio.current_task():
            raise Halt(
                HaltKind.FAIL,
                f"{what} was called from a task that ctx.gather did not start. Run concurrent "
                "branches with ctx.gather(...) so journal positions stay deterministic.",
                error=errors.WorkflowError(f"{what} called from a foreign task"),
            )
        pos = (*scope.prefix, scope.counter)
        scope.counter += 1
        self.reached.add(self.pstr(pos))
        return pos

    def peek(self) -> tuple[int, ...] | None:
        scope = SCOPE.get(None)
        return None if scope is None else (*scope.prefix, scope.counter)

    def check_replayed_all(self) -> None:
        """A replay-only attempt whose workflow raised: a journaled operation it did not reach is a divergence."""
        with contextlib.suppress(Halt):
            self.live.check_unreached(self.reached)

    # --- budgets -----------------------------------------------------------------------
    def check_before_new_op(self, *, step: bool) -> None:
        guard = self.config.write_guard
        writer = self.writer
        reason = guard() if guard is not None and not writer.fenced else None
        if reason:
            # A runner that wakes from a pause past its lease must not start anything (a step is a
            # side effect) before its renewal thread notices: ask the lease now, not only at the write.
            writer.fenced = reason
        if writer.fenced:
            raise Halt(HaltKind.FENCE, writer.fenced)
        # A Saga undoing its work after an abort: neither the abort nor a budget (often what caused
        # it) may stop the undoing; a stop or a fence still does (the next attempt resumes it).
        self._raise_requested_abort()
        if self.stop_requested:
            raise Halt(HaltKind.SUSPEND, "stopped at a step boundary as requested")
        if not step or sagas.COMPENSATING.get():
            return
        halt = budget_halt(self.live, self.policy, self.max_cost, self.advice)
        if halt is not None:
            raise halt
        self.check_duration()

    def _raise_requested_abort(self) -> None:
        """Raise the abort requested of the run, unless a Saga is undoing its work after one.

        Before every new operation, and where a resumed wait would otherwise wait again (the attempt the
        operator starts for a run aborted while it waited)."""
        if self.abort_requested and not sagas.COMPENSATING.get():
            reason, message = self.abort_requested
            raise Halt(HaltKind.ABORT, message, reason=reason)

    def check_duration(self) -> None:
        halt = duration_halt(self.first_start, self.max_duration, self.policy, self.advice)
        if halt is not None:
            raise halt

    def advice(self, field: str) -> str:
        """How the user raises policy ``field`` where this run runs (CLI flags, kubectl)."""
        advise = self.config.policy_advice
        return advise(field) if advise is not None else f"raise policy.{field} and run again to continue"

    def overshoot(self) -> str | None:
        return budget_overshoot(self.live.totals, self.policy)

    async def pause(self, seconds: float) -> None:
        """Sleep in process; a stop request ends it early with Halt(SUSPEND)."""
        if seconds <= 0:
            return
        self.live.sleeping += 1
        try:
            await asyncio.wait_for(self.stop_event.wait(), timeout=seconds)
        except TimeoutError:
            return
        finally:
            self.live.sleeping -= 1
            self.live.last_progress = time.monotonic()
        self.check_before_new_op(step=False)

    async def recorded_value(self, record: ResultRecord, what: str) -> Any:
        """The value journaled in ``record``, as the workflow gets it."""
        return await self.results.recorded(record, what)

    # --- operations ----------------------------------------------------------------------
    async def step(self, pos: str, gen: int, name: str, fn: Callable[..., Any],
                   args: tuple[Any, ...], kwargs: dict[str, Any], retries: int | None) -> Any:
        if self.continued is not None:
            raise ContinueAsNew()  # called before continue_as_new, awaited after it
        if gen != self.gen:
            raise misuse(f"step {name!r} was called in workflow generation {gen} and awaited "
                          f"in generation {self.gen}: await steps before ctx.continue_as_new()")
        self.live.open_steps += 1
        try:
            return await self.sagas.marking_aborts(pos, name, self._step(pos, name, fn, args, kwargs, retries))
        finally:
            self.live.open_steps -= 1

    async def _step(self, pos: str, name: str, fn: Callable[..., Any],
                    args: tuple[Any, ...], kwargs: dict[str, Any], retries: int | None) -> Any:
        what = f"step {name!r} (position {pos})"
        recs = self.live.lookup(pos, "step", name)
        if recs:
            rec = recs["step"]
            assert isinstance(rec, StepRecord)
            if rec.ok:
                return await self.results.recorded(rec, what)
            retry = self.config.rerun_failed_before
            if retry is None or rec.at >= retry.timestamp():
                err = rec.error or {}
                raise errors.StepError(name, pos, str(err.get("type", "Error")),
                                       str(err.get("message", "")), rec.attempts)
            # The run was retried after this failure: run the step again. Its new record, later in the
            # journal at the same position, is the one every later replay reads.
        self.live.journal_end(f"step {name!r} at position {pos}")
        self.check_before_new_op(step=True)
        max_retries = self.policy.maxRetries if retries is None else retries
        live = self.live
        live.inflight_steps += 1
        frame = StepFrame(pos, name, inline_wait=self.config.inline_sleep_max.total_seconds())
        started = time.monotonic()
        attempt = 0
        failure: BaseException | None = None
        payload = _NO_PAYLOAD
        value: Any = None
        try:
            while True:
                attempt += 1
                self.sinks.emit(EventKind.STEP_STARTED, position=pos, name=name, attempt=attempt)
                frame.tries = attempt
                token = STEP.set(frame)
                try:
                    result = await self._step_threads.invoke(fn, args, kwargs)
                    payload, value = await self.results.encode(result, what)
                    if self.streams.opened:  # a journaled step's chunks are durable (no await per step without)
                        await self.streams.drain(frame)
                    failure = None
                    break
                except (Halt, asyncio.CancelledError):
                    raise
                except errors.NonRetryableError as e:
                    failure = e
                    break
                except Exception as e:
                    failure = e
                    if attempt > max_retries:
                        break
                finally:
                    STEP.reset(token)
                delay, error = self.backoff(attempt), f"{type(failure).__qualname__}: {failure}"[:500]
                self.sinks.emit(EventKind.STEP_RETRYING, position=pos, name=name, attempt=attempt, delay=delay,
                                error=error)
                await self.pause(delay)
        finally:
            live.inflight_steps -= 1
        record = StepRecord(pos=pos, name=name, ok=failure is None, attempts=attempt,
                            dur=round(time.monotonic() - started, 6))
        if failure is None:
            record.set_result(payload)
        else:
            record.error = {"type": type(failure).__qualname__, "module": type(failure).__module__,
                            "message": str(failure)[:4000]}
        record = await self.writer.commit(record, usd=frame.usd, tokens=frame.tokens, step=True)
        live.last_progress = time.monotonic()
        self.sinks.emit(EventKind.STEP_COMPLETED, position=pos, name=name, seq=record.seq,
                        ok=failure is None, duration=record.dur)
        if failure is not None:
            self.sinks.emit(EventKind.STEP_FAILED, position=pos, name=name, attempts=attempt,
                            traceback=own_traceback(failure))
            raise errors.StepError(name, pos, type(failure).__qualname__, str(failure)[:4000],
                                   attempt) from failure
        return value

    def backoff(self, attempt: int) -> float:
        base = self.config.retry_initial.total_seconds() * float(2 ** (attempt - 1))
        capped = min(base, self.config.retry_max.total_seconds())
        return capped * random.uniform(0.5, 1.0)

    def value(self, kind: str, make: Callable[[], str]) -> str:
        pos = self.pstr(self.allocate(f"ctx.{kind}()"))
        recs = self.live.lookup(pos, "value", kind)
        if recs:
            rec = recs["value"]
            assert isinstance(rec, ValueRecord)
            return rec.value
        self.live.journal_end(f"ctx.{kind}() at position {pos}")
        value = make()
        self.writer.commit_now(ValueRecord(pos=pos, name=kind, value=value))
        return value

    async def sleep(self, duration: timedelta) -> None:
        pos = self.pstr(self.allocate("ctx.sleep()"))
        await self.sagas.marking_aborts(pos, "sleep", self._sleep(pos, duration))

    async def _sleep(self, pos: str, duration: timedelta) -> None:
        recs = self.live.lookup(pos, "sleep", "sleep")
        if recs:
            rec = recs["sleep"]
            assert isinstance(rec, SleepRecord)
            wake = parse_time(rec.wake_at)
        else:
            self.live.journal_end(f"sleep at position {pos}")
            self.check_before_new_op(step=False)
            wake = datetime.now(UTC) + duration
            await self.writer.commit(SleepRecord(pos=pos, name="sleep", wake_at=format_time(wake, precise=True)))
        remaining = (wake - datetime.now(UTC)).total_seconds()
        if remaining <= 0 or self.config.replay is not None:  # a replay never sleeps
            return
        if remaining <= self.config.inline_sleep_max.total_seconds():
            await self.pause(remaining)
            return
        self._raise_requested_abort()
        raise Halt(HaltKind.WAIT, f"sleeping until {format_time(wake, precise=True)}", waiting=Waiting(wake_time=wake))

    async def wait_for_event(
        self,
        name: str,
        timeout: timedelta | None,  # noqa: ASYNC109 - a durable deadline
    ) -> Any:
        pos = self.pstr(self.allocate("ctx.wait_for_event()"))
        return await self.sagas.marking_aborts(pos, name, self._wait_for_event(pos, name, timeout))

    async def _wait_for_event(
        self, pos: str, name: str,
        timeout: timedelta | None,  # noqa: ASYNC109 - a durable deadline
    ) -> Any:
        recs = self.live.lookup(pos, "wait", name)
        end = recs.get("event")
        if end is not None:
            assert isinstance(end, EventRecord)
            return self._event_outcome(end)
        start = recs.get("wait")
        self.live.journal_end(f"{'the delivery of' if start else 'wait for'} event {name!r} at position {pos}")
        if start is None:
            self.check_before_new_op(step=False)
            deadline = None if timeout is None else datetime.now(UTC) + timeout
            written = None if deadline is None else format_time(deadline, precise=True)
            start = await self.writer.commit(WaitRecord(pos=pos, name=name, deadline=written))
        assert isinstance(start, WaitRecord)
        deadline = parse_time(start.deadline) if start.deadline else None
        try:
            event = await self.io(self.store.get_event, name)
        except errors.StoreError as e:
            raise store_halt(e) from None
        if event is not None:
            end = await self.writer.commit(EventRecord(pos=pos, name=name, ok=True, value=event.get("payload"),
                                                       event_id=event.get("id")))
            self.live.last_progress = time.monotonic()
            return self._event_outcome(end)
        if deadline is not None and datetime.now(UTC) >= deadline:
            end = await self.writer.commit(EventRecord(pos=pos, name=name, ok=False, timeout=True))
            return self._event_outcome(end)
        self._raise_requested_abort()
        raise Halt(HaltKind.WAIT, f"waiting for event {name!r}",
                   waiting=Waiting(event=name, deadline=deadline))

    def _event_outcome(self, record: EventRecord) -> Any:
        if record.ok:
            return fresh(record.value)
        wait = self.live.index.get(record.pos, {}).get("wait")
        deadline = wait.deadline if isinstance(wait, WaitRecord) else None
        raise errors.EventTimeout(record.name, str(deadline))

    def patched(self, change_id: str) -> bool:
        if self.continued is not None:
            raise ContinueAsNew()
        cur = self.peek()
        if cur is None or STEP.get() is not None:
            raise errors.WorkflowError("ctx.patched() belongs in the workflow function, "
                                       "not in a step or another thread")
        pos = self.pstr(cur)
        if f"patch:{change_id}" in self.live.index.get(pos, {}):
            return True
        if self.live.replaying_at(cur):
            return False
        self.live.journal_end(f"ctx.patched({change_id!r}) at position {pos}")
        self.writer.commit_now(PatchRecord(pos=pos, name=change_id))
        return True

    def set_total_steps(self, total: int | None) -> None:
        if STEP.get() is not None:
            # A step does not run again on a resume: the total would be lost there.
            raise errors.NonRetryableError(
                "ctx.set_total_steps() was called inside a step: call it from the workflow "
                "function, which runs again on every resume")
        self.live.total_steps = total
        self.sinks.emit(EventKind.TOTAL_STEPS_UPDATED, total=total, steps=self.live.totals.steps)

    def add_cost(self, usd: Decimal, tokens: int) -> None:
        if charge_step(usd, tokens):
            return
        if self.continued is not None:
            raise ContinueAsNew()  # the generation is over: nothing after it counts
        cur = self.peek()
        if cur is not None and self.live.replaying_at(cur):
            return  # already counted in the journal record that followed it
        with self.writer.lock:
            self.live.pending_usd += usd
            self.live.pending_tokens += tokens

    async def continue_as_new(self, new_input: Any) -> NoReturn:
        what = "ctx.continue_as_new()"
        if STEP.get() is not None:
            raise misuse(f"{what} was called inside a step: it ends the workflow function's "
                          "current generation, so call it from the workflow function itself")
        scope = SCOPE.get(None)
        if scope is not None and scope.prefix:
            raise misuse(f"{what} was called inside a ctx.gather branch (position "
                          f"{self.pstr(scope.prefix)}): it ends the whole workflow function, not "
                          "one branch; call it from the workflow function after the gather")
        pos = self.pstr(self.allocate(what))
        if self.live.open_steps:
            raise misuse(f"{what} was called while {self.live.open_steps} step(s) were still "
                          "running: await every step (and gather) before continuing")
        recs = self.live.lookup(pos, "continue", "continue_as_new")
        if recs:
            rec = recs["continue"]
            assert isinstance(rec, ContinueRecord)
            self.continued = rec
            raise ContinueAsNew()
        self.live.check_unreached(self.reached)
        self.live.journal_end(f"ctx.continue_as_new() at position {pos}")
        self.check_before_new_op(step=False)
        self.check_duration()
        payload, _ = await self.results.encode(new_input, f"the input given to {what}", verb="is", root="input")
        record = ContinueRecord(pos=pos, name="continue_as_new", gen=self.gen + 1)
        record.set_result(payload)
        self.continued = await self.writer.commit(record)
        raise ContinueAsNew()

    async def gather(self, aws: tuple[Awaitable[Any], ...], return_exceptions: bool) -> list[Any]:
        return await gather(self.allocate("ctx.gather()"), aws, return_exceptions)

    def stream(self, name: str) -> Stream:
        return self.streams.open(name)


def new_uuid() -> str:
    return str(uuid.uuid4())
