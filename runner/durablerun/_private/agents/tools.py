"""The implementation of durablerun.agents (see its docstring).

Built on the public DurableContext only (docs/architecture.md); the Saga is the runtime's
(:mod:`durablerun._private.engine.sagas`), re-exported here.
"""

from __future__ import annotations

import enum
import inspect
import json
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from durablerun import errors
from durablerun._private.engine.context import DurableContext
from durablerun._private.engine.sagas import Saga

__all__ = ["Saga", "SideEffect", "Tool", "bound_history", "tool"]

class SideEffect(enum.StrEnum):
    """What a tool does to the world, which decides how a call is replayed."""

    #: Pure computation: runs inline, again on every replay (it must give the same answer).
    NONE = "none"
    #: Reads something that may change: a step; a replay returns what was read the first time.
    READ = "read"
    #: Changes state you own (a database row): a step, retried on failure; it can run twice if the
    #: process dies after the write and before the journal record, so key it if it is not idempotent.
    WRITE = "write"
    #: Acts on the world outside (an email, a payment): a step, never retried unless it takes an
    #: idempotency key the other side deduplicates on (a retry after a lost answer would act twice).
    EXTERNAL = "external"


@dataclass(frozen=True)
class Tool:
    """A tool function with its declared side effect; call it with ``await t(ctx, *args, **kwargs)``."""

    fn: Callable[..., Any]
    name: str
    side_effect: SideEffect
    requires_key: bool
    retries: int | None

    async def __call__(self, ctx: DurableContext, *args: Any, idempotency_key: str | None = None,
                       **kwargs: Any) -> Any:
        if self.requires_key:
            if not isinstance(idempotency_key, str) or not idempotency_key:
                raise errors.WorkflowError(
                    f"tool {self.name!r} ({self.side_effect} side effect) requires an idempotency key and got "
                    f"none: call it with idempotency_key=... (a key the other side deduplicates on, derived "
                    f"from your data, e.g. f'refund-{{order_id}}')")
            kwargs["idempotency_key"] = idempotency_key
        if self.side_effect is SideEffect.NONE:
            result = self.fn(*args, **kwargs)
            return await result if inspect.isawaitable(result) else result
        retries = self.retries
        if retries is None and self.side_effect is SideEffect.EXTERNAL and not self.requires_key:
            retries = 0
        return await ctx.step(f"tool:{self.name}", self.fn, *args, retries=retries, **kwargs)


def tool(side_effect: SideEffect | str, *, idempotency_key: bool = False, name: str | None = None,
         retries: int | None = None) -> Callable[[Callable[..., Any]], Tool]:
    """Declare a tool's side effect (``none``, ``read``, ``write``, ``external``).

    With ``idempotency_key=True`` every call must pass ``idempotency_key=...``, which the function
    receives as its keyword argument of that name; a call without one is refused before it runs.
    ``retries`` overrides the step's retries (default: the run's policy; none for an ``external``
    tool without a key).
    """
    try:
        kind = SideEffect(side_effect)
    except ValueError:
        raise errors.WorkflowError(
            f"side_effect must be one of {', '.join(repr(k.value) for k in SideEffect)}, got {side_effect!r}"
        ) from None

    def wrap(fn: Callable[..., Any]) -> Tool:
        return Tool(fn, name or fn.__name__, kind, idempotency_key, retries)
    return wrap


def _approx_tokens(message: Any) -> int:
    """About four characters of JSON per token."""
    return len(json.dumps(message, default=str)) // 4 + 1


async def bound_history(ctx: DurableContext, messages: list[Any], *, max_tokens: int,
                        summarize: Callable[[list[Any]], Any], keep_last: int = 4,
                        count_tokens: Callable[[Any], int] = _approx_tokens,
                        name: str = "summarize") -> list[Any]:
    """``messages`` within ``max_tokens``: the oldest folded into one summary message by a step.

    When the history is over budget, everything but the last ``keep_last`` messages (a previous
    summary included, so summaries are progressive) goes to ``summarize(older) -> message``, run as
    the step ``name``; the result is ``[summary, *last]``. The step is journaled, so a replay builds
    the same history without summarizing again; ``summarize`` may call a model (and charge it).
    """
    if max_tokens <= 0 or keep_last < 0:
        raise errors.WorkflowError("bound_history needs max_tokens > 0 and keep_last >= 0")
    if sum(count_tokens(m) for m in messages) <= max_tokens or len(messages) <= keep_last + 1:
        return list(messages)
    split = len(messages) - keep_last
    summary = await ctx.step(name, summarize, list(messages[:split]))
    return [summary, *messages[split:]]
