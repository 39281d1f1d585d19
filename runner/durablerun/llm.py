"""LLM cost and tokens without bookkeeping: usage read from responses, priced from a table.

Inside a step, :func:`charge_response` (or a client wrapped with
:func:`metered`, or the agent integrations in :mod:`durablerun.integrations`)
reads the token usage of an OpenAI or Anthropic response and charges the run
with ``ctx.add_cost``: USD from :data:`PRICES` and the tokens. Budgets
(``policy.costCeilingUSD``, ``policy.maxTokens``; ``--max-cost``,
``--max-tokens``) then hold an agent to them with no accounting code.

Prices are USD per million tokens, per model: input, output, cached input
(read from a prompt cache) and cache writes (Anthropic; OpenAI charges none).
The table is pinned (see :data:`PRICES_AS_OF`) and can be overridden:
:func:`set_price` from code, or ``DURABLERUN_LLM_PRICES`` (a JSON object, or
a path to a file holding one: ``{"my-model": {"input": 1.0, "output": 2.0,
"cached_input": 0.1}}``) in the environment. A model with no price is an
error naming it, never a free call a budget cannot see.

Importing this module imports neither openai nor anthropic.
"""

from durablerun._private.agents.llm import (
    PRICES,
    PRICES_AS_OF,
    Price,
    UnpricedModelError,
    Usage,
    charge,
    charge_response,
    cost,
    metered,
    price_for,
    read_usage,
    set_price,
)

__all__ = [
    "PRICES",
    "PRICES_AS_OF",
    "Price",
    "UnpricedModelError",
    "Usage",
    "charge",
    "charge_response",
    "cost",
    "metered",
    "price_for",
    "read_usage",
    "set_price",
]
