"""The engine: one attempt of a run, from loading the journal to exactly one outcome.

The top of the runtime layer: it owns the attempt's event loop, its IO pool,
the controls other threads use (stop, abort, fence), heartbeats, the progress
timeout and the waits between passes; :mod:`durablerun._private.engine.core` runs the
operations. It is one module of a few hundred lines because it is one class,
:class:`Run`, whose supervisor loop reads best in one place (see its docstring).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import inspect
import logging
import os
import threading
import time
import traceback
import uuid
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime, timedelta
from typing import Any

from durablerun import errors
from durablerun._private.engine import core, replay
from durablerun._private.engine.context import DurableContext
from durablerun._private.engine.halts import Halt, HaltKind
from durablerun._private.engine.loading import code_version_of, load_workflow
from durablerun._private.engine.seams import ContextFace, EngineFace
from durablerun._private.engine.sinks import EventKind, ProgressSink, SinkSet
from durablerun._private.records import codec, layout
from durablerun._private.records.model import (
    AttemptResult,
    CompleteRecord,
    ContinueRecord,
    EngineConfig,
    RunStarted,
    WaitingFor,
)
from durablerun._private.storage.journal import Loaded, RunStore
from durablerun._private.storage.stores import Store
from durablerun._version import __version__
from durablerun.api import (
    AbortReason,
    Env,
    Outcome,
    active_time,
    format_duration,
    format_time,
    input_hash,
    parse_duration,
    parse_time,
)
from durablerun.resource import RESULT_INLINE_MAX, Policy

SDK_VERSION = __version__
# Why an attempt that got past its lease check still ends Fenced: its status write found the run claimed.
OVERTAKEN = "a newer attempt has claimed the run's status.json: this one stops without recording its outcome"
log = logging.getLogger("durablerun")
Workflow = Callable[[DurableContext, Any], Any]


# --- the run -------------------------------------------------------------------------


class Run:
    """One durable run, driven one attempt at a time. See :mod:`durablerun.engine`.

    Long on purpose: it is the attempt's supervisor, one loop from loading the
    journal to exactly one outcome (the controls other threads set, the passes,
    heartbeats, the progress timeout, waits, how each way out becomes an
    AttemptResult), and reads best in one place. What it drives lives below it:
    operations in :class:`~durablerun._private.engine.core.AttemptCore`, appends in
    :class:`~durablerun._private.engine.writer.Writer`, replay in
    :mod:`durablerun._private.engine.replay`.

    It drives the attempt only through :class:`~durablerun._private.engine.seams.EngineFace`
    (mypy holds it to that): the controls reach it through one ``apply_controls``
    (:meth:`_apply_controls`, from any thread), and what an outcome reports comes from
    the face's queries, never from the core's journal state or writer.
    """

    def __init__(
        self,
        *,
        store: Store,
        run: layout.RunRef,
        workflow: str | Workflow,
        input: Any = None,
        policy: Policy | None = None,
        sinks: list[ProgressSink] | None = None,
        config: EngineConfig | None = None,
    ) -> None:
        self.store = store
        self.ref = run
        self.workflow = workflow
        self.input = {} if input is None else input
        self.policy = policy or Policy()
        self.config = config or EngineConfig()
        if self.config.snapshot_every < 1:
            raise errors.ConfigError("snapshot_every must be >= 1 (checkpoint.snapshotEvery)")
        self.sinks = SinkSet(sinks or [])
        # Re-entrant: request_stop() runs in signal handlers, on the thread that may hold it.
        self._lock = threading.RLock()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._core: EngineFace | None = None
        self._wake: asyncio.Event | None = None
        self._stop: timedelta | None = None
        self._stop_at: float | None = None
        self._stop_told = False
        self._abort: tuple[AbortReason, str] | None = None
        self._fence: str | None = None
        self._next_hb = 0.0
        self._io_pool: ThreadPoolExecutor | None = None
        self._attempt_start: datetime | None = None
        self.attempt_id = uuid.uuid4().hex[:16]

    # --- control from other threads --------------------------------------------------------
    def request_stop(self, grace: timedelta | None = None) -> None:
        """Stop at the next step boundary (outcome Suspended). Thread- and signal-safe.

        Steps already running get ``grace`` (default EngineConfig.stop_grace)
        to finish and be journaled; then they are cancelled.
        """
        with self._lock:
            if self._stop is None:
                self._stop = grace if grace is not None else self.config.stop_grace
        self._poke()

    def request_abort(self, reason: AbortReason = AbortReason.USER_REQUESTED,
                      message: str = "aborted on request") -> None:
        """End at the next step boundary as Aborted(reason), with a final checkpoint."""
        with self._lock:
            if self._abort is None:
                self._abort = (reason, message)
        self._poke()

    def fence(self, message: str = "lease lost: another attempt owns the run") -> None:
        """Stop at once as Fenced: nothing more is written. Thread-safe."""
        with self._lock:
            if self._fence is None:
                self._fence = message
        self._poke()

    def _poke(self) -> None:
        # The controls reach the running attempt at once, so the very next step boundary
        # sees them; the wake-up lets the supervisor act on them.
        with self._lock:
            if self._core is not None:
                self._apply_controls(self._core)
        loop = self._loop
        if loop is not None and not loop.is_closed():
            with contextlib.suppress(RuntimeError):
                loop.call_soon_threadsafe(self._on_loop_poke)

    def _on_loop_poke(self) -> None:
        stop = self._stop
        if stop is not None and not self._stop_told:  # said here, on the loop: never from a signal handler
            self._stop_told = True
            log.info("stop requested: no new step starts; the steps in flight get %s to finish and be journaled",
                     format_duration(stop))
        if self._wake is not None:
            self._wake.set()

    def _apply_controls(self, c: EngineFace) -> None:
        """Hand the requested controls to the attempt (call with ``self._lock`` held)."""
        if self._stop is not None and self._stop_at is None:
            self._stop_at = time.monotonic() + self._stop.total_seconds()
        c.apply_controls(fence=self._fence, abort=self._abort, stop=self._stop is not None)

    # --- running ------------------------------------------------------------------------------
    def run_attempt(self) -> AttemptResult:
        """Run one attempt on a fresh event loop in this thread; return its outcome.

        Raises StoreUnavailableError when the store cannot be reached (treat it
        as a crash: exit non-zero so the attempt is retried with backoff).
        """
        loop = asyncio.new_event_loop()
        try:
            return loop.run_until_complete(self.run_attempt_async())
        finally:
            with contextlib.suppress(Exception):
                loop.run_until_complete(loop.shutdown_asyncgens())
            loop.close()

    async def run_attempt_async(self) -> AttemptResult:
        self._loop = asyncio.get_running_loop()
        self._wake = asyncio.Event()
        self.attempt_id = uuid.uuid4().hex[:16]
        # The attempt's store IO off the loop (remote stores); the core's operations share it.
        self._io_pool = ThreadPoolExecutor(max_workers=4, thread_name_prefix="durablerun-io")
        run_store = self.store.run_store(self.ref)
        try:
            result = await self._attempt(run_store)
        except errors.StoreUnavailableError:
            raise
        except (errors.ConfigError) as e:
            result = AttemptResult(Outcome.USAGE_ERROR, str(e), error_type=_qual(e))
        except errors.FencedError as e:
            result = AttemptResult(Outcome.FENCED, str(e), error_type=_qual(e))
        except errors.CorruptionError as e:
            result = AttemptResult(Outcome.FAILED, self._damaged(e), error_type=_qual(e))
        except (errors.WorkflowError, errors.StoreError) as e:
            result = AttemptResult(Outcome.FAILED, str(e), error_type=_qual(e))
        finally:
            self._io_pool.shutdown(wait=False)
            run_store.close()
        self.sinks.emit(EventKind.RUN_FINISHED, result=result)
        return result

    def _damaged(self, e: errors.CorruptionError) -> str:
        return (f"the run's journal in {self.store.uri} is damaged: {e}. The run stops here and "
                "nothing was replaced or repaired: restore the object from a backup, or start a new "
                "run")

    async def _io(self, fn: Callable[..., Any], *args: Any) -> Any:
        if self.store.backend.io_inline:
            return fn(*args)
        return await asyncio.get_running_loop().run_in_executor(self._io_pool, fn, *args)

    async def _attempt(self, rs: RunStore) -> AttemptResult:
        if isinstance(self.workflow, str):
            workflow_ref = self.workflow
            fn = load_workflow(self.workflow)
        else:
            fn = self.workflow
            workflow_ref = f"{getattr(fn, '__module__', '?')}:{getattr(fn, '__qualname__', '?')}"
            if not inspect.iscoroutinefunction(fn):
                raise errors.WorkflowNotFoundError(
                    f"workflow {workflow_ref} must be an async function")
        code_version = self.config.code_version or code_version_of(fn)
        try:
            input_sha = input_hash(self.input)
        except (TypeError, ValueError) as e:
            raise errors.ConfigError(f"--input / spec.input is not JSON: {e}") from e

        await self._io(self.store.backend.check, rs.root)
        manifest = await self._io(rs.read_manifest)
        if manifest is None and self.config.replay is not None:
            raise errors.ConfigError(f"no run {self.ref} in {self.store.uri}: nothing to replay")
        if manifest is None:
            manifest = await self._io(rs.create_manifest, {
                "layout": layout.LAYOUT_VERSION,
                "run": self.ref.key,
                "workflow": workflow_ref,
                "input": self.input,
                "input_sha256": input_sha,
                "code_version": code_version,
                "sdk": SDK_VERSION,
                "created": format_time(time.time(), precise=True),
            })
        if manifest.get("input_sha256") != input_sha:
            raise errors.InputMismatchError(
                f"InputMismatch: run {self.ref} was started with a different input "
                f"(sha256 {str(manifest.get('input_sha256'))[:12]}..., this attempt has "
                f"{input_sha[:12]}...). A run's input is fixed at its first attempt: restore "
                "the original input, or start a new run (new --run-id / a new DurableRun). "
                "Nothing journaled was changed."
            )
        if isinstance(self.workflow, str) and manifest.get("workflow") != workflow_ref:
            raise errors.InputMismatchError(
                f"run {self.ref} was started with workflow {manifest.get('workflow')!r}, this "
                f"attempt asks for {workflow_ref!r}: use the original workflow or a new run id. "
                "Nothing journaled was changed."
            )
        first_start = parse_time(str(manifest["created"]))
        if self.config.active_before is not None:  # maxDuration counts active time (api.active_time)
            self._attempt_start = datetime.now(UTC)
            first_start = self._attempt_start - self.config.active_before
        replay_only = self.config.replay is not None
        loaded: Loaded = await self._io(lambda: rs.load(for_writing=not replay_only))
        for w in loaded.warnings:
            self.sinks.emit(EventKind.WARNING, message=w)
        assert self._io_pool is not None
        attempt = core.AttemptCore(
            store=rs, loaded=loaded, policy=self.policy, config=self.config, sinks=self.sinks,
            run_key=self.ref.key, attempt_id=self.attempt_id, first_start=first_start,
            io_pool=self._io_pool)
        # The engine drives the attempt through its face; the workflow's context gets the other one.
        c: EngineFace = attempt
        ops: ContextFace = attempt
        try:
            if not c.refuses_writes():
                await self._io(rs.claim_status, self.attempt_id)
            self.sinks.emit(EventKind.RUN_STARTED, info=RunStarted(
                run=self.ref.key, attempt_id=self.attempt_id, journal_records=loaded.next_seq,
                resumed=loaded.next_seq > 0, objects_read=loaded.objects_read,
                code_version=code_version, generation=c.gen, first_loaded=loaded.base,
                journal=loaded.records))
            done = loaded.records[-1] if loaded.records else None
            if isinstance(done, CompleteRecord) and not replay_only:
                try:
                    value = await c.recorded_value(done, "the workflow's result")
                except Halt as h:
                    return self._halt_result(h, c)
                return await self._finish(c, rs, self._result(
                    c, Outcome.COMPLETED, "the run had already completed", result=value,
                    result_info=await self._io(self._result_info, rs, done)), code_version)
            with self._lock:
                self._core = c
                self._apply_controls(c)
            return await self._passes(fn, c, ops, rs, code_version)
        finally:
            c.close()
            self._core = None

    async def _passes(self, fn: Workflow, c: EngineFace, ops: ContextFace, rs: RunStore,
                      code_version: str) -> AttemptResult:
        """Run the workflow; re-run it in process while a wait is already satisfied, and
        run the next generation after each ctx.continue_as_new."""
        self._next_hb = time.monotonic() + self.config.heartbeat_interval.total_seconds()
        waits = 0
        while True:
            outcome = await self._one_pass(fn, c, ops, rs)
            if isinstance(outcome, ContinueRecord):
                # continue_as_new: its record is durable; the next generation starts now.
                c.start_generation(outcome)
                self.sinks.emit(EventKind.CONTINUED_AS_NEW, generation=c.gen, seq=outcome.seq)
                waits = 0
                stalled = self._stalled(c)
                if stalled is not None:
                    outcome = self._halt_result(stalled, c)
                else:
                    continue
            if isinstance(outcome, AttemptResult):
                return await self._finish(c, rs, outcome, code_version)
            if self.config.replay is not None:  # never reached: a replay ends at the first wait it cannot replay
                return self._result(c, Outcome.FENCED, "a replay-only attempt does not wait")
            # Waiting: publish it, then look again (an event sent meanwhile is never lost:
            # a sender writes the event first and reads our status second).
            waiting = outcome
            # What it spent, as its budgets counted it: a budget wait journals nothing, so a cost charged since the
            # last record is not in the journal's totals yet (the next attempt's replay charges it again).
            spent = c.spent()
            message = (_waiting_message(waiting) if not waiting.budget else
                       f"waiting on its budget: ${spent.usd} and {spent.tokens} tokens spent, policy.askAt."
                       f"{waiting.budget} reached: {c.advice('askAt.' + waiting.budget)}, or abort the run")
            result = self._result(c, Outcome.WAITING, message, waiting=waiting, totals=spent)
            await c.final_snapshot()
            doc = self._status_doc(result, code_version, c.total_steps)
            polling_until = self._polls_until(waiting)
            if polling_until is not None:
                # A sender can tell that this attempt picks the event up by itself.
                doc["pollingUntil"] = format_time(polling_until, precise=True)
            if not await self._record_status(c, rs, doc):
                return self._result(c, Outcome.FENCED, OVERTAKEN)
            still = await self._still_waiting(c, rs, waiting)
            if c.fenced:
                return self._result(c, Outcome.FENCED, c.fenced)
            if not still:
                waits += 1
                if waits >= 10_000:
                    raise errors.WorkflowError(
                        "the workflow kept waiting for things already available")
                c.new_pass()
                continue
            return result

    def _polls_until(self, w: WaitingFor) -> datetime | None:
        """The deadline until which this attempt polls for the event in process, if it does."""
        if not w.event or w.deadline is None:
            return None
        remaining = (w.deadline - datetime.now(UTC)).total_seconds()
        return w.deadline if 0 < remaining <= self.config.inline_sleep_max.total_seconds() else None

    async def _still_waiting(self, c: EngineFace, rs: RunStore, w: WaitingFor) -> bool:
        now = datetime.now(UTC)
        if w.event:
            if await self._io(rs.get_event, w.event) is not None:
                return False
            if w.deadline is not None:
                remaining = (w.deadline - now).total_seconds()
                if remaining <= 0:
                    return False
                if remaining <= self.config.inline_sleep_max.total_seconds():
                    # Short deadline: poll in process until the event or the deadline.
                    end = time.monotonic() + remaining
                    while time.monotonic() < end:
                        try:
                            await c.pause(min(1.0, max(0.0, end - time.monotonic())))
                        except Halt:
                            return True
                        if await self._io(rs.get_event, w.event) is not None:
                            return False
                    return False
            return True
        if w.wake_time is not None:
            remaining = (w.wake_time - now).total_seconds()
            if remaining <= self.config.inline_sleep_max.total_seconds():
                try:
                    await c.pause(remaining)
                except Halt:
                    return True
                return False
        return True

    async def _one_pass(self, fn: Workflow, c: EngineFace, ops: ContextFace,
                        rs: RunStore) -> AttemptResult | WaitingFor | ContinueRecord:
        """One pass of the current generation. Returns how it ended, or the
        continue_as_new record that ended the generation."""
        try:
            wf_input = await c.workflow_input(self.input)
        except Halt as h:
            return self._halt_result(h, c)
        ctx = DurableContext(ops)
        task = c.start_workflow(fn(ctx, wf_input))
        loop = asyncio.get_running_loop()
        cancelled_for: Halt | None = None
        hb = self.config.heartbeat_interval.total_seconds()
        progress_timeout = _duration(self.policy.progressTimeout)
        assert self._wake is not None
        while not task.done():
            wake_task = loop.create_task(self._wake.wait())
            now = time.monotonic()
            timeout = min(self._next_hb - now, 1.0)
            if self._stop_at is not None:
                timeout = min(timeout, self._stop_at - now)
            timeout = max(0.0, timeout)
            await asyncio.wait({task, wake_task}, timeout=timeout,
                               return_when=asyncio.FIRST_COMPLETED)
            wake_task.cancel()
            self._wake.clear()
            with self._lock:
                self._apply_controls(c)
            now = time.monotonic()
            if task.done():
                break
            if c.fenced:
                cancelled_for = Halt(HaltKind.FENCE, c.fenced)
            elif self._stop_at is not None and now >= self._stop_at:
                cancelled_for = Halt(HaltKind.SUSPEND,
                                     "stopped as requested; steps still running after the "
                                     "grace period were cancelled and will run again")
            elif (stalled := self._stalled(c, progress_timeout)) is not None:
                cancelled_for = stalled
            else:  # maxDuration (not while a Saga undoes its work)
                cancelled_for = c.duration_halt()
            if cancelled_for is not None:
                task.cancel()
                with contextlib.suppress(BaseException):
                    await task
                break
            if now >= self._next_hb:
                self.sinks.emit(EventKind.HEARTBEAT, time=datetime.now(UTC))
                self._next_hb = now + hb

        if cancelled_for is not None:
            return self._halt_result(cancelled_for, c)
        if c.continued is not None:
            # The continuation is journaled: the generation is over, however the function
            # unwound (a resume would start the next generation too).
            if not task.cancelled():
                task.exception()  # retrieved: normally the ContinueAsNew signal itself
            return c.continued
        exc = task.exception() if not task.cancelled() else asyncio.CancelledError()
        if exc is None:
            return await self._complete(c, rs, task.result())
        if isinstance(exc, Halt):
            if exc.kind == HaltKind.WAIT and exc.waiting is not None:
                w = exc.waiting
                return WaitingFor(w.event, w.deadline, w.wake_time, datetime.now(UTC),
                                  compensations=c.open_compensations, budget=w.budget, quota=w.quota)
            return self._halt_result(exc, c)
        if isinstance(exc, asyncio.CancelledError):
            return self._result(c, Outcome.SUSPENDED, "the workflow was cancelled")
        if isinstance(exc, errors.ConfigError):
            return self._result(c, Outcome.USAGE_ERROR, str(exc), error_type=_qual(exc))
        if self.config.replay is not None:
            c.check_replayed_all()
        if not isinstance(exc, errors.StepError):  # a step's failure was shown with its own traceback already
            detail = "".join(traceback.format_exception(exc)[-4:]).strip()
            log.error("the workflow raised:\n%s", detail)
        return self._result(c, Outcome.FAILED, f"the workflow raised {type(exc).__qualname__}: {exc}",
                            error_type=_qual(exc))

    async def _complete(self, c: EngineFace, rs: RunStore, value: Any) -> AttemptResult:
        try:
            done, result = await c.complete(value)
        except Halt as h:
            return self._halt_result(h, c)
        except errors.DurableRunError as e:
            return self._result(c, Outcome.FAILED, str(e), error_type=_qual(e))
        overshoot = c.overshoot()
        message = "the workflow completed" + (f"; {overshoot}" if overshoot else "")
        return self._result(c, Outcome.COMPLETED, message, result=result, overshoot=overshoot,
                            result_info=await self._io(self._result_info, rs, done))

    def _result(self, c: EngineFace, outcome: Outcome, message: str,
                **fields: Any) -> AttemptResult:
        """How the attempt ended, with the totals and journal length it ended with."""
        fields.setdefault("totals", c.totals)
        return AttemptResult(outcome, message, journal_records=c.journal_records, **fields)

    def _result_info(self, rs: RunStore, done: CompleteRecord) -> dict[str, Any]:
        """Where the result of complete record ``done`` lives; its JSON too when small."""
        ref = done.ref
        if ref:  # a big result (above inline_result_max): its own content-addressed object
            where = layout.blob_key(str(ref["sha256"]))
            info: dict[str, Any] = {"size": int(ref["size"]), "sha256": str(ref["sha256"])}
            body: bytes | None = None
            if info["size"] <= RESULT_INLINE_MAX:  # only with a small inline_result_max
                with contextlib.suppress(errors.StoreError):  # the reference is enough
                    body = rs.get_blob(ref)
        else:
            body = done.inline_json()
            where = rs.journal().location(done.seq)
            info = {"size": len(body), "sha256": codec.sha256_hex(body)}
        if body is not None and info["size"] <= RESULT_INLINE_MAX:
            info["inline"] = body.decode()
        info["ref"] = f"{self.store.uri.rstrip('/')}/{self.ref.path}/{where}"
        return info

    def _stalled(self, c: EngineFace, progress_timeout: float | None = None) -> Halt | None:
        """The progress timeout, if no step completed for that long while running."""
        if progress_timeout is None:
            progress_timeout = _duration(self.policy.progressTimeout)
        if c.stalled_for() > progress_timeout:
            return Halt(HaltKind.ABORT,
                        f"no step completed for {self.policy.progressTimeout} "
                        f"(policy.progressTimeout): fix the hanging step, or "
                        f"{c.advice('progressTimeout')}",
                        reason=AbortReason.PROGRESS_TIMEOUT)
        return None

    def _halt_result(self, h: Halt, c: EngineFace) -> AttemptResult:
        kind_outcome = {
            HaltKind.SUSPEND: Outcome.SUSPENDED,
            HaltKind.ABORT: Outcome.ABORTED,
            HaltKind.FAIL: Outcome.FAILED,
            HaltKind.FENCE: Outcome.FENCED,
            HaltKind.WAIT: Outcome.WAITING,
        }
        if isinstance(h.error, errors.CorruptionError):
            return self._result(c, Outcome.FAILED, self._damaged(h.error), error_type=_qual(h.error))
        if h.kind == HaltKind.CRASH:
            err = h.error if isinstance(h.error, errors.StoreError) else None
            if isinstance(err, errors.StoreUnavailableError) or err is None:
                raise err or errors.StoreUnavailableError(h.message)
            outcome = Outcome.USAGE_ERROR if isinstance(err, errors.ConfigError) else Outcome.FAILED
            return self._result(c, outcome, h.message, error_type=_qual(err))
        # Cost charged outside a step since the last record is journaled with the next
        # record; report it too, so an abort says the cost that triggered it. (A resume
        # replays the add_cost call, so it is neither lost nor counted twice.)
        totals = c.spent()
        return self._result(
            c, kind_outcome[h.kind], h.message, abort_reason=h.reason,
            error_type=_qual(h.error) if h.error else None,
            totals=totals, overshoot=replay.budget_overshoot(totals, self.policy))

    async def _finish(self, c: EngineFace, rs: RunStore, result: AttemptResult,
                      code_version: str) -> AttemptResult:
        if result.outcome == Outcome.FENCED or c.refuses_writes():
            return result  # a fenced attempt writes nothing more
        with contextlib.suppress(Halt):
            await c.final_snapshot()
        try:
            if not await self._record_status(c, rs, self._status_doc(result, code_version, c.total_steps)):
                return self._result(c, Outcome.FENCED, OVERTAKEN)
        except errors.StoreError as e:
            self.sinks.emit(EventKind.WARNING, message=f"could not record the attempt's outcome: {e}")
        return result

    async def _record_status(self, c: EngineFace, rs: RunStore, doc: dict[str, Any]) -> bool:
        """Write status.json; False if this attempt no longer owns the run. Another attempt having claimed it
        since is not enough to say so (two local writers claim in one order and win the journal in the other):
        the write guard is asked again, and an attempt it still lets write claims the run back."""
        if await self._io(rs.write_status, doc):
            return True
        if c.refuses_writes():
            return False
        await self._io(rs.claim_status, self.attempt_id)
        return bool(await self._io(rs.write_status, doc))

    def _status_doc(self, result: AttemptResult, code_version: str,
                    total_steps: int | None) -> dict[str, Any]:
        doc = result.to_json()
        doc.update({"attempt": self.attempt_id, "time": format_time(time.time(), precise=True),
                    "codeVersion": code_version, "sdk": SDK_VERSION, "totalSteps": total_steps})
        if self.config.active_before is not None:  # what the next attempt's active_before is (the local CLI)
            doc["activeSeconds"] = round(active_time(self.config.active_before, self._attempt_start,
                                                     datetime.now(UTC)).total_seconds(), 3)
        return doc


def tuned_from_env(config: EngineConfig) -> EngineConfig:
    """``config`` with DURABLERUN_INLINE_SLEEP_MAX_SECONDS applied, if set (a pod's template env, the CLI's env)."""
    raw = os.environ.get(Env.INLINE_SLEEP_MAX_SECONDS)
    if not raw:
        return config
    try:
        seconds = float(raw)
    except ValueError:
        raise errors.ConfigError(f"{Env.INLINE_SLEEP_MAX_SECONDS}={raw!r} is not a number of seconds") from None
    return dataclasses.replace(config, inline_sleep_max=timedelta(seconds=seconds))


def _waiting_message(w: WaitingFor) -> str:
    if w.event:
        tail = f" (deadline {format_time(w.deadline, precise=True)})" if w.deadline else ""
        return f"waiting for event {w.event!r}{tail}"
    if w.quota:
        return (f"waiting for room in model quota {w.quota!r} until "
                f"{format_time(w.wake_time, precise=True) if w.wake_time else '?'}: the step that asked runs again "
                "from its start then")
    return f"sleeping until {format_time(w.wake_time, precise=True) if w.wake_time else '?'}"


def _duration(text: str) -> float:
    return parse_duration(text).total_seconds()


def _qual(e: BaseException) -> str:
    return f"{type(e).__module__}.{type(e).__qualname__}"


__all__ = [
    "AttemptResult",
    "EngineConfig",
    "Run",
    "RunStarted",
    "WaitingFor",
    "load_workflow",
]
