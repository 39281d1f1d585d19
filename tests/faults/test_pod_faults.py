"""Runner pods OOM-killed, deleted (``kubectl delete pod``) and evicted (the Eviction API) at random moments.

The runner-kill torture (``torture.py``) with the other things that end a
runner's pod under it. Each batch runs ``PARALLEL`` torture runs at once, each
given one of the three faults (the kinds still short of their trials, in a
random order), done to its current runner up to three times at random
moments. An OOM kill must count as a restart with reason OOMKilled; a deleted
or evicted pod as a disruption (PodDeleted, Evicted), never a restart, unless
its runner had already reported an ordinary outcome. Every run must keep the
invariants of ``torture.check_run``. ``make test`` runs one run of each kind
with one fault; ``FAULT_TRIALS`` set (``make faults``: 120) gives every kind
that many trials.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from tests.faults.helpers import seeded, trials_of_each_kind
from tests.faults.torture import EVICTION, FAULTS_PER_RUN, OOM, POD_DELETION, torture_batch
from tests.helpers.metrics import scrape
from tests.helpers.pods import PodRecorder
from tests.helpers.runs import RunEnv, StartOperator
from tests.helpers.tally import Tally

pytestmark = pytest.mark.testbed

KINDS = [OOM, POD_DELETION, EVICTION]
TRIALS = trials_of_each_kind(1)
LONG = bool(os.environ.get("FAULT_TRIALS"))
# CI's slice: one run per kind, one fault each.
PARALLEL = int(os.environ.get("FAULT_PARALLEL", "4")) if LONG else len(KINDS)
FAULTS = FAULTS_PER_RUN if LONG else 1
ROUNDS = 4 if LONG else 3  # CI's runs a round shorter (one step, a gather, maybe a wait or a sleep each)


def test_oom_deletion_and_eviction_at_random_moments(start_operator: StartOperator, runs: RunEnv,
                                                     pods: PodRecorder, tally: Tally, tmp_path: Path) -> None:
    operator = start_operator()
    rng = seeded("OOM, pod deletion, eviction")
    trials = {kind.name: 0 for kind in KINDS}
    failures, lapses = dict(trials), dict(trials)
    failed: list[str] = []
    batch = 0
    while short := [kind for kind in KINDS if trials[kind.name] < TRIALS]:
        batch += 1
        rng.shuffle(short)
        runs_of_batch = [(f"p{batch}-{i}", short[i % len(short)]) for i in range(PARALLEL)]
        for t, error in torture_batch(runs, pods, lambda: [scrape(operator)], rng, runs_of_batch, tmp_path,
                                      faults_per_run=FAULTS, rounds=ROUNDS):
            trials[t.fault.name] += len(t.killed)
            lapses[t.fault.name] += len(t.lapsed)
            if error:
                failures[t.fault.name] += len(t.killed) or 1
                failed.append(error)
    for kind in KINDS:
        tally.add(kind.name, trials[kind.name], failures[kind.name], lapses[kind.name])
    print(f"OOM, pod deletion, eviction: {batch} batches, trials {trials}, failures {failures}, proven lease "
          f"lapses {lapses}")
    assert not failed, "\n".join(failed)
