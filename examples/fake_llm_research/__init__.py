"""A research agent: plan, research every subtopic in parallel, write a report.

The LLM is fake (deterministic, no network) but behaves like a real one where
it matters: it charges cost per call, it fails now and then (steps retry),
and its answers depend only on the prompt.

    cd examples
    durablerun run fake_llm_research:research --run-id r1 --input '{"topic": "durable execution"}' \
        --max-cost 0.50

Kill it at any point (Ctrl-C twice, or kill -9) and run the same command again:
finished calls are not made (or paid for) again.
"""

from __future__ import annotations

import asyncio
import hashlib
import os
from datetime import timedelta
from decimal import Decimal
from typing import Any

from durablerun import DurableContext

PRICE_PER_1K_TOKENS = Decimal("0.002")


class FakeLLM:
    """Deterministic stand-in for a chat model. ``flaky`` fails every Nth call."""

    def __init__(self, flaky_every: int = 0) -> None:
        self.calls = 0
        self.flaky_every = flaky_every

    async def complete(self, prompt: str) -> tuple[str, int]:
        self.calls += 1
        if self.flaky_every and self.calls % self.flaky_every == 0:
            raise ConnectionError("503 from the model provider")
        await asyncio.sleep(0.001)
        digest = hashlib.sha256(prompt.encode()).hexdigest()
        tokens = 200 + int(digest[:3], 16) % 800
        return f"answer[{digest[:8]}] to: {prompt[:60]}", tokens


LLM = FakeLLM(flaky_every=int(os.environ.get("FAKE_LLM_FLAKY_EVERY", "0")))


async def ask(ctx: DurableContext, prompt: str) -> str:
    """One LLM call, as a step body: charges its cost to the run."""
    text, tokens = await LLM.complete(prompt)
    ctx.add_cost(usd=PRICE_PER_1K_TOKENS * tokens / 1000, tokens=tokens)
    return text


async def make_plan(ctx: DurableContext, topic: str, width: int) -> list[dict[str, Any]]:
    outline = await ask(ctx, f"Plan research on {topic} in {width} parts")
    return [{"id": i, "question": f"{topic}: part {i} ({outline[7:15]})"} for i in range(width)]


async def research_one(ctx: DurableContext, part: dict[str, Any]) -> dict[str, Any]:
    notes = await ask(ctx, f"Research: {part['question']}")
    return {"id": part["id"], "notes": notes}


async def research(ctx: DurableContext, input: dict[str, Any]) -> dict[str, Any]:
    topic = input["topic"]
    # Code between steps runs again on every resume: keep it cheap and pure.
    width = int(input.get("width", 4))
    plan = await ctx.step("plan", make_plan, ctx, topic, width)
    notes = await ctx.gather(*[
        ctx.step(f"research-{p['id']}", research_one, ctx, p, retries=5) for p in plan
    ])
    if input.get("cooldown_seconds"):
        await ctx.sleep(timedelta(seconds=float(input["cooldown_seconds"])))
    draft = await ctx.step("draft", ask, ctx, "Write a report from: " +
                           " | ".join(n["notes"] for n in notes))
    started = ctx.now()  # recorded once: the same on every replay
    return {"topic": topic, "report": draft, "sections": len(notes),
            "written_at": started.isoformat()}
