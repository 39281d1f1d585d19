"""Generated workflows on the test bed (operator + process node) under faults, against the oracle.

The programs of tests/faults/generated.py, child runs included (they need the operator), run as
DurableRuns, several at once; early events are in the manifest, and each late event is sent once the run
is Waiting for it. Four faults, each over its own programs:

* runner SIGKILLs: the driver of tests/faults/test_runner_kills.py (tests/faults/torture.py) kills each run's
  current runner at random moments;
* operator SIGKILLs: the operator's process group is killed every few seconds and started again after a
  random downtime, while the runs go through their steps, waits, child runs and continuations;
* runner paused past its lease: the driver of tests/faults/test_pause_fencing.py (tests/faults/pausing.py)
  pauses each run's runner (SIGSTOP) at a random moment and continues it once the next attempt runs, or after
  the run finished; the woken runner must exit Fenced having written nothing since the pause;
* S3 outage: the runs' store is a MinIO of the test's own, stopped at a random moment while every run of
  the batch works and started again after ``OUTAGE`` seconds, as tests/faults/test_s3_outage.py does.

After each run: Succeeded, its journal whole (``check_journal``) and every object seen before the fault
kept, its result the oracle's, the ledger within the oracle's execution counts (``generated.check_ledger``,
pods as processes; a pod the fault interrupted may have run its step in flight again), and the attempts
the fault ended counted as the fault's restarts: a crashed pod one the test killed (none under operator
kills or pauses: the runners renew their leases without the operator), a store outage's crash exit 70
naming ``StoreUnavailableError``, a pause's one ``LeaseExpired``. ``GEN_SEED`` replays one program.
"""

from __future__ import annotations

import itertools
import os
import random
import signal
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import pytest

from durablerun import api
from durablerun_testbed import procs
from tests.faults import generated
from tests.faults.helpers import Paused, check_woken_and_silent, fenced_by_the_fencing, finished, seeded
from tests.faults.pausing import drive as pause_drive
from tests.faults.torture import Tortured, drive
from tests.helpers.bed import StartStore, Store
from tests.helpers.journal_checks import check_journal, check_kept, list_objects, read_journal, run_root
from tests.helpers.pods import PodRecorder
from tests.helpers.runs import Operator, RunEnv, StartOperator, events, send_event
from tests.helpers.tally import Tally
from tests.helpers.torture_runs import LEDGER_MOUNT, manifest

pytestmark = pytest.mark.testbed

