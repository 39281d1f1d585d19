"""The fault tally counts what the trials' checks found: passed trials, failed ones, and a fault that could
not be done, so the "fault trials" table never shows 0 failures for a kind whose test failed."""

from __future__ import annotations

import pytest

from tests.helpers.tally import Tally, trials


def test_trials_that_pass_are_counted_without_failures() -> None:
    tally = Tally()
    with trials(tally, "kind", 3):
        pass
    assert tally.rows == {"kind": [3, 0, 0]}


def test_each_failed_trial_is_counted_and_fails_the_test_naming_it() -> None:
    tally = Tally()
    with pytest.raises(AssertionError, match="run b: step s2 never ran"), trials(tally, "kind", 3) as failed:
        failed.append("run b: step s2 never ran")
    assert tally.rows == {"kind": [3, 1, 0]}


def test_a_fault_that_could_not_be_done_fails_every_trial() -> None:
    tally = Tally()
    with pytest.raises(TimeoutError), trials(tally, "kind", 5):
        raise TimeoutError("the node never became Ready")
    assert tally.rows == {"kind": [5, 5, 0]}
