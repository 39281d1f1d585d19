"""The operator tests' fixtures, shared: an operator per test, a namespace with a bucket, a Secret, a ledger."""

from __future__ import annotations

from tests.faults.fixtures import pods
from tests.operator.fixtures import operator, runs, start_operator

__all__ = ["operator", "pods", "runs", "start_operator"]
