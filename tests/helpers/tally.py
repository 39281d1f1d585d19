"""The session's tally of fault trials and failures: counted by ``trials``, printed as the "fault trials" table
at the end of the session (``print_tally``, called by tests/conftest.py): every fault kind of the session's
tests (tests/faults, tests/realnode/test_faults.py) in one table."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field

import pytest


@dataclass
class Tally:
    """Trials and failures per fault, printed at the end of the session."""

    rows: dict[str, list[int]] = field(default_factory=dict)

    def add(self, fault: str, trials: int, failures: int, lapses: int = 0) -> None:
        """``lapses``: attempts no fault ended whose lease the operator expired, each proven by its runner's own
        record (tests/faults/torture.py, ``check_lapses``): the allowance those trials used."""
        row = self.rows.setdefault(fault, [0, 0, 0])
        row[0] += trials
        row[1] += failures
        row[2] += lapses


TALLY = Tally()


@contextmanager
def trials(tally: Tally, fault: str, count: int) -> Iterator[list[str]]:
    """Count ``count`` trials of ``fault``: the block appends one line per failed trial to the list it is
    given, and the test then fails listing them. A block that raises (a fault that could not be done or
    undone, a check no trial passed) has every trial counted as failed."""
    failed: list[str] = []
    try:
        yield failed
    except BaseException:
        tally.add(fault, count, count)
        raise
    tally.add(fault, count, len(failed))
    assert not failed, "\n".join(failed)


def print_tally(terminalreporter: pytest.TerminalReporter) -> None:
    """The session's "fault trials" table (on one pytest worker: the workers' tallies stay theirs)."""
    if not TALLY.rows:
        return
    terminalreporter.section("fault trials")
    for fault, (count, failures, lapses) in sorted(TALLY.rows.items()):
        terminalreporter.write_line(f"{fault:<64} trials {count:>5}   failures {failures:>3}   lapses {lapses:>3}")
    total = [sum(row[i] for row in TALLY.rows.values()) for i in (0, 1, 2)]
    terminalreporter.write_line(f"{'in all':<64} trials {total[0]:>5}   failures {total[1]:>3}   lapses {total[2]:>3}")
