"""Runner pods SIGKILLed at random moments, many runs at once: nothing journaled is lost or redone.

Each run executes the torture workflow (sequential steps, ctx.gather with
nested branches, a wait for an event sent at a random moment, a durable sleep,
a side effect charging cost) while a driver kills its current runner at a
random moment after the runner's process starts (start-up, lease acquisition,
replay, a running step, a journal write, a snapshot, the outcome report), as
often as the run lives long enough. After every run the invariants of
``torture.check_run`` must hold. ``FAULT_TRIALS`` (kills) scales it: the CI
default is small, ``make faults`` runs the long version.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from tests.faults.helpers import seeded, trials_of_each_kind
from tests.faults.torture import RUNNER_SIGKILL, torture_batch
from tests.helpers.metrics import scrape
from tests.helpers.pods import PodRecorder
from tests.helpers.runs import RunEnv, StartOperator
from tests.helpers.tally import Tally

pytestmark = pytest.mark.testbed

TRIALS = trials_of_each_kind(8)
PARALLEL = int(os.environ.get("FAULT_PARALLEL", "4"))


def test_runner_sigkill_at_random_moments(start_operator: StartOperator, runs: RunEnv, pods: PodRecorder,
                                          tally: Tally, tmp_path: Path) -> None:
    operator = start_operator()
    rng = seeded("runner SIGKILL")
    trials = failures = lapses = 0
    failed: list[str] = []
    batch = 0
    while trials < TRIALS:
        batch += 1
        runs_of_batch = [(f"k{batch}-{i}", RUNNER_SIGKILL) for i in range(PARALLEL)]
        for t, error in torture_batch(runs, pods, lambda: [scrape(operator)], rng, runs_of_batch, tmp_path):
            trials += len(t.killed)
            lapses += len(t.lapsed)
            if error:
                failures += len(t.killed) or 1
                failed.append(error)
    tally.add(RUNNER_SIGKILL.name, trials, failures, lapses)
    print(f"runner SIGKILL: {trials} trials, {failures} failures, {lapses} proven lease lapses")
    assert not failed, "\n".join(failed)
