"""Generated workflows on the test bed (operator + process node) under faults, against the oracle.

The programs of tests/faults/generated.py, child runs included (they need the operator), run as
DurableRuns, several at once; early events are in the manifest, and each late event is sent once the run
is Waiting for it. Two faults, each over its own programs:

* runner SIGKILLs: the driver of tests/faults/test_runner_kills.py kills each run's current runner at
  random moments;
* operator SIGKILLs: the operator's process group is killed every few seconds and started again after a
  random downtime, while the runs go through their steps, waits, child runs and continuations.

After each run: Succeeded, its journal whole (``check_journal``), its result the oracle's, the ledger
within the oracle's execution counts (``generated.check_ledger``, pods as processes), and every crashed
pod one the test killed, counted once in ``status.restarts`` (so none under operator kills: the runners
renew their leases without it). ``GEN_SEED`` replays one program.
"""

from __future__ import annotations

import os
import random
import signal
import threading
import time
import uuid

import pytest

from durablerun import api
from durablerun_testbed import procs
from tests.faults import generated
from tests.faults.helpers import LEDGER_MOUNT, PodRecorder, Tally, finished, manifest, send_event
from tests.faults.journal import check_journal, read_journal, run_root
from tests.faults.test_runner_kills import Tortured, drive
from tests.operator.helpers import Operator, RunEnv, StartOperator

pytestmark = pytest.mark.testbed

TRIALS = int(os.environ.get("FAULT_TRIALS", "8"))
#: Programs on the bed: a quarter of FAULT_TRIALS (CI: 2, ``make faults``: 30), in batches of PARALLEL.
PROGRAMS = int(os.environ.get("GEN_BED_PROGRAMS") or max(2, TRIALS // 4))
PARALLEL = int(os.environ.get("FAULT_PARALLEL", "4"))
POLICY = {"maxRestarts": 50, "leaseDuration": "20s", "backoff": {"initial": "1s", "max": "1s"}}


def deliver_late_events(runs: RunEnv, name: str, late: list[str], stop: threading.Event) -> None:
    """Send each late event once the run waits for it (never before)."""
    pending = list(late)
    while pending and not stop.is_set():
        status = runs.get(name).get("status") or {}
        waiting = (status.get("waitingFor") or {}).get("event")
        if status.get("phase") == api.Phase.WAITING and waiting == pending[0]:
            send_event(runs, name, pending.pop(0), generated.payload(waiting))
        time.sleep(0.3)


def check(runs: RunEnv, pods: PodRecorder, run: Tortured, program: generated.Program, root: str) -> list[str]:
    assert runs.testbed.s3
    status = runs.get(run.name)["status"]
    if status["phase"] != api.Phase.SUCCEEDED:
        return [f"ended {status['phase']}: {status.get('message')}"]
    journal = read_journal(runs.testbed.s3.client(), runs.bucket, root)
    check_journal(journal)
    problems = []
    assert journal.last
    if journal.last["value"] != generated.expected_result(program):
        problems.append(f"result {journal.last['value']} != the oracle's {generated.expected_result(program)}")
    path = runs.ledger_dir / f"{run.name}.txt"
    lines = path.read_text().splitlines() if path.exists() else []
    # Every pod that ran a step, in the order each first appears; kills target the parent's pods only.
    seen = list(dict.fromkeys(line.split(" ")[2] for line in lines))
    attempts = [generated.Attempt(pod, pod in run.killed) for pod in seen]
    problems += generated.check_ledger(program, lines, attempts)
    crashed = [p for p in pods.pods_of(run.name) if (pods.ending(p) or {}).get("exitCode") == 137]
    if not set(crashed) <= run.killed:
        problems.append(f"pods crashed that nobody killed: {set(crashed) - run.killed}")
    if status["restarts"] != len(crashed):
        problems.append(f"status.restarts {status['restarts']} != {len(crashed)} crashed pods")
    return problems


class OperatorKiller:
    """Kill the operator's process group at random moments and start it again after a random downtime."""

    def __init__(self, start_operator: StartOperator, rng: random.Random) -> None:
        self.start_operator, self.rng = start_operator, rng
        self.operator: Operator = start_operator(f"operator-{uuid.uuid4().hex[:4]}")
        self.kills = 0

    def drive(self, stop: threading.Event) -> None:
        while not stop.wait(self.rng.uniform(0.5, 4.0)):
            self.operator.process.signal_group(signal.SIGKILL)
            self.operator.process.popen.wait(10)
            self.kills += 1
            stop.wait(self.rng.uniform(0.0, 2.0))  # down this long, or until the batch ends
            self.operator = self.start_operator(f"operator-{uuid.uuid4().hex[:4]}")


#: The faults, each over programs of its own (the names are the tally's rows).
FAULTS = ["runner SIGKILL", "operator SIGKILL"]


@pytest.mark.parametrize("fault", FAULTS)
def test_generated_workflows_on_the_bed_under_faults(start_operator: StartOperator, runs: RunEnv,
                                                     pods: PodRecorder, tally: Tally, fault: str) -> None:
    seeds = generated.seeds(PROGRAMS, f"generated workflows on the bed, {fault}")
    rng = random.Random(seeds[0])
    killer = OperatorKiller(start_operator, rng) if fault == "operator SIGKILL" else None
    if killer is None:
        start_operator()
    failed: list[str] = []
    kills = 0
    for batch in range(0, len(seeds), PARALLEL):
        stop = threading.Event()
        started: list[tuple[int, Tortured, generated.Program, str]] = []
        threads = []
        for seed in seeds[batch:batch + PARALLEL]:
            program = generated.generate(seed, size=6, with_children=True)
            name = f"gen{seed}"
            run = Tortured(name, {"ledger": f"{LEDGER_MOUNT}/{name}.txt", "program": program})
            body = manifest(runs, name, workflow="generated_flows:program", input=run.input, policy=POLICY)
            early = generated.early_events(program)
            if early:
                body["spec"]["events"] = {e: generated.payload(e) for e in early}
            runs.apply(body)
            root = run_root("runs", runs.namespace, name, runs.get(name)["metadata"]["uid"])
            started.append((seed, run, program, root))
            if killer is None:
                threads.append(threading.Thread(target=drive, args=(runs, pods, run, rng, root)))
            threads.append(threading.Thread(target=deliver_late_events,
                                            args=(runs, name, generated.late_events(program), stop)))
        if killer is not None:
            threads.append(threading.Thread(target=killer.drive, args=(stop,)))
        for thread in threads:
            thread.start()
        try:
            for seed, run, program, root in started:
                try:
                    procs.wait_for(lambda run=run: finished(runs, run.name), timeout=300,
                                   what=f"{run.name} to finish")
                    problems = [repr(run.error)] if run.error else check(runs, pods, run, program, root)
                except AssertionError as error:
                    problems = [str(error)]
                kills += len(run.killed)
                if problems:
                    failed.append(f"GEN_SEED={seed} ({run.name}, killed {sorted(run.killed)}): "
                                  + "; ".join(problems))
        finally:
            stop.set()
            for thread in threads:
                thread.join()
    kills += killer.kills if killer else 0
    tally.add(f"generated workflows on the bed, {fault}", len(seeds), len(failed))
    print(f"generated workflows on the bed, {fault}: {len(seeds)} programs, {kills} kills, {len(failed)} failures")
    assert not failed, "\n".join(failed)
