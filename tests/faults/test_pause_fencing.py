"""A runner paused (SIGSTOP) past its lease, then continued at a random moment: fenced, it writes nothing.

The pause falls at a random moment of the attempt (start-up, replay, a step,
a journal write, a snapshot); the operator declares the lease expired, bumps
the epoch and starts the next attempt once the old pod is presumed lost. The
paused runner is continued at a random moment: while the next attempt runs,
or after the run has finished. Then it must notice that its lease lapsed and
exit Fenced (5) without writing: no journal record it creates after the pause
lands, no status, no outcome; after a finished run, not one object changes.
"""

from __future__ import annotations

import contextlib
import json
import os
import threading
from pathlib import Path

import pytest

from durablerun import api
from tests.faults.helpers import (
    Paused,
    RunTimeline,
    check_woken_and_silent,
    fenced_by_the_fencing,
    seeded,
    trials_of_each_kind,
)
from tests.faults.pausing import drive
from tests.helpers.fault_workflows import torture_flows
from tests.helpers.journal_checks import Journal, check_journal, read_journal, run_root
from tests.helpers.pods import PodRecorder, process_of
from tests.helpers.runs import RunEnv, StartOperator
from tests.helpers.tally import Tally
from tests.helpers.torture_runs import Ledger, check_executions, manifest, torture_input

pytestmark = pytest.mark.testbed

TRIALS = trials_of_each_kind(2)
PARALLEL = int(os.environ.get("FAULT_PARALLEL", "4"))
POLICY = {"maxRestarts": 20, "leaseDuration": "6s", "backoff": {"initial": "1s", "max": "1s"}}


def begun_before(log: Path, moment: float) -> set[str]:
    """The steps a runner's log says it began (its ``step_started`` lines) before ``moment`` (epoch seconds).
    The line is written just after the step passed the lease check, with no await between them."""
    begun = set()
    for line in log.read_text(errors="replace").splitlines() if log.is_file() else []:
        if line.startswith("{") and '"step_started"' in line:
            event = json.loads(line)
            if api.parse_time(event["time"]).timestamp() < moment:
                begun.add(str(event["name"]))
    return begun


def check_trial(runs: RunEnv, pods: PodRecorder, trial: Paused, root: str) -> None:
    assert runs.testbed.s3
    status = runs.wait_phase(trial.name, "Succeeded", "Failed", "Aborted", timeout=180)["status"]
    assert status["phase"] == "Succeeded", status.get("message")
    journal = read_journal(runs.testbed.s3.client(), runs.bucket, root)
    check_journal(journal)
    if trial.mode == "after-finish":
        assert journal.pointer, "the finished run has no snapshot"
    check_woken_and_silent(runs, pods, trial, root, journal)
    # A step the paused runner had begun may run on when it wakes, after the next attempt ran it: at least once.
    in_flight = {(step, trial.pod) for step in begun_before(Path(trial.log), trial.paused_at)} \
        if trial.pod and trial.log else set()
    check_executions(Ledger.read(runs, trial.name), torture_flows.step_names(trial.input),
                     {trial.pod or ""} | cut_off(runs, pods, trial, journal), in_flight)


def cut_off(runs: RunEnv, pods: PodRecorder, trial: Paused, journal: Journal) -> set[str]:
    """Later attempts the fencing itself stopped, whose step in flight may run again (at least once, by design):

    - one whose own lease lapsed: the operator declared it expired (a LeaseExpired Event names it), or the
      runner saw it lapse first and stopped itself (exit 5, "lapsed without renewal");
    - one whose journal write was refused (exit 5, 412 on ``journal/<seq>``) because the paused runner's
      write, under way when it froze, landed there when it woke: the record at that position is the paused
      attempt's (the known limit in docs/faults.md).

    Any other ending of a later attempt (fenced for another reason, a crash) is not the fencing's doing."""
    later = [p for p in pods.pods_of(trial.name) if p != trial.pod]
    expiries = [e["message"] for e in runs.events(trial.name) if e["reason"] == "LeaseExpired"]
    stopped = {p for p in later if any(f"pod {p} " in message for message in expiries)}
    return stopped | {p for p in later if fenced_by_the_fencing(pods.ending(p), trial.attempt_id, journal)}


