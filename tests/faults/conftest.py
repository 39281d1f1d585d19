"""The fault suite: the operator tests' fixtures, a pod recorder, and a tally of trials and failures.

``FAULT_TRIALS`` scales the suite (CI runs the default, ``make faults`` the long
version); ``FAULT_SEED`` replays a run of random timings.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field

import pytest

from tests.faults.helpers import PodRecorder
from tests.operator import conftest as operator_fixtures
from tests.operator.conftest import RunEnv

# The operator tests' fixtures, shared: an operator per test, a namespace with a bucket, a Secret, a ledger.
start_operator = operator_fixtures.start_operator
operator = operator_fixtures.operator
runs = operator_fixtures.runs


@dataclass
class Tally:
    """Trials and failures per fault, printed at the end of the session."""

    rows: dict[str, list[int]] = field(default_factory=dict)

    def add(self, fault: str, trials: int, failures: int) -> None:
        row = self.rows.setdefault(fault, [0, 0])
        row[0] += trials
        row[1] += failures


TALLY = Tally()


@pytest.fixture
def tally() -> Tally:
    return TALLY


@pytest.fixture
def pods(runs: RunEnv) -> Iterator[PodRecorder]:
    recorder = PodRecorder(runs.testbed, runs.namespace)
    yield recorder
    recorder.stop()


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    if not TALLY.rows:
        return
    terminalreporter.section("fault trials")
    for fault, (trials, failures) in sorted(TALLY.rows.items()):
        terminalreporter.write_line(f"{fault:<48} trials {trials:>5}   failures {failures:>3}")
