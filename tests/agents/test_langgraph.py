"""Compiled LangGraph graphs as workflows: each super-step a journaled step, interrupts as events.

Against the real langgraph and openai packages and a scripted model server on
loopback; the workflow runs in the real CLI (filesystem store) and is SIGKILLed.
"""

from __future__ import annotations

import json
import operator
from decimal import Decimal
from pathlib import Path
from typing import Annotated, Any, TypedDict

import pytest
from langchain_core.messages import AnyMessage
from langchain_openai import ChatOpenAI
from langgraph.graph import END, START, StateGraph
from langgraph.graph.message import add_messages
from langgraph.types import interrupt

from durablerun import DurableContext, Outcome, api
from durablerun.integrations.langgraph import run_graph
from durablerun.testing import WorkflowTest
from tests.agents.helpers import cli, kill_with_turn_in_flight

SCRIPT = [{"text": "draft: durable agents"}, {"text": "review: looks right"}, {"text": "published!"}]


def _lines(path: Path) -> list[str]:
    return path.read_text().splitlines() if path.exists() else []


def test_a_killed_graph_resumes_waits_for_approval_with_no_process_and_finishes(llm_server: Any,
                                                                                tmp_path: Path) -> None:
    server = llm_server(SCRIPT)
    nodes = tmp_path / "nodes.log"
    store = f"file://{tmp_path / 'store'}"
    env = {"LLM_BASE_URL": server.openai_base_url, "NODE_LOG": str(nodes)}
    args = ["run", "lg_approval:approval", "--run-id", "g1", "--store", store,
            "--input", json.dumps({"topic": "durable agents"}), "--quiet"]
    # The review's model call (turn 1) is held: the draft and the parallel checks are journaled
    # super-steps by then, and the review's super-step is in flight when the kill lands.
    kill_with_turn_in_flight(server, 1, args, env, tmp_path)
    assert sorted(_lines(nodes)) == ["draft", "fact_check", "review", "style_check"]

    waiting = cli(args, env, tmp_path)
    assert waiting.returncode == 4, waiting.stderr  # Waiting: no process stays alive for the approval
    status = json.loads(cli(["inspect", "--run-id", "g1", "--store", store, "--json"], env, tmp_path).stdout)
    assert status["status"]["waitingFor"]["event"] == "approval", status["status"]
    # Only the super-step in flight at the kill ran again.
    assert sorted(_lines(nodes)) == ["approve", "draft", "fact_check", "review", "review", "style_check"]
    assert server.turns() == [0, 1, 1]

    sent = cli(["send-event", "--run-id", "g1", "--store", store, "approval", json.dumps({"by": "dana"})],
               env, tmp_path)
    assert sent.returncode == 0, sent.stderr
    done = cli(["resume", "--run-id", "g1", "--store", store, "--quiet"], env, tmp_path)
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout) == {"published": "published!", "checks": ["facts ok", "style ok"], "by": "dana"}
    assert server.turns() == [0, 1, 1, 2]
    # An interrupted node runs again from its start on resume (LangGraph's semantics), with the answer.
    assert _lines(nodes)[-3:] == ["approve", "approve", "publish"]

    inspected = json.loads(cli(["inspect", "--run-id", "g1", "--store", store, "--json"], env, tmp_path).stdout)
    steps = [r["name"] for r in inspected["records"] if r["kind"] == "step"]
    # draft, the two checks, review, approve (interrupted), approve (answered), publish.
    assert steps == [f"approval.super-step-{n}" for n in range(6)]
    # The metered client charged the three journaled calls (gpt-4o-mini, 1000 + 100 * turn in, 200 out).
    assert Decimal(inspected["totals"]["usd"]) == (3300 * Decimal("0.15") + 600 * Decimal("0.60")) / 1_000_000


class Fan(TypedDict, total=False):
    log: Annotated[list[str], operator.add]
    answers: Annotated[list[str], operator.add]


