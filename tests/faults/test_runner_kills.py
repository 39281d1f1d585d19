"""Runner pods SIGKILLed at random moments, many runs at once: nothing journaled is lost or redone.

Each run executes the torture workflow (sequential steps, ctx.gather with
nested branches, a wait for an event sent at a random moment, a durable sleep,
a side effect charging cost) while a driver kills its current runner at a
random moment after the runner's process starts (start-up, lease acquisition,
replay, a running step, a journal write, a snapshot, the outcome report), as
often as the run lives long enough. After every run the invariants of
``check_run`` must hold. ``FAULT_TRIALS`` (kills) scales it: the CI default is
small, ``make faults`` runs the long version.
"""

from __future__ import annotations

import os
import threading
import time
import urllib.error
from dataclasses import dataclass, field
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest

from durablerun_testbed import procs
from tests.faults.helpers import (
    GO,
    Ledger,
    PodRecorder,
    Tally,
    check_executions,
    events,
    finished,
    manifest,
    reference,
    run_metric,
    running_pod,
    scrape,
    seeded,
    send_event,
    torture_input,
    wait_pod_exit,
)
from tests.faults.journal import check_journal, check_kept, list_objects, read_journal, run_root
from tests.faults.workflows import torture_flows
from tests.operator.helpers import RunEnv, StartOperator

pytestmark = pytest.mark.testbed

TRIALS = int(os.environ.get("FAULT_TRIALS", "8"))
PARALLEL = int(os.environ.get("FAULT_PARALLEL", "4"))
KILLS_PER_RUN = 3
SPREAD = 5.0  # seconds after a runner's process starts within which its kill falls
POLICY = {"maxRestarts": 50, "leaseDuration": "20s", "backoff": {"initial": "1s", "max": "1s"}}


@dataclass
class Tortured:
    name: str
    input: dict[str, Any]
    killed: set[str] = field(default_factory=set)
    listings: list[dict[str, str]] = field(default_factory=list)
    error: BaseException | None = None


def drive(runs: RunEnv, pods: PodRecorder, run: Tortured, rng: Any, journal_root: str) -> None:
    """Kill the run's current runner at random moments, up to KILLS_PER_RUN times, until it finishes."""
    node = runs.testbed.node
    assert node
    assert runs.testbed.s3
    s3 = runs.testbed.s3.client()
    try:
        for _ in range(KILLS_PER_RUN):
            pod = procs.wait_for(lambda: "finished" if finished(runs, run.name) else running_pod(runs, run.name),
                                 timeout=180, what=f"a running runner of {run.name}")
            if pod == "finished":
                return
            time.sleep(rng.uniform(0, SPREAD))  # the random moment of the fault
            try:
                node.kill(runs.namespace, pod)
            except urllib.error.HTTPError:
                continue  # it ended on its own first: no trial
            run.killed.add(pod)
            wait_pod_exit(runs, pods, pod)
            run.listings.append(list_objects(s3, runs.bucket, journal_root))
    except BaseException as error:
        run.error = error


