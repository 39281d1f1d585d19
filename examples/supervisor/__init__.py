"""A supervisor agent that fans a question out to sub-agents, each its own DurableRun.

The supervisor plans, starts one child run per topic (``ctx.start_child``), waits for all of them
with no pod of its own (``ctx.gather`` of the handles), and combines what they found; a sub-agent
that fails is reported, not fatal. Each sub-agent is a workflow of its own, resumed from its own
journal if its pod dies. On Kubernetes (the operator creates the children)::

    kubectl apply -f deploy/samples/supervisor.yaml
    kubectl get dr -l durablerun.dev/parent=supervisor      # its children
    kubectl durablerun tree supervisor

Locally, ``durablerun run supervisor:supervisor --run-id sup`` plays the operator's part: it runs each
child in the same process as a run of its own (``sup-agent-0``, ...; its own journal in the same store),
and ``durablerun.testing.WorkflowTest`` does the same in a test (docs/sdk.md, "Child runs and signals").
"""

from __future__ import annotations

from typing import Any

from durablerun import ChildRunFailed, DurableContext


def plan(question: str, agents: int) -> list[str]:
    return [f"{question} (angle {i + 1})" for i in range(agents)]


def read(topic: str, page: int) -> str:
    return f"page {page} on {topic}"


def summarize(topic: str, notes: list[str]) -> str:
    return f"{topic}: {len(notes)} sources"


def combine(question: str, findings: list[dict[str, Any]]) -> str:
    return f"{question}: " + "; ".join(f["summary"] for f in findings)


async def supervisor(ctx: DurableContext, input: dict[str, Any]) -> dict[str, Any]:
    topics = await ctx.step("plan", plan, input["question"], int(input.get("agents", 3)))
    handles = [await ctx.start_child(f"agent-{i}", "supervisor:sub_agent", {"topic": topic},
                                     policy={"maxSteps": 20})   # a child may narrow, never widen, a budget
               for i, topic in enumerate(topics)]
    findings = await ctx.gather(*handles, return_exceptions=True)
    failed = [f.child for f in findings if isinstance(f, ChildRunFailed)]
    report = await ctx.step("combine", combine, input["question"],
                            [f for f in findings if not isinstance(f, BaseException)])
    return {"report": report, "failed": failed}


async def sub_agent(ctx: DurableContext, input: dict[str, Any]) -> dict[str, Any]:
    notes = []
    for page in range(3):
        notes.append(await ctx.step(f"read-{page}", read, input["topic"], page))
        ctx.add_cost(usd="0.01", tokens=300)
    return {"topic": input["topic"], "summary": await ctx.step("summarize", summarize, input["topic"], notes)}
