"""Sagas: compensations that undo a block's finished steps when it fails or is aborted.

The whole mechanism is here (docs/agents.md, "Compensation: Sagas"):

* :class:`Saga`, the block a workflow writes (public as ``durablerun.agents.Saga``): it
  registers compensations and runs them, last first, each a step of the context;
* :class:`Ledger`, one attempt's account of its Sagas: the compensations registered and
  not run (a wait reports them to the operator as ``status.waitingFor.compensations``,
  so that an abort while the run waits gets an attempt to run them), the Sagas
  compensating after an abort right now (the engine does not stop them for
  ``maxDuration``), and the abort marker journaled where an abort stopped an operation
  inside a Saga block;
* :data:`COMPENSATING`, which lets a Saga's compensation steps start although the run
  is aborting (the core asks it before each new operation).

Replaying an abort marker (the run aborts again at that position) is the replay
layer's: :func:`durablerun._private.engine.replay.abort_mark`.
"""

from __future__ import annotations

import contextlib
import contextvars
from collections.abc import Awaitable, Callable, Coroutine, Iterator
from dataclasses import dataclass, field
from types import TracebackType
from typing import Any, Protocol, TypeVar

from durablerun import errors
from durablerun._private.engine.halts import Halt, HaltKind
from durablerun._private.engine.replay import ABORT_MARK, abort_mark
from durablerun._private.engine.writer import Writer
from durablerun._private.records.model import StepRecord
from durablerun.api import AbortReason

T = TypeVar("T")

#: How many Saga blocks enclose the running workflow code: an abort that stops an operation
#: inside one is journaled there (Ledger.mark_abort).
DEPTH: contextvars.ContextVar[int] = contextvars.ContextVar("durablerun_sagas", default=0)
#: Set while a Saga compensates after an abort: its steps may start although the run is aborting,
#: and no budget stops them.
COMPENSATING: contextvars.ContextVar[bool] = contextvars.ContextVar("durablerun_compensating",
                                                                    default=False)


class Ledger:
    """One attempt's Sagas, as the core and the engine see them. Made by the core.

    ``open``: compensations registered in open Sagas this pass and not run yet (what a wait
    reports); ``running``: Sagas compensating after an abort right now.
    """

    def __init__(self, writer: Writer) -> None:
        self._writer = writer
        self.open = 0
        self.running = 0

    def new_pass(self) -> None:
        """The workflow runs again from the top: its Sagas register again as they replay."""
        self.open = 0

    @contextlib.contextmanager
    def compensating(self) -> Iterator[None]:
        """Let the steps started in this block run while the run aborts (a Saga's compensations)."""
        token = COMPENSATING.set(True)
        self.running += 1
        try:
            yield
        finally:
            self.running -= 1
            COMPENSATING.reset(token)

    async def marking_aborts(self, pos: str, name: str, op: Awaitable[T]) -> T:
        """Await operation ``name`` at ``pos``; journal an abort that stops it inside a Saga."""
        try:
            return await op
        except Halt as h:
            await self.mark_abort(pos, name, h)
            raise

    async def mark_abort(self, pos: str, name: str, halt: Halt) -> None:
        """Journal that an abort stopped operation ``name`` at ``pos`` inside a Saga block.

        The Saga is about to undo the work before it; without the marker a resumed run (a crash
        while compensating, a raised limit) would run the refused operation and those after it
        after all. Replaying the marker aborts again (replay.abort_mark). Not counted as a step.
        """
        if halt.kind != HaltKind.ABORT or not DEPTH.get() or COMPENSATING.get():
            return
        if abort_mark(self._writer.live.index.get(pos, {})) is not None:
            return  # replayed: the marker is already there
        reason = (halt.reason or AbortReason.USER_REQUESTED).value
        # Its advice ("raise the limit to continue") no longer holds once the Saga undoes the work.
        halt.message += (f"; but it stopped {name!r} (position {pos}) inside a Saga, which undid "
                         "the work before it, so this run stays Aborted whatever the limits: start "
                         "a new run to try again")
        await self._writer.commit(StepRecord(pos=pos, name=name, ok=False, attempts=0, error={
            "type": ABORT_MARK, "module": "durablerun", "message": halt.message,
            "reason": reason}))


