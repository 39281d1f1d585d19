"""The replay layer: where an operation sits in the journal, and what replaying it means.

The durable step loop fits in a sentence (DBOS's ``invoke_step``): for each
operation the workflow asks for, look its *position* up in the journal; if it
is there, return (or re-raise) what was recorded; if not, run it and record
the outcome durably before anything else happens. This module owns the first
half: positions, scopes (ctx.gather runs each branch in one of its own), the
index of the journal by position, divergence and the budgets checked before a
new operation. It does no IO and owns no
threads; the runtime (:mod:`durablerun._private.engine.core`) runs what it decides.

Positions are assigned when an operation is *called*, in call order, so they
are deterministic: ``"7"`` at the top level, ``"7.2.0"`` for the first
operation of branch 2 of a ``ctx.gather`` at position 7 (each gather branch
counts in its own scope, so the timing of concurrent branches never changes
a position). Journal *sequence numbers* are separate: the order records were
written in, which is what writers race for.

``ctx.continue_as_new(input)`` ends a *generation* of the workflow: the
engine calls the workflow function again with the new input, in the same
attempt, and the journal goes on. Generation ``g > 0`` prefixes its
positions with ``"g/"`` (``"3/7.2.0"``), so positions (and the idempotency
keys built from them) never repeat across generations, and each generation's
replay matches only its own records.
"""

from __future__ import annotations

import asyncio
import contextvars
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from typing import Any, TypeVar

from durablerun import errors
from durablerun._private.engine.halts import Halt, HaltKind, Waiting, strongest
from durablerun._private.records.model import CompleteRecord, Divergence, Record, ReplayProbe, StepRecord, Totals
from durablerun._private.storage.journal import Loaded
from durablerun.api import AbortReason
from durablerun.resource import ASK_COST, Policy

T = TypeVar("T")

_OP_KINDS = {
    "step": frozenset({"step"}),
    "value": frozenset({"value"}),
    "sleep": frozenset({"sleep"}),
    "wait": frozenset({"wait", "event"}),
    "continue": frozenset({"continue"}),
}


def gen_prefix(gen: int) -> str:
    """The position prefix of generation ``gen`` (none for the first)."""
    return f"{gen}/" if gen else ""


class ContinueAsNew(BaseException):
    """Unwinds the workflow function after its continue_as_new record is durable.

    A BaseException, so ``except Exception`` in workflow code does not stop it.
    """


@dataclass
class Scope:
    prefix: tuple[int, ...]
    owner: asyncio.Task[Any] | None
    counter: int = 0


@dataclass
class StepFrame:
    """The step running in this context: its position, and the cost it charged so far."""

    position: str
    name: str
    #: Which try of the step is running (from 1; its record's ``attempts`` once journaled).
    tries: int = 0
    usd: Decimal = Decimal(0)
    tokens: int = 0
    #: The longest wait the step waits out in process (EngineConfig.inline_sleep_max); longer ones end the attempt.
    inline_wait: float = 60.0


#: The error type of an abort marker: a step record journaled where an abort stopped a Saga's block
#: (see sagas.Ledger.mark_abort). Replaying that position aborts again, with the same reason and
#: message, so the Saga resumes its compensations and the work it undid is never done again.
ABORT_MARK = "durablerun.Aborted"


def abort_mark(recs: dict[str, Record]) -> Halt | None:
    """The abort journaled at this position, if an abort marker is there."""
    rec = recs.get("step")
    err = rec.error if isinstance(rec, StepRecord) and not rec.ok else None
    if err and err.get("type") == ABORT_MARK and err.get("module") == "durablerun":
        return Halt(HaltKind.ABORT, str(err.get("message", "")),
                    reason=AbortReason(str(err.get("reason", AbortReason.USER_REQUESTED.value))))
    return None


SCOPE: contextvars.ContextVar[Scope] = contextvars.ContextVar("durablerun_scope")
STEP: contextvars.ContextVar[StepFrame | None] = contextvars.ContextVar(
    "durablerun_step", default=None
)


async def in_scope(scope: Scope, aw: Awaitable[T]) -> T:
    """Await ``aw`` in the task that owns ``scope`` (the one allowed to number positions in it)."""
    scope.owner = asyncio.current_task()
    return await aw


async def gather(prefix: tuple[int, ...], aws: tuple[Awaitable[Any], ...],
                 return_exceptions: bool) -> list[Any]:
    """ctx.gather at position ``prefix``: branch ``i`` numbers its operations in scope
    ``(*prefix, i)``. Every branch finishes before a failure is raised; a Halt wins over
    other failures (the strongest of them)."""
    loop = asyncio.get_running_loop()
    tasks: list[asyncio.Task[Any]] = []
    for i, aw in enumerate(aws):
        scope = Scope((*prefix, i), None)
        ctx = contextvars.copy_context()
        ctx.run(SCOPE.set, scope)
        tasks.append(loop.create_task(in_scope(scope, aw), context=ctx))
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


