"""Metered model calls under a quota: each `durablerun run` of ``ask`` is one runner of the fleet the
shared-quota tests start; ``ask_twice`` is a run whose second call finds no room."""

from __future__ import annotations

from typing import Any

import openai

from durablerun import DurableContext, llm


def _call(input: dict[str, Any]) -> str:
    client = llm.metered(openai.OpenAI(base_url=input["base_url"], api_key="k", max_retries=0))
    return client.chat.completions.create(
        model="gpt-4o-mini", messages=[{"role": "user", "content": "x" * input["chars"]}], max_tokens=100,
    ).choices[0].message.content or ""


async def ask(ctx: DurableContext, input: dict[str, Any]) -> str:
    return await ctx.step("ask", _call, input)


async def ask_twice(ctx: DurableContext, input: dict[str, Any]) -> list[str]:
    return [await ctx.step("first", _call, input), await ctx.step("second", _call, input)]
