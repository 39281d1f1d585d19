"""DurableContext: what a workflow function receives as its first argument."""

from __future__ import annotations

import os
import uuid as uuid_mod
from collections.abc import Awaitable, Callable, Coroutine
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from typing import Any, NoReturn, TypeVar, overload

from durablerun import api, errors
from durablerun._private.engine import children, core, replay, webhook_urls
from durablerun._private.engine.seams import ContextFace
from durablerun._private.engine.streams import Stream
from durablerun._private.records import layout
from durablerun.api import format_time, parse_time

T = TypeVar("T")

_NAME_MAX = 200


def _check_step_name(name: Any) -> str:
    if not isinstance(name, str) or not name or len(name) > _NAME_MAX:
        raise errors.WorkflowError(
            f"a step name must be a non-empty string of at most {_NAME_MAX} characters, "
            f"got {name!r}"
        )
    return name


class DurableContext:
    """The durable operations a workflow can perform.

    Every operation takes a *position* in the run's journal, in the order the
    workflow calls them. On a resume the workflow function runs again from the
    top; operations already journaled return their recorded outcome instantly
    instead of running again. Code between operations re-runs on every resume:
    keep it cheap and free of side effects (put side effects in steps).
    """

    def __init__(self, attempt: ContextFace) -> None:
        self._core = attempt

    @property
    def run_id(self) -> str:
        """The run's identity: ``<namespace>/<name>/<uid>`` or ``_local/<run-id>``."""
        return self._core.run_key

    # --- steps ------------------------------------------------------------------------
    @overload
    def step(
        self,
        name: str,
        fn: Callable[..., Awaitable[T]],
        /,
        *args: Any,
        retries: int | None = None,
        **kwargs: Any,
    ) -> Coroutine[Any, Any, T]: ...

    @overload
    def step(
        self, name: str, fn: Callable[..., T], /, *args: Any, retries: int | None = None,
        **kwargs: Any,
    ) -> Coroutine[Any, Any, T]: ...

    def step(
        self,
        name: str,
        fn: Callable[..., Any],
        /,
        *args: Any,
        retries: int | None = None,
        **kwargs: Any,
    ) -> Coroutine[Any, Any, Any]:
        """Run ``fn(*args, **kwargs)`` as a journaled step named ``name``; await the result.

        The position is taken when ``step`` is *called*, so
        ``ctx.gather(ctx.step("a", ...), ctx.step("b", ...))`` journals
        deterministically however the two finish. ``fn`` may be sync (it runs
        in a worker thread) or async. A failing step is retried ``retries``
        times (default: ``policy.maxRetries``) with exponential backoff and
        jitter, unless it raises :class:`~durablerun.errors.NonRetryableError`.
        When it fails for good the workflow gets a :class:`~durablerun.errors.StepError`.
        The result must be JSON-serializable (or a pydantic model); it comes
        back as a replay would return it (e.g. tuples become lists).
        """
        _check_step_name(name)
        if not callable(fn):
            raise errors.WorkflowError(f"step {name!r}: fn must be callable, got {fn!r}")
        if retries is not None and (not isinstance(retries, int) or retries < 0):
            raise errors.WorkflowError(f"step {name!r}: retries must be an int >= 0")
        c = self._core
        pos = c.pstr(c.allocate(f"ctx.step({name!r})"))
        return c.step(pos, c.gen, name, fn, args, kwargs, retries)

    async def gather(self, *aws: Awaitable[Any], return_exceptions: bool = False) -> list[Any]:
        """Run awaitables concurrently with deterministic journal positions.

        Pass steps (``ctx.step(...)``) or coroutines of your own that call ctx
        operations: each branch numbers its operations in its own scope.
        Unlike ``asyncio.gather`` it waits for *every* branch before raising the
        first failure, so a failure in one branch never loses the results the
        others journaled.
        """
        return await self._core.gather(aws, return_exceptions)

    async def continue_as_new(self, input: Any) -> NoReturn:
        """End this generation of the workflow and start it again with ``input``.

        Journals a record holding ``input`` (JSON-serializable or a pydantic
        model, checked like a step result), then unwinds the workflow
        function: this call never returns. The engine calls the workflow
        function again, in the same attempt, with ``input`` as its input (as
        a replay would decode it). The journal goes on: totals, budgets and
        events carry over, and positions of the new generation are prefixed
        with its number (``"3/0"``), so idempotency keys never repeat.

        A resume starts from the last continuation: it reads and replays only
        the current generation, however long the run has been going. Use it
        in long loops (an agent's turns, a poller) every few hundred or
        thousand steps, carrying the state the loop needs in ``input``.

        Call it from the workflow function itself, with no step still
        running: not inside a step or a ``ctx.gather`` branch.
        """
        await self._core.continue_as_new(input)

    # --- waiting ------------------------------------------------------------------------
    async def wait_for_event(
        self,
        name: str,
        *,
        timeout: timedelta | None = None,  # noqa: ASYNC109 - a durable deadline
    ) -> Any:
        """Return the payload of event ``name`` once it has been sent.

        If it has not arrived, the attempt ends as Waiting (no process stays
        alive); sending the event (``durablerun send-event``, or
        ``spec.events`` on Kubernetes) and running again delivers it. The
        first value sent for a name wins. Past ``timeout`` (measured from the
        first time the run reached this point) it raises
        :class:`~durablerun.errors.EventTimeout`.
        """
        api.check_event_name(name)
        return await self._core.wait_for_event(name, timeout)

    async def sleep(self, duration: timedelta | float) -> None:
        """Sleep durably. Short sleeps sleep in process; long ones end the
        attempt as Waiting with a wake time (EngineConfig.inline_sleep_max)."""
        if not isinstance(duration, timedelta):
            duration = timedelta(seconds=float(duration))
        await self._core.sleep(duration)

    # --- other runs ---------------------------------------------------------------------------
    async def start_child(
        self, name: str, workflow: str, input: dict[str, Any] | None = None, *,
        policy: dict[str, Any] | None = None,
    ) -> children.ChildRun:
        """Start a child DurableRun ``<this run>-<name>`` running ``workflow`` on ``input``; a handle.

        The operator creates it (same namespace, this run's pod template and checkpoint store,
        this run's policy with ``policy``'s fields over it: budgets may only be lowered), owned by
        this run. Journaled like a step: a replay does not start it again. ``await handle``
        returns its result, or raises :class:`ChildRunFailed`. Needs the operator: a local run
        fails with a usage error.
        """
        return await children.start_child(self, self._core.config.runs, name, workflow, input, policy)

    async def run_child(
        self, name: str, workflow: str, input: dict[str, Any] | None = None, *,
        policy: dict[str, Any] | None = None,
    ) -> Any:
        """``await (await ctx.start_child(...))``: start a child run and return its result."""
        handle = await children.start_child(self, self._core.config.runs, name, workflow, input, policy)
        return await handle.result()

    async def signal(self, run: str, event: str, value: Any = None) -> None:
        """Send event ``event`` with ``value`` to DurableRun ``run`` in this namespace, through the operator.

        The target's first value for ``event`` wins (as for ``spec.events``). Journaled: a replay
        does not send it again. Returns once the request is recorded; the operator delivers it.
        """
        await children.signal(self, self._core.config.runs, run, event, value)

    def webhook_url(self, event: str, ttl: timedelta | float = timedelta(days=7)) -> str:
        """A URL that sends ``event`` to this run when an outside system POSTs JSON to it, until ``ttl``.

        Hand it to a CI system, a payment provider or a person; then ``ctx.wait_for_event(event)``.
        The URL carries a token signed for this namespace, run and event only (docs/web.md); the
        webhook ingress turns the POST's body into the event, first write wins. Recorded once: a
        replay returns the same URL. Needs the chart's webhook ingress (``webhooks.enabled``).
        """
        api.check_event_name(event)
        lifetime = ttl if isinstance(ttl, timedelta) else timedelta(seconds=ttl)
        if lifetime <= timedelta(0):
            raise errors.WorkflowError(f"ctx.webhook_url: ttl must be positive, got {ttl!r}")
        return self._core.value(
            "webhook_url", lambda: webhook_urls.capability_url(event, lifetime, os.environ, datetime.now(UTC)))

    # --- output ---------------------------------------------------------------------------------
    def stream_url(self, name: str, ttl: timedelta | float = timedelta(days=7)) -> str:
        """A URL that reads output stream ``name`` of this run from outside the cluster, until ``ttl``.

        A GET answers Server-Sent Events through the webhook ingress: one event per chunk, its offset as
        the event's id, resumable with ``Last-Event-ID`` (docs/sdk.md, "Reading a stream over HTTP"). The
        token in it reads that one stream of this run only; it cannot send an event, nor an event URL
        read a stream. Recorded once: a replay returns the same URL. Needs the chart's webhook ingress
        (``webhooks.enabled``) with read access to the run's store (``webhooks.streams.storeSecrets``).
        """
        problem = layout.stream_name_error(name)
        if problem is not None:
            raise errors.WorkflowError(f"ctx.stream_url: {problem}")
        lifetime = ttl if isinstance(ttl, timedelta) else timedelta(seconds=ttl)
        if lifetime <= timedelta(0):
            raise errors.WorkflowError(f"ctx.stream_url: ttl must be positive, got {ttl!r}")
        return self._core.value("stream_url", lambda: webhook_urls.stream_capability_url(
            name, lifetime, os.environ, datetime.now(UTC)))

    def stream(self, name: str) -> Stream:
        """The run's output stream ``name``: append-only text its steps write as they go (docs/sdk.md,
        "Output streams").

        ``stream.write(text)`` from a sync step, ``await stream.awrite(text)`` from an async one; a write
        from the workflow function itself is refused (it runs again on every resume). Writes are batched
        into chunks in the run's store, durable before their step is journaled, and read with
        ``durablerun stream NAME`` or ``kubectl durablerun stream RUN NAME``, live or after the run.
        What a step wrote in a try that did not count (its attempt was killed before the step was
        journaled, or the try failed and was retried) is marked superseded; ``--final`` hides it.
        Names: 1-128 letters, digits, '.', '_' or '-', starting with a letter or digit.
        """
        return self._core.stream(name)

    # --- deterministic values ---------------------------------------------------------------
    def now(self) -> datetime:
        """The current UTC time, recorded once: identical on every replay."""
        return parse_time(self._core.value("now", lambda: format_time(datetime.now(UTC), precise=True)))

    def uuid(self) -> uuid_mod.UUID:
        """A random UUID, recorded once: identical on every replay."""
        return uuid_mod.UUID(self._core.value("uuid", core.new_uuid))

    def patched(self, change_id: str) -> bool:
        """True for runs that reach this point with the new code, False for old journals.

        Write ``if ctx.patched("my-change"): new path else: old path``. A run
        whose journal already went past this point without the marker takes
        the old path; every other run records the marker and takes the new one.
        """
        if not isinstance(change_id, str) or not change_id:
            raise errors.WorkflowError("ctx.patched needs a non-empty change id")
        return self._core.patched(change_id)

    # --- accounting -----------------------------------------------------------------------------
    def add_cost(self, *, usd: Decimal | str | int | float = 0, tokens: int = 0) -> None:
        """Charge cost to the run; journaled with the current step (or the next record).

        Inside a step it is part of that step's record. Outside steps it is
        counted once: code re-running during replay does not charge again.
        Budgets (``costCeilingUSD``, ``maxTokens``) are checked before every step.
        """
        amount = usd if isinstance(usd, Decimal) else Decimal(str(usd))
        if amount < 0 or tokens < 0:
            raise errors.WorkflowError("add_cost takes non-negative amounts")
        self._core.add_cost(amount, int(tokens))

    def set_total_steps(self, total: int | None) -> None:
        """Declare how many steps the whole run is expected to take (``None``: unknown).

        It is the denominator of the run's progress: ``12/40`` in the
        DurableRun's Progress column, ``status.progress.totalSteps`` and
        ``fraction``, and ``durablerun_run_progress_ratio`` while it runs. Call
        it again whenever the estimate changes. It is not journaled: like all
        code outside steps it runs again on a resume, so derive it from the
        input or from step results. Call it from the workflow, not a step.
        """
        if total is not None and (not isinstance(total, int) or isinstance(total, bool)
                                  or total < 0):
            raise errors.WorkflowError(
                f"ctx.set_total_steps takes a whole number >= 0 or None, got {total!r}")
        self._core.set_total_steps(total)

    def idempotency_key(self) -> str:
        """Inside a step: ``<run>:<position>:<step name>``, stable across retries and resumes."""
        frame = replay.STEP.get()
        if frame is None:
            raise errors.WorkflowError("ctx.idempotency_key() is only available inside a step")
        return f"{self._core.run_key}:{frame.position}:{frame.name}"
