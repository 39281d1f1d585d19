"""The operator tests' fixtures, shared: an operator per test, a namespace with a bucket, a Secret, a ledger."""

from __future__ import annotations

from tests.faults import conftest as fault_fixtures
from tests.operator import conftest as operator_fixtures

start_operator = operator_fixtures.start_operator
operator = operator_fixtures.operator
runs = operator_fixtures.runs
pods = fault_fixtures.pods
