"""pydantic-ai agents as durable-run workflows: every model request and tool call is a step.

Built on pydantic-ai's own durable-execution surface (``pydantic_ai.durable_exec``,
the one its Temporal, DBOS and Prefect integrations use): attach the
capability to the agent, then run the agent from a workflow through
:func:`run`::

    from pydantic_ai import Agent
    from durablerun.integrations.pydantic_ai import DurableRunDurability, run

    agent = Agent("openai:gpt-4o-mini", name="researcher", capabilities=[DurableRunDurability()])

    async def research(ctx, input):
        result = await run(ctx, agent, input["question"])
        return result.output

Each model request is a step named ``<agent>__model.request``, each tool call
``<agent>__function_toolset__<toolset>.call_tool:<tool>``: journaled before the
agent goes on, replayed from the journal on a resume, so a killed pod resumes
the conversation without calling (or paying for) a finished turn again. Each
model request charges its tokens and USD (durablerun.llm's price table), so
budgets stop a runaway agent, and takes its share of its model's quota before
it is sent (docs/agents.md, "Model quotas"). Tool calls run one at a time inside a durable
run (their journal positions must not depend on timing).

An answer can be streamed to the run's output stream as it arrives, for readers outside the pod
(``durablerun stream``, ``ctx.stream_url``)::

    agent = Agent(..., capabilities=[DurableRunDurability(event_stream_handler=stream_text("answer"))])

The model request is then streamed inside its step and its text written to stream ``answer`` word by word
as the model sends it. A step killed mid-answer runs again; what the killed try wrote is marked superseded,
so a reader of final chunks (``--final``, ``?final=true``) gets the surviving answer once.

Outside :func:`run` the capability does nothing: the agent runs as usual.
Needs ``pip install 'durable-run[pydantic-ai]'``.
"""

from __future__ import annotations

import math
from collections.abc import AsyncIterable, Awaitable, Callable
from datetime import datetime
from typing import Any

from durablerun._private.storage.extras import require

require("pydantic-ai", "the pydantic-ai integration", "pydantic_ai")

from pydantic_ai import AgentStreamEvent, PartDeltaEvent, PartStartEvent, RunContext, TextPart, TextPartDelta  # noqa: E402
from pydantic_ai.agent import EventStreamHandler  # noqa: E402
from pydantic_ai.agent.abstract import AbstractAgent  # noqa: E402
from pydantic_ai.durable_exec import (  # noqa: E402
    JSON_CODEC,
    BaseDurabilityCapability,
    DurabilityEngineSpec,
    DurableOperationId,
    JournalCallableOperationBackend,
    ModelRequestId,
    RoleBasedOperationConfig,
    conversation_id_from_run_id,
)
from pydantic_ai.models import ModelRequestParameters  # noqa: E402
from pydantic_ai.run import AgentRunResult  # noqa: E402
from pydantic_ai.tools import AgentDepsT  # noqa: E402

from durablerun import errors  # noqa: E402
from durablerun._private.agents import llm, quota  # noqa: E402
from durablerun._private.engine.context import DurableContext  # noqa: E402
from durablerun.integrations._bridge import CURRENT, Bridge  # noqa: E402

__all__ = ["DurableRunDurability", "run", "stream_text"]


def _serialization_failure(exc: Exception) -> BaseException:
    # A value that cannot become JSON never will: fail the step at once instead of retrying.
    return errors.NonRetryableError(f"a pydantic-ai value cannot be journaled as JSON: {exc}")


class _AgentBridge(Bridge):
    """The bridge of one agent run, with the run's id and start time, recorded once (ctx.uuid, ctx.now)."""

    def __init__(self, ctx: DurableContext) -> None:
        super().__init__(ctx, "pydantic-ai")
        self.run_id = str(ctx.uuid())
        self.started = ctx.now()


def _agent_bridge() -> _AgentBridge | None:
    bridge = CURRENT.get()
    return bridge if isinstance(bridge, _AgentBridge) else None


class _Backend(JournalCallableOperationBackend[int | None]):
    """Runs each pydantic-ai durable operation as one ctx.step; the config is the step's retries."""

    async def execute(self, *, operation_id: DurableOperationId, name: str,
                      body: Callable[[], Awaitable[object]], cache_key: tuple[object, ...],
                      config: int | None) -> object:
        bridge = CURRENT.get()
        if bridge is None:  # pragma: no cover - in_durable_context is checked first
            raise errors.WorkflowError(f"{name}: a durable pydantic-ai operation outside durablerun's run()")
        if isinstance(operation_id, ModelRequestId):
            return await bridge.step(name, _charged(body, operation_id.model_name, _estimate(cache_key)),
                                     retries=config)
        return await bridge.step(name, body, retries=config)


def _estimate(cache_key: tuple[object, ...]) -> int:
    """A model request's tokens before it is sent, for its quota: what it sends (in pydantic-ai's cache identity
    of the request, the messages and the tools' definitions; not the run context, which holds far more than is
    sent) over quota.CHARS_PER_TOKEN, plus its max_tokens (or the default)."""
    sent = sum(len(repr(k)) for k in cache_key if isinstance(k, list | ModelRequestParameters))
    settings = next((k for k in cache_key if isinstance(k, dict) and isinstance(k.get("max_tokens"), int)), {})
    return math.ceil(sent / quota.CHARS_PER_TOKEN) + int(settings.get("max_tokens") or quota.DEFAULT_OUTPUT_TOKENS)


def _tokens(response: object) -> int | None:
    usage = response.get("usage") if isinstance(response, dict) else None
    if not usage:
        return None
    return int(usage.get("input_tokens") or 0) + int(usage.get("output_tokens") or 0)


