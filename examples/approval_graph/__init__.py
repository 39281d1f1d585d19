"""A LangGraph approval graph as a durable workflow: each super-step a step, the approval an event.

draft (LLM) -> legal_check | style_check (in parallel) -> approve (interrupt: a human decides)
-> publish (LLM). The graph is plain LangGraph; ``run_graph`` journals each super-step and
turns the ``interrupt()`` into ``ctx.wait_for_event("approval")``: no process runs while the
run waits. The LLM nodes use an OpenAI client wrapped with ``durablerun.llm.metered``, so
their cost is charged with no bookkeeping. Locally (see examples/README.md):

    python -m durablerun_testbed llm-server --script approval_graph/script.json &
    export OPENAI_BASE_URL=http://127.0.0.1:8931/v1 OPENAI_API_KEY=local
    durablerun run approval_graph:approval --run-id g1 --input '{"topic": "durable agents"}'
    durablerun send-event --run-id g1 approval '{"approved": true, "by": "dana"}'
    durablerun resume --run-id g1
"""

from __future__ import annotations

import operator
from typing import Annotated, Any, TypedDict

import openai
from langgraph.graph import END, START, StateGraph
from langgraph.types import interrupt

from durablerun import DurableContext, llm
from durablerun.integrations.langgraph import run_graph

MODEL = "gpt-4o-mini"


class Post(TypedDict, total=False):
    topic: str
    drafts: Annotated[list[str], operator.add]
    checks: Annotated[list[str], operator.add]
    decision: dict[str, Any]
    published: str


def _client() -> Any:
    # Built per call: the client reads OPENAI_BASE_URL / OPENAI_API_KEY when the node runs.
    return llm.metered(openai.OpenAI())


def _ask(history: list[str], prompt: str) -> str:
    messages: list[Any] = [{"role": "assistant", "content": h} for h in history]
    reply = _client().chat.completions.create(model=MODEL, messages=[*messages, {"role": "user", "content": prompt}])
    return reply.choices[0].message.content or ""


def draft(post: Post) -> Post:
    return {"drafts": [_ask([], f"Draft a short post about {post['topic']}.")]}


def legal_check(post: Post) -> Post:
    return {"checks": ["legal: no claims to verify"]}


def style_check(post: Post) -> Post:
    return {"checks": [f"style: {len(post['drafts'][-1].split())} words"]}


def approve(post: Post) -> Post:
    # Ends the super-step; the run waits for the event "approval" and resumes here with its payload.
    decision = interrupt({"event": "approval", "draft": post["drafts"][-1], "checks": post["checks"]})
    return {"decision": decision}


def publish(post: Post) -> Post:
    if not post["decision"].get("approved"):
        return {"published": ""}
    return {"published": _ask(post["drafts"], f"Polish it for publishing (approved by {post['decision']['by']}).")}


builder = StateGraph(Post)
builder.add_node("draft", draft)
builder.add_node("legal_check", legal_check)
builder.add_node("style_check", style_check)
builder.add_node("approve", approve)
builder.add_node("publish", publish)
builder.add_edge(START, "draft")
builder.add_edge("draft", "legal_check")
builder.add_edge("draft", "style_check")
builder.add_edge(["legal_check", "style_check"], "approve")
builder.add_edge("approve", "publish")
builder.add_edge("publish", END)
graph = builder.compile()


async def approval(ctx: DurableContext, input: dict[str, Any]) -> dict[str, Any]:
    post = await run_graph(ctx, graph, {"topic": input["topic"]}, name="approval")
    return {"topic": input["topic"], "published": post["published"], "approved_by": post["decision"].get("by"),
            "checks": sorted(post["checks"])}
