"""Compiled LangGraph graphs as durable-run workflows: each super-step is a step.

    from durablerun.integrations.langgraph import run_graph

    async def approval(ctx, input):
        state = await run_graph(ctx, graph, {"topic": input["topic"]}, name="approval")
        return {"published": state["published"]}

``run_graph`` runs the graph one super-step at a time; each super-step is a
step named ``<name>.super-step-<n>`` whose result is what LangGraph's
checkpointer wrote during it (its own serialized checkpoints and pending
writes, through the ``BaseCheckpointSaver`` interface). A resume rebuilds the
checkpointer from the journal and goes on from the first super-step that was
not journaled: nodes of finished super-steps do not run again. The model
messages nodes write (LangChain's ``AIMessage`` with its ``usage_metadata``)
are charged to their super-step (durablerun.llm's price table). Under a model
quota, each LangChain chat model call a node makes takes its share before it is
sent and settles it with the usage its response reports (a callback on the
graph's run, which LangChain hands to the models nodes call).

A node that calls ``langgraph.types.interrupt(value)`` ends its super-step
waiting: the run waits for an event (``ctx.wait_for_event``, no pod while it
waits) and resumes the node with the event's payload, as ``Command(resume=...)``
would. The event's name is ``value["event"]`` when the interrupt value is a
dict naming one, else ``<name>.interrupt-<n>`` (n counts the run's interrupts).

Why a runner over a journal-backed checkpointer, not a checkpointer alone:
durable-run resumes by replaying the workflow against its journal, while
LangGraph resumes from its latest checkpoint. A checkpointer alone would be
called from LangGraph's own tasks at timing-dependent moments and could not
tell a replay from a new run. The runner journals exactly the checkpointer's
writes, at super-step boundaries it chooses, so both views agree.

Not supported: the graph's static breakpoints (``interrupt_before``/``after``
given to ``compile``; use ``interrupt()``) and a checkpointer of its own (the
run's journal is its checkpointer). Needs ``pip install 'durable-run[langgraph]'``.
"""

from __future__ import annotations

import base64
import json
from collections.abc import Callable
from typing import Any
from uuid import UUID

from durablerun._private.storage.extras import require

require("langgraph", "the LangGraph integration", "langgraph")

from langchain_core.callbacks import AsyncCallbackHandler  # noqa: E402
from langchain_core.messages import AIMessage, BaseMessage  # noqa: E402
from langchain_core.outputs import LLMResult  # noqa: E402
from langchain_core.runnables import RunnableConfig  # noqa: E402
from langgraph.checkpoint.base import ChannelVersions, Checkpoint, CheckpointMetadata  # noqa: E402
from langgraph.checkpoint.memory import InMemorySaver  # noqa: E402
from langgraph.pregel import Pregel  # noqa: E402
from langgraph.types import Command, Interrupt  # noqa: E402

from durablerun import errors  # noqa: E402
from durablerun._private.agents import llm, quota  # noqa: E402
from durablerun._private.engine.context import DurableContext  # noqa: E402

__all__ = ["run_graph"]

#: LangGraph's thread of a run: each run has its own journal, so one thread is enough.
_THREAD: RunnableConfig = {"configurable": {"thread_id": "durablerun"}}


class _JournalSaver(InMemorySaver):
    """LangGraph's in-memory checkpointer, recording every write as JSON for the journal."""

    def __init__(self, journaled: list[dict[str, Any]]) -> None:
        super().__init__()
        for entry in journaled:
            self._apply(entry)
        self.new: list[dict[str, Any]] = []
        #: The values nodes wrote since this saver was built (their model messages are charged).
        self.written: list[Any] = []

    def _dump(self, value: Any) -> list[str]:
        kind, data = self.serde.dumps_typed(value)
        return [kind, base64.b64encode(data).decode()]

    def _load(self, typed: list[str]) -> Any:
        return self.serde.loads_typed((typed[0], base64.b64decode(typed[1])))

    def _apply(self, entry: dict[str, Any]) -> None:
        if entry["op"] == "put":
            super().put(entry["config"], self._load(entry["checkpoint"]), self._load(entry["metadata"]),
                        entry["versions"])
        else:
            super().put_writes(entry["config"], [(c, self._load(v)) for c, v in entry["writes"]],
                               entry["task_id"], entry["task_path"])

    def put(self, config: RunnableConfig, checkpoint: Checkpoint, metadata: CheckpointMetadata,
            new_versions: ChannelVersions) -> RunnableConfig:
        self.new.append({"op": "put", "config": _plain(config), "checkpoint": self._dump(checkpoint),
                         "metadata": self._dump(metadata), "versions": dict(new_versions)})
        return super().put(config, checkpoint, metadata, new_versions)

    def put_writes(self, config: RunnableConfig, writes: Any, task_id: str, task_path: str = "") -> None:
        writes = list(writes)
        self.written += [v for _, v in writes]
        self.new.append({"op": "writes", "config": _plain(config), "task_id": task_id, "task_path": task_path,
                         "writes": [[c, self._dump(v)] for c, v in writes]})
        super().put_writes(config, writes, task_id, task_path)


def _plain(config: RunnableConfig) -> RunnableConfig:
    """The part of a checkpoint config a checkpointer keys on (the rest is runtime objects)."""
    conf = config.get("configurable", {})
    return {"configurable": {k: conf[k] for k in ("thread_id", "checkpoint_ns", "checkpoint_id") if k in conf}}


