"""Agent frameworks as durable-run workflows (docs/agents.md).

``durablerun.integrations.pydantic_ai`` (``pip install 'durable-run[pydantic-ai]'``)
and ``durablerun.integrations.langgraph`` (``pip install 'durable-run[langgraph]'``).
Nothing is imported here: ``import durablerun`` never loads an agent framework.
"""
