"""The operator SIGKILLed and restarted at random moments, aimed at its riskiest transitions.

Several torture runs go on while the operator is killed (its whole process
group, SIGKILL) and started again after a random downtime, at a random moment
around one of:

* attempt creation: a runner is crashed, and the operator dies while it
  moves the run through Backoff, bumps the epoch and creates the next pod;
* lease-expiry handling: a runner is paused, and the operator dies around the
  moment its lease expires (declaring it expired, bumping the epoch,
  deleting the old pod, waiting for it, starting the next attempt);
* anywhere.

The operator keeps no state a restart would lose, so every run still ends
Succeeded with exactly one pod per epoch, one restart per interrupted
attempt, and the journal, execution and result invariants of the runner
torture. (Events are best effort: an operator killed between an action and
its Event loses the Event, so Events are checked for never claiming more
than happened; the status and the new operator's gauges must agree exactly.)
"""

from __future__ import annotations

import signal
import threading
import time
import urllib.error
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from durablerun_testbed import procs
from tests.faults.helpers import GO, check_woken_fenced, finished, reference, running_pod, seeded, trials_of_each_kind
from tests.helpers.fault_workflows import torture_flows
from tests.helpers.journal_checks import check_journal, read_journal, run_root
from tests.helpers.metrics import run_metric, scrape
from tests.helpers.pods import PodRecorder, process_of, wait_pod_exit
from tests.helpers.runs import Operator, RunEnv, StartOperator, events, send_event
from tests.helpers.tally import Tally
from tests.helpers.torture_runs import Ledger, check_executions, manifest, torture_input

pytestmark = pytest.mark.testbed

TRIALS = trials_of_each_kind(3)
RUNS_AT_ONCE = 3
MOMENTS = ["attempt-creation", "lease-expiry", "anywhere"]
POLICY = {"maxRestarts": 30, "leaseDuration": "6s", "backoff": {"initial": "1s", "max": "1s"}}


@dataclass
class Chaos:
    """The operator's life: who runs now, how often it was killed, and what the runners suffered."""

    runs: RunEnv
    start_operator: StartOperator
    rng: Any
    operator: Operator | None = None
    kills: dict[str, int] = field(default_factory=dict)  # moment -> operator kills
    crashed: set[str] = field(default_factory=set)  # runner pods SIGKILLed
    paused: dict[str, float] = field(default_factory=dict)  # runner pods SIGSTOPped for good, and when
    moments: list[str] = field(default_factory=list)

    def restart_operator(self) -> None:
        self.operator = self.start_operator(f"operator-{uuid.uuid4().hex[:4]}")

    def kill_operator(self, moment: str, downtime: float) -> None:
        assert self.operator
        self.operator.process.signal_group(signal.SIGKILL)
        self.operator.process.popen.wait(10)
        self.kills[moment] = self.kills.get(moment, 0) + 1
        time.sleep(downtime)  # the operator stays down this long: part of the fault
        self.restart_operator()

    def a_running_pod(self, names: list[str]) -> tuple[str, str] | None:
        for name in self.rng.sample(names, len(names)):
            pod = running_pod(self.runs, name)
            if pod and pod not in self.paused:
                return name, pod
        return None

    def cycle(self, names: list[str]) -> bool:
        """One operator kill aimed at one moment; False when no run is left to aim at."""
        node = self.runs.testbed.node
        assert node
        target = procs.wait_for(lambda: self.a_running_pod(names) or all(finished(self.runs, n) for n in names),
                                timeout=120, what="a running runner to aim at")
        if target is True:
            return False
        _, pod = target
        # Every moment in turn (in a random order each round), so even three kills aim at each.
        if not self.moments:
            self.moments = self.rng.sample(MOMENTS, len(MOMENTS))
        moment = self.moments.pop()
        if moment == "attempt-creation":
            try:
                node.kill(self.runs.namespace, pod)
            except urllib.error.HTTPError:
                return True
            self.crashed.add(pod)
            # The backoff is 1s: the next pod is created about 1-1.5s after the crash is seen.
            time.sleep(self.rng.uniform(0.3, 2.0))
        elif moment == "lease-expiry":
            renewed = time.monotonic()
            try:
                node.pause(self.runs.namespace, pod)
            except urllib.error.HTTPError:
                return True
            self.paused[pod] = time.time()
            # The lease (6s) was renewed at most 2s before the pause; the operator checks every 0.5s.
            time.sleep(max(0.0, renewed + self.rng.uniform(4.0, 8.0) - time.monotonic()))
        else:
            time.sleep(self.rng.uniform(0, 3.0))
        self.kill_operator(moment, downtime=self.rng.uniform(0, 2.0))
        return True


