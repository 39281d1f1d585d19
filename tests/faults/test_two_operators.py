"""Two operators on one namespace at once, while runs go through random runner faults: no run doubled.

Two operator processes that know nothing of each other (no sharding: each
decides every run) reconcile the same torture runs while their runners are
SIGKILLed, OOM-killed, deleted or evicted at random moments (a random fault
per run, done up to three times). Every transition is a status write guarded
by the epoch and phase it was decided from, so one of two racing operators is
refused: each run must keep the invariants of ``torture.check_run`` with one
pod per epoch, each faulted attempt counted once, and the two operators'
counters adding up to what the status says (each gauge equal to it). A trial
is a fault done while both operators run. ``make test`` runs two runs with one
fault each; ``FAULT_TRIALS`` set (``make faults``: 120) runs that many.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from tests.faults.helpers import seeded, trials_of_each_kind
from tests.faults.torture import EVICTION, FAULTS_PER_RUN, OOM, POD_DELETION, RUNNER_SIGKILL, torture_batch
from tests.helpers.metrics import scrape
from tests.helpers.pods import PodRecorder
from tests.helpers.runs import RunEnv, StartOperator
from tests.helpers.tally import Tally

pytestmark = pytest.mark.testbed

KINDS = [RUNNER_SIGKILL, OOM, POD_DELETION, EVICTION]
TRIALS = trials_of_each_kind(1)
LONG = bool(os.environ.get("FAULT_TRIALS"))
# CI's slice: two runs, one fault each.
PARALLEL = int(os.environ.get("FAULT_PARALLEL", "4")) if LONG else 2
FAULTS = FAULTS_PER_RUN if LONG else 1
ROUNDS = 4 if LONG else 3  # CI's runs a round shorter (one step, a gather, maybe a wait or a sleep each)


def test_two_operators_under_random_faults(start_operator: StartOperator, runs: RunEnv, pods: PodRecorder,
                                           tally: Tally, tmp_path: Path) -> None:
    operators = [start_operator("operator-a"), start_operator("operator-b")]
    rng = seeded("two operators")
    trials = failures = lapses = batch = 0
    failed: list[str] = []
    while trials < TRIALS:
        batch += 1
        runs_of_batch = [(f"t{batch}-{i}", rng.choice(KINDS)) for i in range(PARALLEL)]
        for t, error in torture_batch(runs, pods, lambda: [scrape(o) for o in operators], rng, runs_of_batch,
                                      tmp_path, faults_per_run=FAULTS, rounds=ROUNDS):
            trials += len(t.killed)
            lapses += len(t.lapsed)
            if error:
                failures += len(t.killed) or 1
                failed.append(error)
    tally.add("two operators at once, runners faulted", trials, failures, lapses)
    print(f"two operators: {batch} batches, {trials} trials, {failures} failures, {lapses} proven lease lapses")
    assert not failed, "\n".join(failed)