def history(runs: RunEnv, pods: PodRecorder, trial: Paused) -> str:
    """What happened to a failed trial's run: its Events and how each of its pods ended."""
    seen = [f"{e['reason']}: {e['message']}" for e in sorted(
        runs.events(trial.name), key=lambda e: e.get("lastTimestamp") or e.get("eventTime") or "")]
    endings = {pod: ending for pod, ending in pods.endings.items() if pod.startswith(f"{trial.name}-a")}
    return f"events: {seen}\n  pod endings: {endings}"


def record(directory: Path, runs: RunEnv, pods: PodRecorder, timeline: RunTimeline, trial: Paused, root: str,
           verdict: str) -> None:
    """A trial's recording: its Events, pod endings, lease timeline, journal writers, ledger and runner logs."""
    assert runs.testbed.s3
    lines = [f"trial {trial.name} ({trial.mode}): {verdict}",
             f"paused {trial.pod} (attempt {trial.attempt_id}) at {trial.paused_at:.3f}, "
             f"continued at {trial.continued_at:.3f}", "", history(runs, pods, trial), "", "lease timeline:",
             *timeline.of(trial.name), "", "journal (seq pos kind name writer at):"]
    with contextlib.suppress(Exception):
        journal = read_journal(runs.testbed.s3.client(), runs.bucket, root)
        lines += [f"  {seq} {r['pos']} {r['kind']} {r.get('name')} {r['w']} {r['at']:.3f}"
                  for seq, r in sorted(journal.records.items())]
    lines += ["", "ledger:", *(" ".join(line) for line in Ledger.read(runs, trial.name).lines)]
    for pod in pods.pods_of(trial.name):
        entry = process_of(runs.testbed, runs.namespace, pod)
        log = Path(entry["log"]) if entry else None
        lines += ["", f"log of {pod}:", log.read_text(errors="replace")[-20000:] if log and log.exists() else "-"]
    directory.mkdir(parents=True, exist_ok=True)
    (directory / f"{trial.name}-{int(trial.paused_at)}.txt").write_text("\n".join(lines) + "\n")


def test_paused_runner_wakes_fenced_and_writes_nothing(start_operator: StartOperator, runs: RunEnv,
                                                       pods: PodRecorder, tally: Tally) -> None:
    operator = start_operator()
    timeline = RunTimeline(runs.testbed, runs.namespace)
    recordings = os.environ.get("FAULT_RECORD")
    rng = seeded("runner paused past its lease")
    trials = failures = 0
    failed: list[str] = []
    batch = 0
    while trials < TRIALS:
        batch += 1
        paused = [Paused(f"p{batch}-{i}", ("during-next-attempt", "after-finish")[i % 2],
                         torture_input(f"p{batch}-{i}", rounds=4))
                  for i in range(min(PARALLEL, TRIALS - trials))]
        roots, threads = {}, []
        for trial in paused:
            runs.apply(manifest(runs, trial.name, input=trial.input, policy=POLICY,
                                snapshot_every=3 if len(roots) % 2 else None))
            roots[trial.name] = run_root("runs", runs.namespace, trial.name, runs.get(trial.name)["metadata"]["uid"])
            threads.append(threading.Thread(target=drive, args=(runs, pods, trial, rng, roots[trial.name])))
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        for trial in paused:
            if trial.pod is None and trial.error is None:
                continue
            trials += 1
            verdict = "passed"
            try:
                if trial.error:
                    raise trial.error
                check_trial(runs, pods, trial, roots[trial.name])
            except AssertionError as error:
                failures += 1
                verdict = f"FAILED: {error}"
                failed.append(f"{trial.name} ({trial.mode}, paused {trial.pod}): {error}\n"
                              f"  {history(runs, pods, trial)}")
            later = [p for p in pods.pods_of(trial.name) if p != trial.pod]
            # Recorded: a failure, and every trial where a later attempt ended other than done or waiting.
            if recordings and (verdict != "passed" or any((pods.ending(p) or {}).get("exitCode") not in (0, 4)
                                                          for p in later)):
                record(Path(recordings), runs, pods, timeline, trial, roots[trial.name],
                       f"{verdict}; operator log {operator.process.log_path}")
    timeline.stop()
    tally.add("runner paused past its lease, then continued", trials, failures)
    print(f"runner paused past its lease: {trials} trials, {failures} failures")
    assert not failed, "\n".join(failed)