def test_operator_killed_at_random_moments(start_operator: StartOperator, runs: RunEnv, pods: PodRecorder,
                                           tally: Tally, tmp_path: Path) -> None:
    chaos = Chaos(runs, start_operator, seeded("operator SIGKILL"))
    chaos.restart_operator()
    node = runs.testbed.node
    assert node
    assert runs.testbed.s3
    failed: list[str] = []
    done_runs: list[str] = []
    batch = 0
    while sum(chaos.kills.values()) < TRIALS:
        batch += 1
        names = [f"o{batch}-{i}" for i in range(RUNS_AT_ONCE)]
        inputs = {n: torture_input(n, rounds=5, pace=0.3, **({"waitRound": 2} if i == 0 else {}))
                  for i, n in enumerate(names)}
        expected = {n: reference(inputs[n], tmp_path) for n in names}
        for name in names:
            runs.apply(manifest(runs, name, input=inputs[name], policy=POLICY, snapshot_every=5))
        timers = [threading.Timer(chaos.rng.uniform(0, 15), send_event, (runs, names[0], "go", GO))]
        timers[0].start()
        while sum(chaos.kills.values()) < TRIALS and chaos.cycle(names):
            pass
        timers[0].join()
        for name in names:
            try:
                runs.wait_phase(name, "Succeeded", "Failed", "Aborted", timeout=240)
                check_run(runs, pods, chaos, name, inputs[name], expected[name])
                done_runs.append(name)
            except AssertionError as error:
                failed.append(f"{name}: {error}")
    # Wake the runners paused for good: each must find itself fenced.
    for pod in sorted(chaos.paused):
        entry = process_of(runs.testbed, runs.namespace, pod)
        node.cont(runs.namespace, pod)
        try:
            assert entry, f"the process node forgot the paused runner {pod}"
            check_woken_fenced(wait_pod_exit(runs, pods, pod, timeout=90), Path(entry["log"]), chaos.paused[pod])
        except AssertionError as error:
            failed.append(f"paused runner {pod}: {error}")
    trials = sum(chaos.kills.values())
    tally.add("operator SIGKILL and restart", trials, len(failed))
    print(f"operator SIGKILL: {trials} trials {chaos.kills} over {len(done_runs) + len(failed)} runs, "
          f"{len(failed)} failures")
    assert not failed, "\n".join(failed)


def check_run(runs: RunEnv, pods: PodRecorder, chaos: Chaos, name: str, input: dict[str, Any],
              expected: tuple[Any, Any]) -> None:
    assert runs.testbed.s3
    run = runs.get(name)
    status = run["status"]
    assert status["phase"] == "Succeeded", status.get("message")
    journal = read_journal(runs.testbed.s3.client(), runs.bucket,
                           run_root("runs", runs.namespace, name, run["metadata"]["uid"]))
    check_journal(journal)
    steps = torture_flows.step_names(input)
    check_executions(Ledger.read(runs, name), steps, chaos.crashed | set(chaos.paused))
    result, totals = expected
    assert journal.last
    assert journal.last["value"] == result
    assert journal.last["totals"]["usd"] == str(totals.usd)
    # One pod per epoch, one restart per interrupted attempt: no attempt lost or doubled by a dying operator.
    pods.check_one_pod_per_epoch(name, status["attempt"])
    interrupted = [p for p in pods.pods_of(name) if p in chaos.crashed | set(chaos.paused)]
    assert status["restarts"] == len(interrupted), (status["restarts"], interrupted)
    assert status["disruptions"] == 0
    seen = events(runs, name)
    assert seen["AttemptStarted"] <= status["attempt"], seen
    assert seen["Restarting"] <= status["restarts"], seen
    assert seen["Succeeded"] <= 1, seen
    assert chaos.operator

    def gauges() -> dict[Any, float] | None:
        assert chaos.operator
        samples = scrape(chaos.operator)
        ok = run_metric(samples, "durablerun_run_phase", runs.namespace, name, phase="Succeeded") == 1
        return samples if ok else None

    samples = procs.wait_for(gauges, timeout=30, what=f"gauges of {name}")
    assert run_metric(samples, "durablerun_run_status_restarts", runs.namespace, name) == status["restarts"]
    assert run_metric(samples, "durablerun_run_completed_steps", runs.namespace, name) == totals.steps
