"""Helpers for agent workflows: tools that declare their side effects, sagas, bounded history.

All three are built on the public workflow API (``ctx.step``), so they journal
and replay like any step (docs/agents.md):

* :func:`tool` declares what a tool does to the world (``none``, ``read``,
  ``write``, ``external``) and whether it needs an idempotency key; the kind
  decides how the call is replayed, and a tool that needs a key refuses to run
  without one.
* :class:`Saga` registers a compensation for each finished step; when the
  block fails, the compensations run in reverse order, each a step, so a crash
  during compensation resumes it.
* :func:`bound_history` keeps a message history within a token budget by
  folding its oldest messages into a summary; the summary is a step, so a
  replay sees the same history.
"""

from durablerun._private.agents.tools import (
    Saga,
    SideEffect,
    Tool,
    bound_history,
    tool,
)

__all__ = [
    "Saga",
    "SideEffect",
    "Tool",
    "bound_history",
    "tool",
]
