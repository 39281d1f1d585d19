"""Pausing a runner past its lease (SIGSTOP on the process node) and continuing it at a random moment: the
driver of one trial, used by test_pause_fencing.py and test_generated_faults.py."""

from __future__ import annotations

import json
import time
import urllib.error
from pathlib import Path
from typing import Any

from durablerun_testbed import procs
from tests.faults.helpers import Paused, finished, running_pod
from tests.helpers.journal_checks import list_objects
from tests.helpers.pods import PodRecorder, process_of, wait_pod_exit
from tests.helpers.runs import RunEnv


def attempt_id(log: Path) -> str | None:
    for line in log.read_text(errors="replace").splitlines() if log.exists() else []:
        if line.startswith("{") and '"run_started"' in line:
            return str(json.loads(line)["attempt"])
    return None


def pause_a_runner(runs: RunEnv, trial: Paused, rng: Any) -> bool:
    """Pause one of the run's runners at a random moment (``trial.pod``, ``trial.paused_at``); False if
    the run finished first. A runner that ends before its moment (an attempt that reached a wait, or a short program) is
    followed by the run's next one with the moment's window halved, so short attempts are reached too."""
    node = runs.testbed.node
    assert node
    window, missed = 4.0, set[str]()
    while True:
        try:
            pod = str(procs.wait_for(lambda: (p := running_pod(runs, trial.name)) not in missed and p,
                                     timeout=120, what=f"a runner of {trial.name}"))
        except procs.Timeout:
            if finished(runs, trial.name):
                return False  # it ran and finished between two looks (a loaded machine)
            raise
        time.sleep(rng.uniform(0, window))  # the random moment of the pause
        try:
            node.pause(runs.namespace, pod)
            trial.pod, trial.paused_at = pod, time.time()
            return True
        except urllib.error.HTTPError:
            if finished(runs, trial.name):
                return False
            missed.add(pod)
            window /= 2


def drive(runs: RunEnv, pods: PodRecorder, trial: Paused, rng: Any, root: str) -> None:
    node = runs.testbed.node
    assert node
    assert runs.testbed.s3
    s3 = runs.testbed.s3.client()
    try:
        if not pause_a_runner(runs, trial, rng):
            return  # the run finished first: no trial
        pod = trial.pod
        assert pod
        entry = process_of(runs.testbed, runs.namespace, pod)
        assert entry
        epoch = int(pod.rsplit("-a", 1)[1])
        if trial.mode == "during-next-attempt":
            procs.wait_for(lambda: finished(runs, trial.name) or (
                (p := running_pod(runs, trial.name)) is not None and int(p.rsplit("-a", 1)[1]) > epoch),
                timeout=120, what=f"the next attempt of {trial.name} to run")
            time.sleep(rng.uniform(0, 3.0))  # the random moment of the wake-up
        else:
            runs.wait_phase(trial.name, "Succeeded", timeout=180)
        trial.listing_before = list_objects(s3, runs.bucket, root)
        trial.status_before = runs.get(trial.name)["status"]
        trial.continued_at = time.time()
        node.cont(runs.namespace, pod)
        trial.exit = wait_pod_exit(runs, pods, pod, timeout=90)
        trial.listing_after = list_objects(s3, runs.bucket, root)
        trial.status_after = runs.get(trial.name)["status"]
        trial.log = entry["log"]
        trial.attempt_id = attempt_id(Path(entry["log"]))
    except BaseException as error:
        trial.error = error