#: The running attempt's ledger, set in the context every pass of the workflow runs in.
LEDGER: contextvars.ContextVar[Ledger] = contextvars.ContextVar("durablerun_ledger")


def _ledger() -> Ledger:
    try:
        return LEDGER.get()
    except LookupError:
        raise errors.WorkflowError(
            "a Saga is used outside a workflow: open it in the workflow function, "
            "async with Saga(ctx) as saga: ...") from None


class Context(Protocol):
    """What a Saga needs of the workflow's DurableContext (its public ``step``): a protocol, so that
    this module sits below context.py (docs/architecture.md)."""

    @property
    def step(self) -> Callable[..., Coroutine[Any, Any, Any]]: ...


@dataclass
class _Compensation:
    name: str
    fn: Callable[..., Any]
    args: tuple[Any, ...]
    kwargs: dict[str, Any]


@dataclass
class Saga:
    """Compensations that undo finished steps, run in reverse order when the block fails or is aborted.

    ::

        async with Saga(ctx) as saga:
            flight = await ctx.step("book-flight", book_flight, trip)
            saga.add("cancel-flight", cancel_flight, flight["id"])
            hotel = await ctx.step("book-hotel", book_hotel, trip)
            saga.add("cancel-hotel", cancel_hotel, hotel["id"])
            await ctx.step("charge", charge_card, trip)       # fails: cancel-hotel, then cancel-flight

    Registering is plain workflow code: a replay registers the same compensations as it passes the
    same steps. Each compensation is a step (retried, journaled), so a crash while compensating
    resumes where it stopped. Then the block's exception is raised again; a compensation that fails
    for good raises :class:`~durablerun.errors.StepError` with the original error as its context.

    An abort (a budget, a user abort) that stops the block at an operation is journaled there, the
    compensations run (no budget stops them), and the run ends Aborted as it would have. A replay of
    that position aborts again: a crash while compensating resumes the compensations, and a run
    retried or given a higher limit stays Aborted (what was undone is never done again).
    """

    ctx: Context
    compensations: list[_Compensation] = field(default_factory=list)
    _entered: list[contextvars.Token[int]] = field(default_factory=list, repr=False)

    def add(self, name: str, fn: Callable[..., Any], /, *args: Any, **kwargs: Any) -> None:
        """Register ``fn(*args, **kwargs)`` as the step ``compensate:<name>`` to run if the block fails."""
        self.compensations.append(_Compensation(name, fn, args, kwargs))
        _ledger().open += 1

    async def __aenter__(self) -> Saga:
        self._entered.append(DEPTH.set(DEPTH.get() + 1))
        return self

    async def __aexit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                        tb: TracebackType | None) -> None:
        try:
            if isinstance(exc, Exception):
                try:
                    await self.compensate()
                except Halt as halt:  # aborted while compensating a failure: finish undoing, then abort
                    await self._compensate_after(halt)
                    raise
            elif isinstance(exc, Halt):
                await self._compensate_after(exc)
            elif exc is None:  # completed: nothing of it is left to undo
                _ledger().open -= len(self.compensations)
                self.compensations.clear()
            # Otherwise the attempt is ending another way (a stop, a fence, a wait, a cancellation):
            # a resume carries on from the journal, nothing to undo now.
        finally:
            DEPTH.reset(self._entered.pop())

    async def _compensate_after(self, halt: Halt) -> None:
        """After an abort, undo the block's work; the abort goes on afterwards (the caller raises it)."""
        if halt.kind != HaltKind.ABORT:
            return
        with _ledger().compensating():
            await self.compensate()

    async def compensate(self) -> None:
        """Run the registered compensations now, last first (each once, as a step)."""
        while self.compensations:
            c = self.compensations[-1]
            await self.ctx.step(f"compensate:{c.name}", c.fn, *c.args, **c.kwargs)
            self.compensations.pop()  # only once done: one refused by an abort runs after it
            _ledger().open -= 1
