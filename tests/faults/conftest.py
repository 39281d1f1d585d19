"""The fault suite: the operator tests' fixtures, a pod recorder, and a tally of trials and failures.

``FAULT_TRIALS`` scales the suite (CI runs the default, ``make faults`` the long
version); ``FAULT_SEED`` replays a run of random timings.
"""

from __future__ import annotations

import pytest

from tests.faults.fixtures import dedicated_store, own_bed, pods, tally
from tests.faults.helpers import TALLY
from tests.operator.fixtures import operator, runs, start_operator

__all__ = ["dedicated_store", "operator", "own_bed", "pods", "runs", "start_operator", "tally"]


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    if not TALLY.rows:
        return
    terminalreporter.section("fault trials")
    for fault, (trials, failures) in sorted(TALLY.rows.items()):
        terminalreporter.write_line(f"{fault:<48} trials {trials:>5}   failures {failures:>3}")