def check_run(runs: RunEnv, pods: PodRecorder, operator_samples: Any, run: Tortured, expected: tuple[Any, Any],
              journal_root: str) -> None:
    """The invariants after one tortured run."""
    assert runs.testbed.s3
    status = runs.get(run.name)["status"]
    assert status["phase"] == "Succeeded", status.get("message")
    journal = read_journal(runs.testbed.s3.client(), runs.bucket, journal_root)
    # No journaled step lost or overwritten; each operation written once, by one attempt; snapshots faithful.
    check_journal(journal)
    for listing in run.listings:
        check_kept(listing, journal.etags)
    steps = torture_flows.step_names(run.input)
    assert sorted(journal.steps) == sorted(steps)
    assert len(set(journal.writers)) <= status["attempt"]
    # No step executed more often than 1 + the kills that caught it in flight.
    check_executions(Ledger.read(runs, run.name), steps, run.killed)
    # The result (and the cost charged by side effects) equals the uncrashed reference.
    result, totals = expected
    assert journal.last
    assert journal.last["value"] == result
    assert journal.last["totals"] == {"usd": str(totals.usd), "tokens": totals.tokens, "steps": totals.steps}
    # Status, Events, pods and metrics agree.
    crashed = [p for p in pods.pods_of(run.name) if (pods.ending(p) or {}).get("exitCode") == 137]
    assert set(crashed) <= run.killed, f"pods crashed that nobody killed: {set(crashed) - run.killed}"
    assert status["restarts"] == len(crashed), (status["restarts"], crashed)
    assert status["disruptions"] == 0
    pods.check_one_pod_per_epoch(run.name, status["attempt"])
    # The operator posts a transition's Events after its status: wait for the last one.
    seen = procs.wait_for(lambda: (s := events(runs, run.name))["Succeeded"] and s, timeout=30,
                          what="the Succeeded Event")
    assert seen["AttemptStarted"] == status["attempt"], seen
    assert seen["Restarting"] == status["restarts"], seen
    assert seen["Succeeded"] == 1, seen
    assert status["progress"]["completedSteps"] == totals.steps
    assert Decimal(status["cost"]["usd"]) == totals.usd
    assert status["cost"]["tokens"] == totals.tokens
    samples = operator_samples()
    ns = runs.namespace
    assert run_metric(samples, "durablerun_run_phase", ns, run.name, phase="Succeeded") == 1
    assert run_metric(samples, "durablerun_run_status_restarts", ns, run.name) == status["restarts"]
    assert run_metric(samples, "durablerun_run_restarts_total", ns, run.name, reason="Crash") == status["restarts"]
    assert run_metric(samples, "durablerun_run_completions_total", ns, run.name, outcome="Succeeded") == 1
    assert run_metric(samples, "durablerun_run_completed_steps", ns, run.name) == totals.steps
    assert run_metric(samples, "durablerun_run_cost_usd", ns, run.name) == float(totals.usd)


def test_runner_sigkill_at_random_moments(start_operator: StartOperator, runs: RunEnv, pods: PodRecorder,
                                          tally: Tally, tmp_path: Path) -> None:
    operator = start_operator()
    rng = seeded("runner SIGKILL")
    trials = failures = 0
    failed: list[str] = []
    batch = 0
    while trials < TRIALS:
        batch += 1
        tortured = []
        for i in range(PARALLEL):
            name = f"k{batch}-{i}"
            shape: dict[str, Any] = {}
            if i % 3 == 1:
                shape["waitRound"] = 1
            if i % 3 == 2:
                shape["sleepRound"] = 2
            tortured.append(Tortured(name, torture_input(name, rounds=4, **shape)))
        expected = {t.name: reference(t.input, tmp_path) for t in tortured}
        roots: dict[str, str] = {}
        threads = []
        for t in tortured:
            # Half the runs snapshot every 4 records: kills also hit snapshot writes and chunk merges.
            runs.apply(manifest(runs, t.name, input=t.input, policy=POLICY,
                                snapshot_every=4 if int(t.name.rsplit("-", 1)[1]) % 2 else None))
            roots[t.name] = run_root("runs", runs.namespace, t.name, runs.get(t.name)["metadata"]["uid"])
            threads.append(threading.Thread(target=drive, args=(runs, pods, t, rng, roots[t.name])))
            if t.input.get("waitRound") is not None:
                # The event arrives at a random moment: before the wait, during it, or while no pod runs.
                threads.append(threading.Timer(rng.uniform(0, 12), send_event, (runs, t.name, "go", GO)))
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        for t in tortured:
            trials += len(t.killed)
            try:
                if t.error:
                    raise t.error
                runs.wait_phase(t.name, "Succeeded", "Failed", "Aborted", timeout=180)

                def metrics_settled(t: Tortured = t) -> Any:
                    samples = scrape(operator)
                    phase = run_metric(samples, "durablerun_run_phase", runs.namespace, t.name, phase="Succeeded")
                    return samples if phase == 1 else None

                samples = procs.wait_for(metrics_settled, timeout=30, what=f"metrics of {t.name}")
                check_run(runs, pods, lambda samples=samples: samples, t, expected[t.name], roots[t.name])
            except AssertionError as error:
                failures += len(t.killed) or 1
                failed.append(f"{t.name} (killed {sorted(t.killed)}): {error}")
    tally.add("runner SIGKILL at random moments", trials, failures)
    print(f"runner SIGKILL: {trials} trials, {failures} failures")
    assert not failed, "\n".join(failed)