def test_two_interrupts_in_one_super_step_wait_for_two_events() -> None:
    def ask_a(state: Fan) -> Fan:
        return {"answers": [interrupt("a?")]}

    def ask_b(state: Fan) -> Fan:
        return {"answers": [interrupt("b?")]}

    b = StateGraph(Fan)
    b.add_node("ask_a", ask_a)
    b.add_node("ask_b", ask_b)
    b.add_edge(START, "ask_a")
    b.add_edge(START, "ask_b")
    b.add_edge("ask_a", END)
    b.add_edge("ask_b", END)
    graph = b.compile()

    async def wf(ctx: DurableContext, input: Any) -> Any:
        return sorted((await run_graph(ctx, graph, {}, name="fan"))["answers"])

    t = WorkflowTest(wf)
    first = t.attempt()
    assert first.outcome == Outcome.WAITING
    assert first.waiting is not None
    assert first.waiting.event in ("fan.interrupt-0", "fan.interrupt-1")
    done = t.run_to_end(events={"fan.interrupt-0": "x", "fan.interrupt-1": "y"})
    assert done.outcome == Outcome.COMPLETED, done.message
    assert done.result == ["x", "y"]


class Chat(TypedDict):
    messages: Annotated[list[AnyMessage], add_messages]


def two_chats(model: ChatOpenAI) -> Any:
    """A graph of two nodes, one after the other, each calling ``model`` with the conversation so far."""
    def chat(state: Chat) -> Chat:
        return {"messages": [model.invoke(state["messages"])]}

    b = StateGraph(Chat)
    b.add_node("first", chat)
    b.add_node("second", chat)
    b.add_edge(START, "first")
    b.add_edge("first", "second")
    b.add_edge("second", END)
    return b.compile()


def test_langchain_chat_model_calls_in_nodes_are_charged_once(llm_server: Any) -> None:
    server = llm_server([{"text": "hello", "input_tokens": 2000, "output_tokens": 100, "cached_tokens": 1000},
                         {"text": "bye", "input_tokens": 3000, "output_tokens": 100}])
    graph = two_chats(ChatOpenAI(model="gpt-4.1", base_url=server.openai_base_url, api_key="k", max_retries=0))

    async def wf(ctx: DurableContext, input: Any) -> Any:
        state = await run_graph(ctx, graph, {"messages": [("user", "hi")]}, name="chat")
        await ctx.wait_for_event("done")
        return [m.content for m in state["messages"]]

    t = WorkflowTest(wf)
    assert t.attempt().outcome == Outcome.WAITING
    t.send_event("done")
    done = t.attempt()
    assert done.result == ["hi", "hello", "bye"]
    # gpt-4.1: $2 in, $0.50 cached in, $8 out per 1M; the replay charged nothing again.
    assert done.totals.usd == (1000 * 2 + 1000 * Decimal("0.50") + 3000 * 2 + 200 * 8) / Decimal(1_000_000)
    assert done.totals.tokens == 5200
    assert len(server.requests) == 2


def test_a_nodes_chat_model_call_takes_its_share_of_the_quota_before_it_is_sent(
        llm_server: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """Under 1,200 tokens a minute (20 a second), the first call's 1,200 tokens, as its response reports them,
    empty the window: the second call (about 60 tokens) is sent only once there is room for it, about 3 s on."""
    server = llm_server([{"text": "hello", "input_tokens": 1100, "output_tokens": 100},
                         {"text": "bye", "input_tokens": 50, "output_tokens": 10}])
    monkeypatch.setenv(api.Env.LLM_QUOTAS, json.dumps({"quotas": [
        {"name": "gpt", "models": "gpt-4.1*", "tokensPerMinute": 1200}]}))
    graph = two_chats(ChatOpenAI(model="gpt-4.1", base_url=server.openai_base_url, api_key="k", max_retries=0,
                                 max_completion_tokens=50))

    async def wf(ctx: DurableContext, input: Any) -> Any:
        state = await run_graph(ctx, graph, {"messages": [("user", "hi")]}, name="chat")
        return [m.content for m in state["messages"]]

    done = WorkflowTest(wf).attempt()
    assert done.result == ["hi", "hello", "bye"], done.message
    first, second = server.requests
    assert second["at"] - first["at"] >= 2.0, "the second call went before its share had room"


def test_a_graph_that_is_not_compiled_is_refused() -> None:
    async def wf(ctx: DurableContext, input: Any) -> Any:
        return await run_graph(ctx, StateGraph(Fan), {})  # type: ignore[arg-type]

    done = WorkflowTest(wf).attempt()
    assert done.outcome == Outcome.FAILED
    assert "needs a compiled LangGraph graph" in (done.message or "")
