"""A pydantic-ai research agent as a durable workflow: every model call and tool call is a step.

The agent is plain pydantic-ai (``Agent("openai-chat:gpt-4o-mini", ...)`` with tools);
the DurableRunDurability capability and ``run(ctx, agent, ...)`` make each model
request and tool call a journaled step, charged to the run from the usage the
model reports. Locally it talks to the scripted model server (no provider is
needed; see examples/README.md):

    python -m durablerun_testbed llm-server --script pydantic_ai_research/script.json &
    export OPENAI_BASE_URL=http://127.0.0.1:8931/v1 OPENAI_API_KEY=local
    durablerun run pydantic_ai_research:research --run-id a1 --input '{"question": "durable execution"}' \\
        --max-cost 0.05

Kill it at any point and run the same command again: finished model calls are
not made (or paid for) again. With ``pydantic_ai_research/runaway.json`` the model
never stops asking for searches; ``--max-cost`` stops it.
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel
from pydantic_ai import Agent

from durablerun import DurableContext
from durablerun.integrations.pydantic_ai import DurableRunDurability, run

#: A tiny offline corpus stands in for a search engine.
CORPUS = {
    "durable execution": "Durable execution journals each step so a crashed process resumes where it stopped.",
    "temporal": "Temporal replays workflow history; activities run at least once.",
    "checkpointing": "Checkpointing saves state at boundaries; a restart loads the latest checkpoint.",
}


class Report(BaseModel):
    summary: str
    sources: list[str]


agent = Agent(
    "openai-chat:gpt-4o-mini",  # the Chat Completions API (the local model server speaks it)
    name="researcher",
    instructions="Research the question with the search tool, then answer with a short report.",
    capabilities=[DurableRunDurability()],
)


@agent.tool_plain
def search(query: str) -> str:
    """Search the corpus for a topic."""
    hits = [text for topic, text in CORPUS.items() if topic in query.lower() or query.lower() in topic]
    return "\n".join(hits) or f"nothing found for {query!r}"


async def research(ctx: DurableContext, input: dict[str, Any]) -> dict[str, Any]:
    result = await run(ctx, agent, f"Write a short report on: {input['question']}")
    return {"question": input["question"], "report": result.output}
