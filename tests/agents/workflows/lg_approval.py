"""A LangGraph approval graph run as a workflow (tests/agents).

draft -> (fact_check | style_check in parallel) -> approve (interrupt) -> publish.
The LLM nodes call the scripted server at LLM_BASE_URL through a metered OpenAI
client (their cost is charged to the super-step); every node appends its name
to NODE_LOG, so a test sees which nodes really ran.
"""

from __future__ import annotations

import operator
import os
from typing import Annotated, Any, TypedDict

import openai
from langgraph.graph import END, START, StateGraph
from langgraph.types import interrupt

from durablerun import DurableContext, llm
from durablerun.integrations.langgraph import run_graph

client = llm.metered(openai.OpenAI(base_url=os.environ["LLM_BASE_URL"], api_key="test-key", max_retries=0))


class State(TypedDict, total=False):
    topic: str
    history: Annotated[list[str], operator.add]
    checks: Annotated[list[str], operator.add]
    approved_by: str
    published: str


def _ran(node: str) -> None:
    with open(os.environ["NODE_LOG"], "a") as f:
        f.write(node + "\n")


def _ask(history: list[str], prompt: str) -> str:
    messages: list[Any] = [{"role": "assistant", "content": h} for h in history]
    reply = client.chat.completions.create(model="gpt-4o-mini",
                                           messages=[*messages, {"role": "user", "content": prompt}])
    return reply.choices[0].message.content or ""


def draft(state: State) -> State:
    _ran("draft")
    return {"history": [_ask([], f"Draft a post about {state['topic']}")]}


def fact_check(state: State) -> State:
    _ran("fact_check")
    return {"checks": ["facts ok"]}


def style_check(state: State) -> State:
    _ran("style_check")
    return {"checks": ["style ok"]}


def review(state: State) -> State:
    _ran("review")
    return {"history": [_ask(state["history"], "Review the draft")]}


def approve(state: State) -> State:
    _ran("approve")
    answer = interrupt({"event": "approval", "draft": state["history"][-1]})
    return {"approved_by": answer["by"]}


def publish(state: State) -> State:
    _ran("publish")
    return {"published": _ask(state["history"], f"Publish it, approved by {state['approved_by']}")}


builder = StateGraph(State)
for node in (draft, fact_check, style_check, review, approve, publish):
    builder.add_node(node.__name__, node)  # type: ignore[call-overload]
builder.add_edge(START, "draft")
builder.add_edge("draft", "fact_check")
builder.add_edge("draft", "style_check")
builder.add_edge(["fact_check", "style_check"], "review")
builder.add_edge("review", "approve")
builder.add_edge("approve", "publish")
builder.add_edge("publish", END)
graph = builder.compile()


async def approval(ctx: DurableContext, input: dict[str, Any]) -> dict[str, Any]:
    state = await run_graph(ctx, graph, {"topic": input["topic"]}, name="approval")
    return {"published": state["published"], "checks": sorted(state["checks"]), "by": state["approved_by"]}