TRIALS = int(os.environ.get("FAULT_TRIALS", "8"))
#: Programs on the bed: a quarter of FAULT_TRIALS (CI: 2, ``make faults``: 30), in batches of PARALLEL.
PROGRAMS = int(os.environ.get("GEN_BED_PROGRAMS") or max(2, TRIALS // 4))
PARALLEL = int(os.environ.get("FAULT_PARALLEL", "4"))
POLICY = {"maxRestarts": 50, "leaseDuration": "20s", "backoff": {"initial": "1s", "max": "1s"}}
#: Paused runs: a lease that lapses within the pause (test_pause_fencing.py's).
PAUSE_POLICY = {**POLICY, "leaseDuration": "6s"}
#: The store's outage: CI's slice is short (the runners ride it out or crash, as over 30 s); the long
#: version (FAULT_TRIALS set) takes test_s3_outage.py's.
OUTAGE = float(os.environ.get("FAULT_S3_OUTAGE_SECONDS") or (30 if os.environ.get("FAULT_TRIALS") else 6))


def deliver_late_events(runs: RunEnv, name: str, late: list[str], stop: threading.Event) -> None:
    """Send each late event once the run waits for it (never before)."""
    pending = list(late)
    while pending and not stop.is_set():
        status = runs.get(name).get("status") or {}
        waiting = (status.get("waitingFor") or {}).get("event")
        if status.get("phase") == api.Phase.WAITING and waiting == pending[0]:
            send_event(runs, name, pending.pop(0), generated.payload(waiting))
        time.sleep(0.3)


@dataclass
class Generated:
    """One program's run, and what the fault did to it."""

    seed: int
    program: generated.Program
    run: Tortured
    root: str
    paused: Paused | None = None  # the pause's trial, under pauses
    listings: list[dict[str, str]] = field(default_factory=list)  # the store's objects, just before a fault

    @property
    def name(self) -> str:
        return self.run.name


def ledger_processes(runs: RunEnv, name: str) -> tuple[list[str], list[str]]:
    """The run's ledger lines, and every process (pod) that ran a step, in the order each first appears:
    the run's own pods and its children's (``<run>-<child>-a<epoch>``)."""
    path = runs.ledger_dir / f"{name}.txt"
    lines = path.read_text().splitlines() if path.exists() else []
    return lines, list(dict.fromkeys(line.split(" ")[2] for line in lines))


def run_of(pod: str) -> str:
    return pod.rsplit("-a", 1)[0]


def storage(runs: RunEnv, store: Store | None) -> tuple[Any, str]:
    """An S3 client and the bucket of the runs' store: the test's own MinIO, else the bed's."""
    if store:
        return store.server.client(), store.bucket
    assert runs.testbed.s3
    return runs.testbed.s3.client(), runs.bucket


def check(runs: RunEnv, gen: Generated, store: Store | None, interrupted: Callable[[list[str]], set[str]]) -> list[str]:
    """The checks every fault shares: Succeeded, the journal whole and every object listed before a fault
    kept, the oracle's result, and the ledger within the oracle's counts, where ``interrupted(processes)``
    names the processes the fault cut short (each may have run its step in flight again)."""
    s3, bucket = storage(runs, store)
    status = runs.get(gen.name)["status"]
    if status["phase"] != api.Phase.SUCCEEDED:
        return [f"ended {status['phase']}: {status.get('message')}"]
    journal = read_journal(s3, bucket, gen.root)
    check_journal(journal)
    for listing in gen.listings:
        check_kept(listing, journal.etags)
    problems = []
    assert journal.last
    if journal.last["value"] != generated.expected_result(gen.program):
        problems.append(f"result {journal.last['value']} != the oracle's {generated.expected_result(gen.program)}")
    lines, seen = ledger_processes(runs, gen.name)
    cut = interrupted(seen)
    problems += generated.check_ledger(gen.program, lines, [generated.Attempt(p, p in cut) for p in seen])
    return problems


# --- what each fault must have counted, and which processes it cut short ------------------------------------

def killed_and_counted(runs: RunEnv, pods: PodRecorder, gen: Generated) -> list[str]:
    """SIGKILLs (none under operator kills): every crashed pod one the test killed, each one restart."""
    status = runs.get(gen.name)["status"]
    crashed = [p for p in pods.pods_of(gen.name) if (pods.ending(p) or {}).get("exitCode") == 137]
    problems = []
    if not set(crashed) <= gen.run.killed:
        problems.append(f"pods crashed that nobody killed: {set(crashed) - gen.run.killed}")
    if status["restarts"] != len(crashed):
        problems.append(f"status.restarts {status['restarts']} != {len(crashed)} crashed pods")
    return problems


def store_crashes(pods: PodRecorder, processes: list[str]) -> tuple[set[str], list[str]]:
    """Of these pods, those an S3 outage ended (exit 70 naming StoreUnavailableError), and every other
    ending that is not an ordinary outcome (completed, or stopped to wait)."""
    crashed, problems = set(), []
    for pod in processes:
        ending = pods.ending(pod) or {}
        if ending.get("exitCode") in (None, api.Outcome.COMPLETED.exit_code, api.Outcome.WAITING.exit_code):
            continue
        if ending.get("exitCode") == 70 and "StoreUnavailableError" in (ending.get("message") or ""):
            crashed.add(pod)
        else:
            problems.append(f"{pod} ended other than as a store outage's crash: {ending}")
    return crashed, problems


def outage_counted(runs: RunEnv, pods: PodRecorder, gen: Generated) -> list[str]:
    """Each attempt of the run the outage ended is one restart and one Restarting Event, nothing more."""
    status = runs.get(gen.name)["status"]
    crashed, problems = store_crashes(pods, pods.pods_of(gen.name))
    _, children = store_crashes(pods, [p for p in ledger_processes(runs, gen.name)[1] if run_of(p) != gen.name])
    problems += children
    if (status["restarts"], events(runs, gen.name)["Restarting"]) != (len(crashed), len(crashed)):
        problems.append(f"{len(crashed)} attempts ended by the outage, but status.restarts {status['restarts']} "
                        f"and {events(runs, gen.name)['Restarting']} Restarting Events")
    pods.check_one_pod_per_epoch(gen.name, status["attempt"])
    ended = f"{len(crashed)} attempt(s) ended as crashes" if crashed else "carried on"
    print(f"{gen.name}: {ended} through the outage")
    return problems


def fencing_cut_off(runs: RunEnv, pods: PodRecorder, gen: Generated, processes: list[str]) -> set[str]:
    """The paused pod, and the later attempts (the run's or its children's) that the fencing itself cut
    short, whose step in flight may run again (at least once, by design; test_pause_fencing.cut_off): a
    LeaseExpired Event of its run names it, it saw its own lease lapse, or (the run's own pods) its journal
    write was refused at a position the paused attempt's record holds."""
    assert gen.paused
    s3, bucket = storage(runs, None)
    journal = read_journal(s3, bucket, gen.root)
    expiries = {run: [e["message"] for e in runs.events(run) if e["reason"] == "LeaseExpired"]
                for run in {run_of(p) for p in processes}}
    cut = {gen.paused.pod} if gen.paused.pod else set()
    for pod in processes:
        paused_attempt = gen.paused.attempt_id if run_of(pod) == gen.name else None
        if (any(f"pod {pod} " in m for m in expiries[run_of(pod)])
                or fenced_by_the_fencing(pods.ending(pod), paused_attempt, journal)):
            cut.add(pod)
    return cut


def woken_fenced_and_silent(runs: RunEnv, pods: PodRecorder, gen: Generated) -> None:
    """The pause test's checks of the woken runner (``check_woken_and_silent``), and no pod crashed that
    nobody killed."""
    assert gen.paused
    assert gen.paused.pod
    s3, bucket = storage(runs, None)
    check_woken_and_silent(runs, pods, gen.paused, gen.root, read_journal(s3, bucket, gen.root))
    crashed = [p for p in pods.pods_of(gen.name) if (pods.ending(p) or {}).get("exitCode") == 137]
    assert not crashed, f"pods crashed that nobody killed: {crashed}"


# --- the faults' drivers -------------------------------------------------------------------------------------

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


def stop_the_store(runs: RunEnv, store: Store, batch: list[Generated], rng: random.Random) -> set[str]:
    """Once every run of the batch has its first attempt under way (or finished), 0-1.5 s later, stop the store
    for OUTAGE seconds and start it again on the same port and data: the runs it stopped under."""
    def started(gen: Generated) -> bool:
        return (runs.get(gen.name).get("status") or {}).get("phase") not in (None, api.Phase.PENDING)

    procs.wait_for(lambda: all(started(g) for g in batch), timeout=180, what="every run to start an attempt")
    # The random moment of the outage: the runner starting, reading its journal or running the program (a
    # generated program is short: test_s3_outage's 0.5-3 s after the first step would often miss it).
    time.sleep(rng.uniform(0, 1.5))
    s3 = store.server.client()
    for gen in batch:
        gen.listings.append(list_objects(s3, store.bucket, gen.root))
    reached = {g.name for g in batch if not finished(runs, g.name)}
    store.server.stop()
    stopped = time.monotonic()
    time.sleep(OUTAGE)  # the outage itself: the fault being injected, not a wait for a condition
    store.server.restart()
    print(f"S3 outage: down for {time.monotonic() - stopped:.1f}s under {sorted(reached)}")
    return reached


RUNNER_SIGKILL, OPERATOR_SIGKILL = "runner SIGKILL", "operator SIGKILL"
PAUSE, S3_OUTAGE = "runner paused past its lease", "S3 outage"
#: The faults, each over programs of its own (the names are the tally's rows).
FAULTS = [RUNNER_SIGKILL, OPERATOR_SIGKILL, PAUSE, S3_OUTAGE]


def start_program(runs: RunEnv, seed: int, fault: str, store: Store | None) -> Generated:
    program = generated.generate(seed, size=6, with_children=True)
    name = f"gen{seed}"
    run = Tortured(name, {"ledger": f"{LEDGER_MOUNT}/{name}.txt", "program": program})
    body = manifest(runs, name, workflow="generated_flows:program", input=run.input,
                    policy=PAUSE_POLICY if fault == PAUSE else POLICY)
    early = generated.early_events(program)
    if early:
        body["spec"]["events"] = {e: generated.payload(e) for e in early}
    runs.apply(store.use(body) if store else body)
    return Generated(seed, program, run, run_root("runs", runs.namespace, name, runs.get(name)["metadata"]["uid"]))


def checked(runs: RunEnv, pods: PodRecorder, gen: Generated, fault: str, store: Store | None) -> list[str]:
    """Every check of a finished program under ``fault``: what it broke (empty: nothing)."""
    if gen.run.error:
        return [repr(gen.run.error)]
    if fault == PAUSE:
        assert gen.paused
        if gen.paused.error:
            return [repr(gen.paused.error)]
        if gen.paused.pod:  # else it finished before its pause
            woken_fenced_and_silent(runs, pods, gen)
            gen.listings = [gen.paused.listing_before]  # just before the wake-up
        return check(runs, gen, None, lambda seen: fencing_cut_off(runs, pods, gen, seen))
    if fault == S3_OUTAGE:
        return check(runs, gen, store, lambda seen: store_crashes(pods, seen)[0]) + outage_counted(runs, pods, gen)
    gen.listings = gen.run.listings
    # Kills target the parent's pods only.
    return check(runs, gen, None, lambda seen: gen.run.killed) + killed_and_counted(runs, pods, gen)


def run_batch(runs: RunEnv, pods: PodRecorder, fault: str, seeds: list[int], rng: random.Random,
              store: Store | None, killer: OperatorKiller | None) -> list[tuple[Generated, bool, list[str]]]:
    """Run a batch of programs at once under ``fault`` and check each: the program, whether the fault
    reached it (a pause or an outage may come after it finished) and what it broke."""
    stop = threading.Event()
    gens = [start_program(runs, seed, fault, store) for seed in seeds]
    drivers: dict[str, threading.Thread] = {}
    threads = [threading.Thread(target=deliver_late_events,
                                args=(runs, g.name, generated.late_events(g.program), stop)) for g in gens]
    for i, gen in enumerate(gens):
        if fault == RUNNER_SIGKILL:
            drivers[gen.name] = threading.Thread(target=drive, args=(runs, pods, gen.run, rng, gen.root))
        elif fault == PAUSE:
            gen.paused = Paused(gen.name, ("during-next-attempt", "after-finish")[i % 2], gen.run.input)
            drivers[gen.name] = threading.Thread(target=pause_drive, args=(runs, pods, gen.paused, rng, gen.root))
    if killer is not None:
        threads.append(threading.Thread(target=killer.drive, args=(stop,)))
    for thread in [*threads, *drivers.values()]:
        thread.start()
    out = []
    try:
        reached = stop_the_store(runs, store, gens, rng) if store else {g.name for g in gens}
        for gen in gens:
            try:
                procs.wait_for(lambda gen=gen: finished(runs, gen.name), timeout=300, what=f"{gen.name} to finish")
                if gen.name in drivers:
                    drivers[gen.name].join()
                if gen.paused and not gen.paused.pod and not gen.paused.error:
                    reached.discard(gen.name)  # it finished before its pause
                problems = checked(runs, pods, gen, fault, store)
            except AssertionError as error:
                problems = [str(error)]
            out.append((gen, gen.name in reached, problems))
    finally:
        stop.set()
        for thread in [*threads, *drivers.values()]:
            thread.join()
    return out


#: Programs each fault must reach: PROGRAMS; in CI's slice one for a pause and an outage (the budget).
def programs(fault: str) -> int:
    ci = os.environ.get("GEN_BED_PROGRAMS") is None and os.environ.get("FAULT_TRIALS") is None
    return 1 if ci and fault in (PAUSE, S3_OUTAGE) else PROGRAMS


@pytest.mark.parametrize("fault", FAULTS)
def test_generated_workflows_on_the_bed_under_faults(start_operator: StartOperator, runs: RunEnv,
                                                     pods: PodRecorder, dedicated_store: StartStore, tally: Tally,
                                                     fault: str) -> None:
    seeds = generated.seed_stream(f"generated workflows on the bed, {fault}")
    rng = seeded(f"generated workflows on the bed, {fault}")
    killer = OperatorKiller(start_operator, rng) if fault == OPERATOR_SIGKILL else None
    if killer is None:
        start_operator()
    store = dedicated_store() if fault == S3_OUTAGE else None
    failed: list[str] = []
    target, drawn, faults, trials = programs(fault), 0, 0, 0
    # Until the fault has reached the target's programs; a program it missed is drawn again, up to 4 times.
    while trials < target and drawn < 4 * target:
        batch = list(itertools.islice(seeds, min(PARALLEL, target - trials)))
        if not batch:
            break  # GEN_SEED: its one program ran
        drawn += len(batch)
        for gen, reached, problems in run_batch(runs, pods, fault, batch, rng, store, killer):
            faults += len(gen.run.killed) + (reached and fault in (PAUSE, S3_OUTAGE))
            trials += reached or bool(problems)  # a program that broke a check is a trial, reached or not
            if problems:
                failed.append(f"GEN_SEED={gen.seed} ({gen.name}, killed {sorted(gen.run.killed)}): "
                              + "; ".join(problems))
    faults += killer.kills if killer else 0
    tally.add(f"generated workflows on the bed, {fault}", trials, len(failed))
    print(f"generated workflows on the bed, {fault}: {drawn} programs, {trials} reached by the fault, "
          f"{faults} faults, {len(failed)} failures")
    assert not failed, "\n".join(failed)
    assert trials, f"the fault reached none of the {drawn} programs: nothing was tested"
