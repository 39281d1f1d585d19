"""The fault suite: the operator tests' fixtures, a pod recorder, and a tally of trials and failures
(printed by tests/conftest.py).

``FAULT_TRIALS`` scales the suite (CI runs the default, ``make faults`` the long
version); ``FAULT_SEED`` replays a run of random timings.
"""

from __future__ import annotations

from tests.faults.fixtures import dedicated_store, own_bed, pods, tally
from tests.operator.fixtures import operator, runs, start_operator

__all__ = ["dedicated_store", "operator", "own_bed", "pods", "runs", "start_operator", "tally"]