def _charge_messages(values: list[Any]) -> None:
    """Charge the model messages nodes wrote (LangChain chat models report usage on their AIMessage)."""
    for value in values:
        for msg in value if isinstance(value, list | tuple) else [value]:
            usage = getattr(msg, "usage_metadata", None) if isinstance(msg, AIMessage) else None
            model = msg.response_metadata.get("model_name") if usage else None
            if usage and model:
                details = usage.get("input_token_details") or {}
                # LangChain's input_tokens count cache reads and writes, like durablerun.llm.Usage.
                llm.charge(llm.Usage(str(model), int(usage.get("input_tokens") or 0),
                                     int(usage.get("output_tokens") or 0), int(details.get("cache_read") or 0),
                                     int(details.get("cache_creation") or 0)))


class _QuotaShares(AsyncCallbackHandler):
    """Each chat model call of the graph's nodes takes its share of its model's quota before it is sent (waits for
    room, or ends the attempt for a long wait, as a metered client's call does) and settles it when it ends."""

    raise_error = True  # a long wait ends the attempt (replay.throttled): LangChain must not swallow that

    def __init__(self) -> None:
        self._held: dict[UUID, tuple[str, quota.Grant]] = {}

    async def on_chat_model_start(self, serialized: dict[str, Any], messages: list[list[BaseMessage]], *,
                                  run_id: UUID, invocation_params: dict[str, Any] | None = None,
                                  metadata: dict[str, Any] | None = None, **kwargs: Any) -> None:
        params, metadata = invocation_params or {}, metadata or {}
        model = params.get("model") or params.get("model_name") or metadata.get("ls_model_name")
        if not model:
            return
        sent = {"messages": [[json.dumps(m.content, default=str) for m in batch] for batch in messages],
                "tools": params.get("tools")}
        for key in ("max_tokens", "max_completion_tokens"):
            if isinstance(params.get(key), int):
                sent["max_tokens"] = params[key]
        held = await llm.hold_async(str(model), quota.estimate_tokens(sent))
        if held is not None:
            self._held[run_id] = (str(model), held)

    async def on_llm_end(self, response: LLMResult, *, run_id: UUID, **kwargs: Any) -> None:
        if (held := self._held.pop(run_id, None)) is not None:
            held[1].settle(_used_tokens(response))

    async def on_llm_error(self, error: BaseException, *, run_id: UUID, **kwargs: Any) -> None:
        if (held := self._held.pop(run_id, None)) is not None:
            llm.settle_refused(held[0], held[1], error)


def _used_tokens(response: LLMResult) -> int | None:
    """The tokens a chat model's response says it used (None: it says nothing; the reservation stands)."""
    total = 0
    for generations in response.generations:
        for generation in generations:
            usage = getattr(getattr(generation, "message", None), "usage_metadata", None)
            if not usage:
                return None
            total += int(usage.get("total_tokens") or 0)
    return total or None


def _default_event(name: str) -> Callable[[Interrupt, int], str]:
    def event(interrupt: Interrupt, n: int) -> str:
        value = interrupt.value
        if isinstance(value, dict) and isinstance(value.get("event"), str):
            return str(value["event"])
        return f"{name}.interrupt-{n}"
    return event


async def run_graph(ctx: DurableContext, graph: Pregel[Any, Any, Any, Any], input: Any, *, name: str = "graph",
                    event_name: Callable[[Interrupt, int], str] | None = None,
                    retries: int | None = None) -> dict[str, Any]:
    """Run a compiled graph to its end as part of the workflow; return its final state values.

    Args:
        ctx: the workflow's context; call from the workflow function.
        graph: a compiled graph (``StateGraph(...).compile()``).
        input: the graph's input.
        name: prefix of the step and event names (part of the journal: keep it stable).
        event_name: the event an interrupt waits for, from the ``Interrupt`` and the run's interrupt count.
        retries: retries of a failing super-step (default: the run's ``policy.maxRetries``).
    """
    if not isinstance(graph, Pregel):
        raise errors.WorkflowError(f"run_graph needs a compiled LangGraph graph (StateGraph(...).compile()), "
                                   f"got {type(graph).__name__}")
    name_of = event_name or _default_event(name)
    journaled: list[dict[str, Any]] = []
    next_input: Any = input
    interrupts = 0

    def view() -> Pregel[Any, Any, Any, Any]:
        return graph.copy(update={"checkpointer": _JournalSaver(journaled)})

    async def super_step(step_input: Any) -> list[dict[str, Any]]:
        saver = _JournalSaver(journaled)
        # interrupt_after every node: LangGraph stops after one super-step, its checkpoint written.
        await graph.copy(update={"checkpointer": saver}).ainvoke(
            step_input, {**_THREAD, "callbacks": [_QuotaShares()]}, interrupt_after="*", durability="sync")
        _charge_messages(saver.written)
        return saver.new

    n = 0
    while True:
        journaled += await ctx.step(f"{name}.super-step-{n}", super_step, next_input, retries=retries)
        n += 1
        state = await view().aget_state(_THREAD)
        if state.interrupts:
            answers = {}
            for interrupt in state.interrupts:
                answers[interrupt.id] = await ctx.wait_for_event(name_of(interrupt, interrupts))
                interrupts += 1
            next_input = Command(resume=answers)
        elif state.next:
            next_input = None
        else:
            return dict(state.values)
