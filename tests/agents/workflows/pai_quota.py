"""A pydantic-ai agent asked three long questions in one run (tests/agents/test_quota.py): its model requests
take their shares of the quota in DURABLERUN_LLM_QUOTAS."""

from __future__ import annotations

from typing import Any

from openai import AsyncOpenAI
from pydantic_ai import Agent
from pydantic_ai.models.openai import OpenAIChatModel
from pydantic_ai.providers.openai import OpenAIProvider

from durablerun import DurableContext
from durablerun.integrations.pydantic_ai import DurableRunDurability, run


async def ask_three_times(ctx: DurableContext, input: dict[str, Any]) -> list[str]:
    # No retries of the SDK's own: a 429 fails the step, where the test sees it.
    client = AsyncOpenAI(base_url=input["base_url"], api_key="test-key", max_retries=0)
    model = OpenAIChatModel("gpt-4o-mini", provider=OpenAIProvider(openai_client=client))
    agent = Agent(model, name="asker", capabilities=[DurableRunDurability()])
    return [(await run(ctx, agent, f"{i} " + "x" * input["chars"])).output for i in range(3)]
