"""durable-run: durable, crash-resumable agent workflows.

Write a workflow against :class:`DurableContext`::

    from durablerun import DurableContext

    async def research(ctx: DurableContext, input: dict) -> dict:
        plan = await ctx.step("plan", make_plan, input["topic"])
        ...

Public modules: ``durablerun`` (this: the workflow API and its errors),
``durablerun.engine`` (running attempts: what the CLI and the runner pod use),
``durablerun.stores`` (journal stores), ``durablerun.sinks`` (progress sinks),
``durablerun.errors``, ``durablerun.api`` and ``durablerun.resource`` (the DurableRun contract),
``durablerun.cli``, ``durablerun.testing``, ``durablerun.llm`` (LLM cost from model responses) and
``durablerun.agents`` (agent helpers); the agent frameworks' adapters are in
``durablerun.integrations`` (extras). Everything under ``durablerun._private`` is internal.
"""

from durablerun._private.engine.context import DurableContext
from durablerun._version import __version__
from durablerun.api import AbortReason, Outcome
from durablerun.errors import (
    ChildRunFailed,
    ConfigError,
    CorruptionError,
    DivergenceError,
    DurableRunError,
    EventTimeout,
    FencedError,
    InputMismatchError,
    NonRetryableError,
    ResultNotSerializableError,
    ResultTooLargeError,
    StepError,
    StoreError,
    WorkflowError,
)
from durablerun.resource import Policy

__all__ = [
    "AbortReason",
    "ChildRunFailed",
    "ConfigError",
    "CorruptionError",
    "DivergenceError",
    "DurableContext",
    "DurableRunError",
    "EventTimeout",
    "FencedError",
    "InputMismatchError",
    "NonRetryableError",
    "Outcome",
    "Policy",
    "ResultNotSerializableError",
    "ResultTooLargeError",
    "StepError",
    "StoreError",
    "WorkflowError",
    "__version__",
]
