"""One metered model call: each `durablerun run` of it is one runner of the fleet the shared-quota tests start."""

from __future__ import annotations

from typing import Any

import openai

from durablerun import DurableContext, llm


async def ask(ctx: DurableContext, input: dict[str, Any]) -> str:
    client = llm.metered(openai.OpenAI(base_url=input["base_url"], api_key="k", max_retries=0))

    def call() -> str:
        return client.chat.completions.create(
            model="gpt-4o-mini", messages=[{"role": "user", "content": "x" * input["chars"]}], max_tokens=100,
        ).choices[0].message.content or ""

    return await ctx.step("ask", call)