def pos_str(pos: tuple[int, ...]) -> str:
    return ".".join(map(str, pos))


def pos_tuple(pos: str) -> tuple[int, ...]:
    return tuple(int(p) for p in pos.split("."))


@dataclass
class Live:
    """Mutable per-attempt state shared across passes of the workflow."""

    loaded: Loaded
    index: dict[str, dict[str, Record]] = field(default_factory=dict)
    scope_max: dict[tuple[int, ...], int] = field(default_factory=dict)
    totals: Totals = field(default_factory=Totals)
    pending_usd: Decimal = Decimal(0)
    pending_tokens: int = 0
    inflight_steps: int = 0
    last_progress: float = field(default_factory=time.monotonic)
    sleeping: int = 0
    #: Steps between their start and their journal record (continue_as_new waits for none).
    open_steps: int = 0
    #: Position prefix of the current generation ("" for the first, "3/" for the fourth).
    prefix: str = ""
    #: The steps the workflow expects in all (ctx.set_total_steps), if it said.
    total_steps: int | None = None
    #: A replay-only attempt's findings (EngineConfig.replay): divergences are recorded here too.
    probe: ReplayProbe | None = None

    def journal_end(self, what: str) -> None:
        """A new operation (``what``): a replay-only attempt stops here, at the journal's end, having run nothing."""
        if self.probe is None:
            return
        if self.probe.end is None:
            self.probe.end = what
        raise Halt(HaltKind.FENCE, f"replayed the whole journal; it ends before {what}")

    def replayed_completion(self, reached: set[str]) -> CompleteRecord:
        """A replay-only attempt's workflow returned: the journal's completion, if it completed too (else its end)."""
        reached.add("end")  # the complete record's own position
        self.check_unreached(reached)
        done = self.index.get("end", {}).get("complete")
        if not isinstance(done, CompleteRecord):
            self.journal_end("the workflow's completion")
        assert isinstance(done, CompleteRecord)
        return done

    def diverged(self, pos: str, expected: str, found: str, message: str) -> Halt:
        """The halt of a divergence at ``pos``; a replay-only attempt also records the first one."""
        if self.probe is not None and self.probe.divergence is None:
            self.probe.divergence = Divergence(pos, expected, found, message)
        err = errors.DivergenceError(message)
        return Halt(HaltKind.FAIL, str(err), error=err)

    def reset(self, prefix: str) -> None:
        """A new generation: nothing journaled before it is looked up again."""
        self.prefix = prefix
        self.index = {}
        self.scope_max = {}

    def add(self, record: Record) -> None:
        kind = record.kind
        if kind == "continue":
            return  # it ended the previous generation; nothing looks it up
        pos = record.pos
        if kind != "complete":
            if self.prefix:
                if not pos.startswith(self.prefix):
                    return  # another generation's record
                local = pos[len(self.prefix):]
            elif "/" in pos:
                return
            else:
                local = pos
        key = f"patch:{record.name}" if kind == "patch" else kind
        self.index.setdefault(pos, {})[key] = record
        if kind in ("patch", "complete"):
            return
        t = pos_tuple(local)
        for j in range(0, len(t), 2):
            prefix = t[:j]
            if self.scope_max.get(prefix, -1) < t[j]:
                self.scope_max[prefix] = t[j]

    def replaying_at(self, cur: tuple[int, ...]) -> bool:
        """Is there any journaled operation at or after ``cur`` in its scope?"""
        for j in range(0, len(cur), 2):
            m = self.scope_max.get(cur[:j], -1)
            if j == len(cur) - 1:
                if m >= cur[j]:
                    return True
            elif m > cur[j]:
                return True
        return False

    def lookup(self, pos: str, family: str, name: str) -> dict[str, Record]:
        """Journaled records of this operation at ``pos`` (empty: not yet run)."""
        recs = self.index.get(pos)
        if not recs:
            return {}
        ops = {k: r for k, r in recs.items() if not k.startswith("patch:")}
        if not ops:
            return {}
        halt = abort_mark(ops)
        if halt is not None:
            raise halt
        kinds = _OP_KINDS[family]
        for kind, rec in ops.items():
            if kind not in kinds or rec.name != name:
                raise self.diverged(
                    pos, f"{kind} {rec.name!r}", f"{family} {name!r}",
                    f"replay diverged at journal position {pos}: the journal holds "
                    f"{kind} {rec.name!r} there, but the workflow now asks for {family} "
                    f"{name!r}. The code changed in a way that does not fit this run's "
                    "journal: guard the change with ctx.patched('<change-id>') (docs/sdk.md, "
                    "'Changing a workflow'), or finish this run with the code it started with. "
                    "Nothing journaled was changed.")
        return ops

    def check_unreached(self, reached: set[str]) -> None:
        """At completion: every journaled operation must have been reached."""
        for pos, recs in self.index.items():
            if pos in reached:
                continue
            ops = [r for k, r in recs.items() if not k.startswith("patch:")]
            if ops:
                raise self.diverged(
                    pos, f"{ops[0].kind} {ops[0].name!r}", "nothing (the workflow ended first)",
                    f"the workflow finished without reaching journal position {pos}, which "
                    f"holds {ops[0].kind} {ops[0].name!r}: the code changed in a way that does "
                    "not fit this run's journal (guard changes with ctx.patched). Nothing "
                    "journaled was changed.")


