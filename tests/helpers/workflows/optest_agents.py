"""A pydantic-ai agent whose answer streams to the run's output stream ``answer`` as the model sends it
(tests/operator/test_webhook_streams.py)."""

from __future__ import annotations

from typing import Any

from optest_flows import _record
from pydantic_ai import Agent
from pydantic_ai.models.openai import OpenAIChatModel
from pydantic_ai.providers.openai import OpenAIProvider

from durablerun import DurableContext
from durablerun.integrations.pydantic_ai import DurableRunDurability, run, stream_text


async def streamed_answer(ctx: DurableContext, input: dict[str, Any]) -> Any:
    """Hands out a URL that reads stream ``answer``, then asks the model at ``input["llm"]`` the question."""
    _record("stream " + ctx.stream_url("answer", ttl=600) + "?final=true")
    model = OpenAIChatModel("gpt-4o-mini", provider=OpenAIProvider(base_url=input["llm"], api_key="test-key"))
    agent = Agent(model, name="answerer",
                  capabilities=[DurableRunDurability(event_stream_handler=stream_text("answer"))])
    result = await run(ctx, agent, input["question"])
    return result.output
