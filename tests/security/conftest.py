"""The operator tests' and the fault suite's fixtures, shared."""

from __future__ import annotations

from tests.faults import conftest as fault_fixtures
from tests.operator import conftest as operator_fixtures

start_operator = operator_fixtures.start_operator
operator = operator_fixtures.operator
runs = operator_fixtures.runs
pods = fault_fixtures.pods
dedicated_store = fault_fixtures.dedicated_store