def _charged(body: Callable[[], Awaitable[object]], model_name: str, estimate: int) -> Callable[[], Awaitable[object]]:
    async def request() -> object:
        # A ModelResponse as JSON (the engine's codec), once the request has its share of the model's quota.
        response = await llm.within_quota_async(model_name, estimate, body, _tokens)
        if isinstance(response, dict):
            usage, model = response.get("usage") or {}, response.get("model_name")
            if model and usage:
                # pydantic-ai's input_tokens count cache reads and writes, like durablerun.llm.Usage.
                llm.charge(llm.Usage(str(model), int(usage.get("input_tokens") or 0),
                                     int(usage.get("output_tokens") or 0),
                                     int(usage.get("cache_read_tokens") or 0),
                                     int(usage.get("cache_write_tokens") or 0)))
        return response
    return request


class DurableRunDurability(BaseDurabilityCapability[AgentDepsT]):
    """Capability that makes an agent's runs durable when started with :func:`run`.

    Args:
        name: unique agent name used in step names (default: the agent's ``name``). Step names are
            part of the journal: renaming an agent with runs in flight diverges them.
        model_retries, tool_retries: retries of a failing model request / tool call step
            (default: the run's ``policy.maxRetries``). pydantic-ai's own retries (a tool raising
            ``ModelRetry``) are answers to the model, not step failures.
        event_stream_handler: pydantic-ai's handler of the agent's events (``stream_text(name)`` writes the
            answer's text to an output stream). With one, each model request streams inside its step and
            the handler sees its events live; the agent's other events (tool calls and results) reach it
            as steps of their own, as pydantic-ai delivers them with every durable engine.
    """

    engine_spec = DurabilityEngineSpec(
        engine_name="durable-run",
        durable_unit_noun="step",
        durable_container_noun="workflow",
        codec=JSON_CODEC,
        serialization_failure=_serialization_failure,
        wrapped_toolset_kinds=frozenset({"function", "mcp", "dynamic"}),
        # Steps run in the workflow's process: a toolset entered by the run serves its steps.
        toolset_lifecycles={"function": "enter-always", "mcp": "enter-in-durable-unit",
                            "dynamic": "enter-never"},
        # Journal positions are taken in call order: two tool calls at once would race for them.
        sequential_tools_in_durable_context=True,
    )

    def __init__(self, *, name: str | None = None, model_retries: int | None = None,
                 tool_retries: int | None = None,
                 event_stream_handler: EventStreamHandler[AgentDepsT] | None = None) -> None:
        super().__init__(name=name, event_stream_handler=event_stream_handler)
        self._model_retries = model_retries
        self._tool_retries = tool_retries
        self._backend: _Backend | None = None

    def _bind_to_agent(self, agent: AbstractAgent[AgentDepsT, Any]) -> None:
        self._backend = _Backend(
            agent_name=self.name, default_model_id=self.default_model_id,
            config=RoleBasedOperationConfig(model=self._model_retries, event=None, capability=self._tool_retries,
                                            tool=self._tool_retries))
        super()._bind_to_agent(agent)

    @property
    def in_durable_context(self) -> bool:
        return _agent_bridge() is not None

    # Replay-stable identity and clock, so a resumed agent run is the same run to pydantic-ai.
    def get_default_run_id(self) -> str | None:
        bridge = _agent_bridge()
        return bridge.run_id if bridge is not None else None

    def get_default_conversation_id(self, run_id: str) -> str | None:
        return conversation_id_from_run_id(run_id) if self.in_durable_context else None

    async def get_run_start_time(self, run_id: str) -> datetime | None:
        bridge = _agent_bridge()
        return bridge.started if bridge is not None else None

    def get_durable_operation_backend(self) -> _Backend:
        assert self._backend is not None, "the capability is bound when the agent is built"
        return self._backend


async def run(ctx: DurableContext, agent: AbstractAgent[Any, Any], *args: Any, **kwargs: Any) -> AgentRunResult[Any]:
    """``agent.run(*args, **kwargs)`` as part of the workflow: model requests and tool calls are steps.

    The agent needs a :class:`DurableRunDurability` capability. Call it from the workflow function
    (not from inside a step); several runs in one workflow run one after the other.
    """
    if DurableRunDurability.from_agent(agent) is None:
        raise errors.WorkflowError(
            f"agent {getattr(agent, 'name', None)!r} has no DurableRunDurability capability: build it with "
            "Agent(..., capabilities=[DurableRunDurability()]) so its model requests and tool calls are steps")
    return await _AgentBridge(ctx).run(agent.run(*args, **kwargs))


def stream_text(name: str) -> EventStreamHandler[Any]:
    """An ``event_stream_handler`` that writes the text the model streams to the run's output stream ``name``
    (``ctx.stream(name)``), each piece as it arrives; other events are left alone. Inside a durable run only:
    elsewhere there is no run to write to, and the events go by unwritten."""
    async def handler(run_context: RunContext[Any], events: AsyncIterable[AgentStreamEvent]) -> None:
        bridge = _agent_bridge()
        out = bridge.ctx.stream(name) if bridge is not None else None
        async for event in events:
            if out is None:
                continue
            if isinstance(event, PartStartEvent) and isinstance(event.part, TextPart):
                text = event.part.content
            elif isinstance(event, PartDeltaEvent) and isinstance(event.delta, TextPartDelta):
                text = event.delta.content_delta
            else:
                continue
            if text:
                await out.awrite(text)
    return handler
