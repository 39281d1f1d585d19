"""The operator tests' fixtures (defined in ``tests.operator.fixtures``, shared with other tiers)."""

from __future__ import annotations

from tests.operator.fixtures import operator, runs, start_operator

__all__ = ["operator", "runs", "start_operator"]
