"""The runtime of one attempt: runs the operations the workflow asks for.

:class:`AttemptCore` is what :class:`~durablerun._private.context.DurableContext`
calls. It asks the replay layer (:mod:`durablerun._private.replay`) whether an
operation is journaled and, when not, executes it (step functions on the
worker threads of :mod:`durablerun._private.workers`), appends its record
through the writer (one record at a time, in order, behind the write guard)
and saves snapshots on a thread of its own. The loop, controls and heartbeats
around it are the engine's (:mod:`durablerun._private.engine`).
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import inspect
import random
import time
import uuid
from collections.abc import Awaitable, Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from typing import Any, NoReturn, TypeVar

from durablerun import errors
from durablerun._private import codec
from durablerun._private.halts import Halt, HaltKind, Waiting, strongest
from durablerun._private.journal import RunStore
from durablerun._private.model import (
    ContinueRecord,
    EngineConfig,
    EventRecord,
    PatchRecord,
    Payload,
    Record,
    ResultRecord,
    SleepRecord,
    StepRecord,
    ValueRecord,
    WaitRecord,
)
from durablerun._private.replay import (
    ABORT_MARK,
    SCOPE,
    STEP,
    ContinueAsNew,
    Live,
    Scope,
    StepFrame,
    abort_mark,
    budget_halt,
    budget_overshoot,
    duration_halt,
    gen_prefix,
    misuse,
    pos_str,
)
from durablerun._private.sinks import EventKind, SinkSet
from durablerun._private.workers import StepThreads
from durablerun._private.writer import Writer
from durablerun.api import AbortReason, Policy, format_time, parse_duration, parse_time

T = TypeVar("T")
_NO_PAYLOAD = Payload(None, None, None)
R = TypeVar("R", bound=Record)

#: How many Saga blocks enclose the running workflow code (durablerun.agents.Saga): an abort that stops
#: an operation inside one is journaled there (AttemptCore.mark_abort).
SAGAS: contextvars.ContextVar[int] = contextvars.ContextVar("durablerun_sagas", default=0)
#: Set while a Saga compensates after an abort: its steps may start although the run is aborting.
COMPENSATING: contextvars.ContextVar[bool] = contextvars.ContextVar("durablerun_compensating",
                                                                    default=False)

class AttemptCore:
    """Runs the operations a workflow asks for, for one attempt. Created by the engine.

    One method per DurableContext operation (step, sleep, wait_for_event, now,
    uuid, patched, add_cost, continue_as_new, gather), each reading as "replayed
    or executed, then appended": that is why it is a few hundred lines. Replay
    decisions are :mod:`durablerun._private.replay`'s, appends the
    :class:`~durablerun._private.writer.Writer`'s.
    """

    def __init__(
        self,
        *,
        store: RunStore,
        live: Live,
        policy: Policy,
        config: EngineConfig,
        sinks: SinkSet,
        run_key: str,
        attempt_id: str,
        first_start: datetime,
        io_pool: ThreadPoolExecutor,
    ) -> None:
        self.store = store
        self.live = live
        self.policy = policy
        self.config = config
        self.sinks = sinks
        self.run_key = run_key
        self.attempt_id = attempt_id
        self.first_start = first_start
        self._io_pool = io_pool
        self._step_threads = StepThreads(config.max_sync_threads)
        self.writer = Writer(store=store, live=live, config=config, sinks=sinks,
                             attempt_id=attempt_id)
        self.reached: set[str] = set()
        self.stop_requested = False
        self.abort_requested: tuple[AbortReason, str] | None = None
        self.stop_event = asyncio.Event()
        self.max_cost = Decimal(policy.costCeilingUSD) if policy.costCeilingUSD else None
        self.max_duration = parse_duration(policy.maxDuration)
        #: The generation being run, and the continue_as_new record that started it.
        self.continuation: ContinueRecord | None = live.loaded.continuation
        self.gen = self.continuation.gen if self.continuation else 0
        #: Set once this generation's continue_as_new record is durable.
        self.continued: ContinueRecord | None = None
        #: Sagas compensating after an abort right now (the supervisor leaves maxDuration to them).
        self.compensating_now = 0
        #: Compensations registered in open Sagas this pass: a wait reports them, so that an abort
        #: while the run waits (no pod) gets an attempt to run them.
        self.open_compensations = 0

    # --- plumbing -----------------------------------------------------------------
    async def io(self, fn: Callable[..., T], *args: Any) -> T:
        if self.store.backend.io_inline:
            return fn(*args)
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self._io_pool, fn, *args)

    @property
    def fenced(self) -> str | None:
        """Why this attempt may write nothing more, once it may not (the writer's flag)."""
        return self.writer.fenced

    @fenced.setter
    def fenced(self, reason: str | None) -> None:
        self.writer.fenced = reason

    def close(self) -> None:
        self.writer.close()
        self._step_threads.close()

    def new_pass(self) -> None:
        self.reached = set()
        self.open_compensations = 0

    def start_generation(self, record: ContinueRecord) -> None:
        """Run generation ``record.gen`` next, from continuation ``record``."""
        self.gen = record.gen
        self.continuation = record
        self.continued = None
        self.live.reset(gen_prefix(self.gen))
        self.reached = set()

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
        if not step or COMPENSATING.get():
            return
        halt = budget_halt(self.live, self.policy, self.max_cost, self.advice)
        if halt is not None:
            raise halt
        self.check_duration()

    @contextlib.contextmanager
    def compensating(self) -> Iterator[None]:
        """Let the steps started in this block run while the run aborts (a Saga's compensations)."""
        token = COMPENSATING.set(True)
        self.compensating_now += 1
        try:
            yield
        finally:
            self.compensating_now -= 1
            COMPENSATING.reset(token)

    async def mark_abort(self, pos: str, name: str, halt: Halt) -> None:
        """Journal that an abort stopped operation ``name`` at ``pos`` inside a Saga block.

        The Saga is about to undo the work before it; without the marker a resumed run (a crash while
        compensating, a raised limit) would run the refused operation and those after it after all.
        Replaying the marker aborts again (replay.abort_mark). Not counted as a step.
        """
        if halt.kind != HaltKind.ABORT or not SAGAS.get() or COMPENSATING.get():
            return
        if abort_mark(self.live.index.get(pos, {})) is not None:
            return  # replayed: the marker is already there
        reason = (halt.reason or AbortReason.USER_REQUESTED).value
        # Its advice ("raise the limit to continue") no longer holds once the Saga undoes the work.
        halt.message += (f"; but it stopped {name!r} (position {pos}) inside a Saga, which undid "
                         "the work before it, so this run stays Aborted whatever the limits: start a "
                         "new run to try again")
        await self.writer.commit(StepRecord(pos=pos, name=name, ok=False, attempts=0, error={
            "type": ABORT_MARK, "module": "durablerun", "message": halt.message, "reason": reason}))

    async def _marking_aborts(self, pos: str, name: str, op: Awaitable[T]) -> T:
        try:
            return await op
        except Halt as h:
            await self.mark_abort(pos, name, h)
            raise

    def _raise_requested_abort(self) -> None:
        """Raise the abort requested of the run, unless a Saga is undoing its work after one.

        Before every new operation, and where a resumed wait would otherwise wait again (the attempt the
        operator starts for a run aborted while it waited)."""
        if self.abort_requested and not COMPENSATING.get():
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

    # --- results --------------------------------------------------------------------------
    async def encode_result(self, value: Any, what: str, verb: str = "returned",
                            root: str = "result") -> tuple[Payload, Any]:
        """How a record carries a result, and the value the workflow gets back."""
        body, model = codec.encode_value(value, what=what, verb=verb, root=root)
        size = len(body)
        if size > self.config.result_hard_limit:
            raise errors.ResultTooLargeError(
                f"{what} {verb} {size:,} bytes of JSON, over the hard limit of "
                f"{self.config.result_hard_limit:,} bytes (EngineConfig.result_hard_limit, "
                "--max-result-bytes). Store large data elsewhere and return a reference."
            )
        payload = Payload(body, None, model or None)
        if size > self.config.inline_result_max:
            try:
                payload = Payload(None, await self.io(self.store.put_blob, body), model or None)
            except errors.StoreError as e:
                # The store failed, not the step: never journal this as the step's error.
                raise Halt(HaltKind.CRASH if isinstance(e, errors.StoreUnavailableError)
                           else HaltKind.FAIL, str(e), error=e) from None
        # The workflow gets its own copy, decoded exactly as a replay would decode it.
        return payload, codec.rebuild(codec.loads(body, what=what), model, what=what)

    async def recorded_value(self, record: ResultRecord, what: str) -> Any:
        if record.ref is not None:
            try:
                body = await self.io(self.store.get_blob, record.ref)
            except errors.StoreError as e:
                raise Halt(HaltKind.CRASH if isinstance(e, errors.StoreUnavailableError)
                           else HaltKind.FAIL, str(e), error=e) from None
            return codec.decode_value(body, record.model, what=what)
        try:
            if record.encoded is not None:  # written in this process: decoded only now
                return codec.rebuild(codec.loads(record.encoded, what=what), record.model,
                                     what=what)
            value = record.value
            if record.handed:
                # A second pass in this process: the first may have mutated its copy.
                value = _fresh(value)
            record.handed = True
            return codec.rebuild(value, record.model, what=what)
        except errors.WorkflowError as e:
            raise Halt(HaltKind.FAIL, str(e), error=e) from None

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
            return await self._marking_aborts(pos, name,
                                              self._step(pos, name, fn, args, kwargs, retries))
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
                return await self.recorded_value(rec, what)
            retry = self.config.rerun_failed_before
            if retry is None or rec.at >= retry.timestamp():
                err = rec.error or {}
                raise errors.StepError(name, pos, str(err.get("type", "Error")),
                                       str(err.get("message", "")), rec.attempts)
            # The run was retried after this failure: run the step again. Its new record, later in the
            # journal at the same position, is the one every later replay reads.
        self.check_before_new_op(step=True)
        max_retries = self.policy.maxRetries if retries is None else retries
        live = self.live
        live.inflight_steps += 1
        frame = StepFrame(pos, name)
        started = time.monotonic()
        attempt = 0
        failure: BaseException | None = None
        payload = _NO_PAYLOAD
        value: Any = None
        try:
            while True:
                attempt += 1
                self.sinks.emit(EventKind.STEP_STARTED, position=pos, name=name, attempt=attempt)
                token = STEP.set(frame)
                try:
                    result = await self._invoke(fn, args, kwargs)
                    payload, value = await self.encode_result(result, what)
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
                await self.pause(self.backoff(attempt))
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
                        ok=failure is None,
                                  duration=record.dur)
        if failure is not None:
            raise errors.StepError(name, pos, type(failure).__qualname__, str(failure)[:4000],
                                   attempt) from failure
        return value

    async def _invoke(self, fn: Callable[..., Any], args: tuple[Any, ...],
                      kwargs: dict[str, Any]) -> Any:
        if _is_async(fn):
            return await fn(*args, **kwargs)
        if self.config.sync_steps_in_threads:
            result = await self._step_threads.submit(fn, args, kwargs)
        else:
            result = fn(*args, **kwargs)
        if inspect.isawaitable(result):
            result = await result
        return result

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
        value = make()
        self.writer.commit_now(ValueRecord(pos=pos, name=kind, value=value))
        return value

    async def sleep(self, duration: timedelta) -> None:
        pos = self.pstr(self.allocate("ctx.sleep()"))
        await self._marking_aborts(pos, "sleep", self._sleep(pos, duration))

    async def _sleep(self, pos: str, duration: timedelta) -> None:
        recs = self.live.lookup(pos, "sleep", "sleep")
        if recs:
            rec = recs["sleep"]
            assert isinstance(rec, SleepRecord)
            wake = parse_time(rec.wake_at)
        else:
            self.check_before_new_op(step=False)
            wake = datetime.now(UTC) + duration
            await self.writer.commit(SleepRecord(pos=pos, name="sleep",
                                          wake_at=format_time(wake, precise=True)))
        remaining = (wake - datetime.now(UTC)).total_seconds()
        if remaining <= 0:
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
        return await self._marking_aborts(pos, name, self._wait_for_event(pos, name, timeout))

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
            raise Halt(HaltKind.CRASH if isinstance(e, errors.StoreUnavailableError)
                       else HaltKind.FAIL, str(e), error=e) from None
        if event is not None:
            end = await self.writer.commit(EventRecord(pos=pos, name=name, ok=True,
                                                value=event.get("payload"),
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
            return _fresh(record.value)
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
        self.check_before_new_op(step=False)
        self.check_duration()
        payload, _ = await self.encode_result(new_input, f"the input given to {what}",
                                              verb="is", root="input")
        record = ContinueRecord(pos=pos, name="continue_as_new", gen=self.gen + 1)
        record.set_result(payload)
        self.continued = await self.writer.commit(record)
        raise ContinueAsNew()

    async def gather(self, aws: tuple[Awaitable[Any], ...], return_exceptions: bool) -> list[Any]:
        g = self.allocate("ctx.gather()")
        loop = asyncio.get_running_loop()
        tasks: list[asyncio.Task[Any]] = []
        for i, aw in enumerate(aws):
            scope = Scope((*g, i), None)
            ctx = contextvars.copy_context()
            ctx.run(SCOPE.set, scope)
            tasks.append(loop.create_task(_branch(scope, aw), context=ctx))
        results = await asyncio.gather(*tasks, return_exceptions=True)
        halts = [r for r in results if isinstance(r, Halt)]
        if halts:
            raise strongest(halts)
        for r in results:
            if isinstance(r, asyncio.CancelledError):
                raise r
        if not return_exceptions:
            for r in results:
                if isinstance(r, BaseException):
                    raise r
        return list(results)

def _fresh(value: Any) -> Any:
    """A private copy of a journaled value (workflows may mutate what they get)."""
    if value is None or isinstance(value, str | int | float | bool):
        return value
    return codec.loads(codec.dumps(value), what="value")


async def _branch(scope: Scope, aw: Awaitable[Any]) -> Any:
    scope.owner = asyncio.current_task()
    return await aw


_ASYNC_CACHE: dict[Any, bool] = {}


def _is_async(fn: Callable[..., Any]) -> bool:
    try:
        return _ASYNC_CACHE[fn]
    except (KeyError, TypeError):
        result = inspect.iscoroutinefunction(fn)
        try:
            if len(_ASYNC_CACHE) < 4096:
                _ASYNC_CACHE[fn] = result
        except TypeError:
            pass
        return result


def new_uuid() -> str:
    return str(uuid.uuid4())


def in_step() -> bool:
    """Whether this code runs inside a step (ctx.step's function)."""
    return STEP.get() is not None


def charge_step(usd: Decimal, tokens: int) -> bool:
    """Charge the step running in this context (its journal record carries the cost); False outside a step."""
    frame = STEP.get()
    if frame is None:
        return False
    frame.usd += usd
    frame.tokens += tokens
    return True
