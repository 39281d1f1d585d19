"""The operator tests' and the fault suite's fixtures, shared."""

from __future__ import annotations

from tests.faults.fixtures import dedicated_store, pods
from tests.operator.fixtures import operator, runs, start_operator

__all__ = ["dedicated_store", "operator", "pods", "runs", "start_operator"]