# --- budgets -------------------------------------------------------------------------------


def budget_halt(live: Live, policy: Policy, max_cost: Decimal | None,
                advice: Callable[[str], str]) -> Halt | None:
    """Why a new step may not start (a budget is used up: an abort; a soft one, policy.askAt: a wait), or None.

    Budgets are checked before a new step starts: a step already running
    finishes and is journaled, so its cost can end past the ceiling (an overshoot).
    """
    p = policy
    usd = live.totals.usd + live.pending_usd
    tokens = live.totals.tokens + live.pending_tokens
    if max_cost is not None and usd >= max_cost:
        return Halt(HaltKind.ABORT,
                    f"cost ${usd} reached the ceiling ${max_cost} (policy.costCeilingUSD, "
                    f"checked before each step starts): {advice('costCeilingUSD')}",
                    reason=AbortReason.BUDGET_EXHAUSTED)
    if p.maxTokens is not None and tokens >= p.maxTokens:
        return Halt(HaltKind.ABORT,
                    f"{tokens} tokens used, limit {p.maxTokens} (policy.maxTokens, checked "
                    f"before each step starts): {advice('maxTokens')}",
                    reason=AbortReason.BUDGET_EXHAUSTED)
    used = live.totals.steps + live.inflight_steps
    if p.maxSteps is not None and used >= p.maxSteps:
        running = f" and {live.inflight_steps} running" if live.inflight_steps else ""
        return Halt(HaltKind.ABORT,
                    f"{_count(live.totals.steps, 'step')} journaled{running}, limit {p.maxSteps} "
                    f"(policy.maxSteps, checked before each step starts): {advice('maxSteps')}",
                    reason=AbortReason.BUDGET_EXHAUSTED)
    asked = p.asks(usd, tokens)
    if asked is not None and p.askAt is not None:
        spent, limit = ((f"cost ${usd}", f"${p.askAt.costUSD}") if asked == ASK_COST
                        else (f"{tokens} tokens", str(p.askAt.tokens)))
        return Halt(HaltKind.WAIT, f"{spent} reached policy.askAt.{asked} {limit}: waiting for a person to raise "
                    "it or abort the run", waiting=Waiting(budget=asked))
    return None


def duration_halt(first_start: datetime, max_duration: timedelta, policy: Policy,
                  advice: Callable[[str], str]) -> Halt | None:
    """policy.maxDuration, counted from the run's first start, is past: why, else None."""
    elapsed = datetime.now(UTC) - first_start
    if elapsed >= max_duration:
        return Halt(HaltKind.ABORT,
                    f"the run has been going for {elapsed} since its first start, past "
                    f"policy.maxDuration {policy.maxDuration}: {advice('maxDuration')}",
                    reason=AbortReason.MAX_DURATION_EXCEEDED)
    return None


def _count(n: int, noun: str) -> str:
    return f"{n} {noun}" + ("" if n == 1 else "s")


def budget_overshoot(t: Totals, p: Policy) -> str | None:
    """A budget the journaled totals went past (a running step charged it after the check)."""
    over = []
    if p.costCeilingUSD is not None and t.usd > Decimal(p.costCeilingUSD):
        over.append(f"cost ${t.usd} is past policy.costCeilingUSD ${p.costCeilingUSD}")
    if p.maxTokens is not None and t.tokens > p.maxTokens:
        over.append(f"{t.tokens} tokens are past policy.maxTokens {p.maxTokens}")
    if p.maxSteps is not None and t.steps > p.maxSteps:
        over.append(f"{t.steps} steps are past policy.maxSteps {p.maxSteps}")
    if not over:
        return None
    return ("budget overshoot: " + "; ".join(over) + " (budgets are checked before each step "
            "starts; steps already running charged it)")


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


def throttled(quota: str, seconds: float) -> Halt | None:
    """The wait that ends the attempt when a call in this step finds no room in ``quota`` for ``seconds``, or
    None if the step waits that out in process (or runs outside a step). The run waits with no process and
    runs the step again from its start when the room is due: nothing of the step is journaled yet."""
    frame = STEP.get()
    if frame is None or seconds <= frame.inline_wait:
        return None
    # The wait is this call's own turn (shared windows keep a place in line for it, under the run's name): runs
    # throttled together wake one after another, not all at once.
    wake = datetime.now(UTC) + timedelta(seconds=seconds)
    return Halt(HaltKind.WAIT, f"no room in model quota {quota!r} for {seconds:.0f}s",
                waiting=Waiting(wake_time=wake, quota=quota))


def misuse(message: str) -> Halt:
    return Halt(HaltKind.FAIL, message, error=errors.WorkflowError(message))
