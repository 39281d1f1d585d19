"""A pydantic-ai research agent with a search tool, run as a workflow (tests/agents).

The model is the scripted server at LLM_BASE_URL; every tool call appends its
query to TOOL_LOG, so a test sees which calls really ran.
"""

from __future__ import annotations

import os
from typing import Any

from pydantic_ai import Agent
from pydantic_ai.models.openai import OpenAIChatModel
from pydantic_ai.providers.openai import OpenAIProvider

from durablerun import DurableContext
from durablerun.integrations.pydantic_ai import DurableRunDurability, run

model = OpenAIChatModel(os.environ.get("LLM_MODEL", "gpt-4o-mini"),
                        provider=OpenAIProvider(base_url=os.environ["LLM_BASE_URL"], api_key="test-key"))
agent = Agent(model, name="researcher", instructions="Research the question with the search tool.",
              capabilities=[DurableRunDurability()])


@agent.tool_plain
def search(query: str) -> str:
    """Search the web."""
    with open(os.environ["TOOL_LOG"], "a") as f:
        f.write(query + "\n")
    return f"notes on {query}"


async def research(ctx: DurableContext, input: dict[str, Any]) -> dict[str, Any]:
    result = await run(ctx, agent, input["question"])
    return {"answer": result.output}
