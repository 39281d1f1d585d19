"""A research agent with a human review, paced so you can watch it (and crash it) on Kubernetes.

The sandbox demo (`make demo`) runs it as a DurableRun: it plans, researches
in ``parts`` steps of ``step_seconds`` each (every step charges its fake LLM
cost), then waits for a human to review the draft:

    kubectl patch dr review-agent --type merge \\
        -p '{"spec": {"events": {"review": {"approved": true, "by": "dana"}}}}'

or, with the chart's webhook ingress on, by POSTing that review's JSON to the
URL it prints. Every step body prints ``executing <step>`` to the runner's log,
so you can count that a step finished before a crash never runs again.
"""

from __future__ import annotations

import contextlib
import sys
import time
from datetime import timedelta
from decimal import Decimal
from typing import Any

from durablerun import DurableContext, errors


def _execute(name: str, seconds: float) -> None:
    print(f"executing {name}", file=sys.stderr, flush=True)
    time.sleep(seconds)


def plan(topic: str, parts: int, seconds: float) -> list[str]:
    _execute("plan", seconds)
    return [f"{topic}: question {i}" for i in range(parts)]


def research(ctx: DurableContext, question: str, seconds: float) -> str:
    _execute(f"research {question}", seconds)
    # What the (fake) model call cost, charged inside the step: its journal record carries it, so the timeline
    # shows it on this step. (Charged after the step, outside it, it would travel with the next record.)
    ctx.add_cost(usd=Decimal("0.012"), tokens=1500)
    return f"notes on {question}"


def publish(draft: str, reviewer: str) -> str:
    _execute("publish", 0.1)
    return f"published ({len(draft)} chars), reviewed by {reviewer}"


async def review_agent(ctx: DurableContext, input: dict[str, Any]) -> dict[str, Any]:
    topic, parts = input.get("topic", "durable execution"), int(input.get("parts", 6))
    seconds = float(input.get("step_seconds", 3))
    ctx.set_total_steps(parts + 2)  # plan, the research steps, publish: kubectl get dr shows "3/8"
    questions = await ctx.step("plan", plan, topic, parts, seconds)
    # With the chart's webhook ingress on (the sandbox's is), anything that can POST JSON can send the review:
    # say where, up front. Without it, ctx.webhook_url says so and `kubectl patch` (above) sends the review.
    with contextlib.suppress(errors.WorkflowError):
        print(f"review: POST JSON to {ctx.webhook_url('review')}", file=sys.stderr, flush=True)
    notes = []
    for i, question in enumerate(questions):
        notes.append(await ctx.step(f"research-{i}", research, ctx, question, seconds))
    draft = "\n".join(notes)
    review = await ctx.wait_for_event("review", timeout=timedelta(hours=48))
    if not review.get("approved"):
        return {"topic": topic, "status": "rejected"}
    outcome = await ctx.step("publish", publish, draft, str(review.get("by", "someone")))
    return {"topic": topic, "status": "published", "outcome": outcome}
