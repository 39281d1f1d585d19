"""What the fault suite's tests share: trial counts and seeds, the torture workflow's uncrashed reference, a
timeline of who holds a run, and the checks of a runner woken after its lease lapsed.

What other folders share with it (manifests, the ledger, the pod recorder, metrics, the journal checks) is in
``tests.helpers``; its fixtures come from ``tests.helpers.bed`` (a namespace with its own operator, a bucket,
a credentials Secret and a ledger directory).
"""

from __future__ import annotations

import json
import os
import random
import re
import threading
import time
import uuid
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

from durablerun import api
from durablerun._private.records.layout import LOGS_DIR
from durablerun.engine import Run
from durablerun.stores import RunRef, open_store
from durablerun_testbed.testbed import TestBed
from tests.helpers.fault_workflows import torture_flows
from tests.helpers.journal_checks import Journal
from tests.helpers.pods import PodRecorder, process_of
from tests.helpers.runs import RunEnv, events

#: The payload that lets the torture workflow past its wait.
GO = {"approved": True}


def trials_of_each_kind(ci: int) -> int:
    """How many trials a fault kind gets: ``FAULT_TRIALS`` when set (``make faults``: 120 of each kind),
    else ``ci``, the bounded slice ``make test`` runs."""
    return int(os.environ.get("FAULT_TRIALS") or ci)


def seeded(name: str) -> random.Random:
    """A random source whose seed is printed, so a failing trial can be replayed (FAULT_SEED=...)."""
    seed = int(os.environ.get("FAULT_SEED") or random.SystemRandom().randrange(1 << 32))
    print(f"{name}: FAULT_SEED={seed}")
    return random.Random(seed)


def fenced_by_the_fencing(ending: dict[str, Any] | None, paused_attempt: str | None, journal: Any) -> bool:
    """Whether a later attempt's ending (its pod's terminated state) was the fencing's doing: it exited Fenced
    because its own lease lapsed, or because its journal write was refused (412) at a position the paused
    attempt's record holds (``journal``: a ``tests.helpers.journal_checks.Journal``)."""
    if not ending or ending.get("exitCode") != api.Outcome.FENCED.exit_code:
        return False
    why = str(json.loads(ending.get("message") or "{}").get("message") or "")
    if "lapsed without renewal" in why:
        return True
    refused = re.search(r"412 Precondition Failed\) \[.*key=.*/journal/(\d+)\.json", why)
    return bool(refused and paused_attempt is not None
                and journal.records.get(int(refused.group(1)), {}).get("w") == paused_attempt)


def running_pod(runs: RunEnv, name: str) -> str | None:
    """The run's current pod if its runner process is running now."""
    status = runs.get(name).get("status") or {}
    pod = status.get("pod")
    if status.get("phase") != "Running" or not pod:
        return None
    entry = process_of(runs.testbed, runs.namespace, pod)
    return pod if entry and entry["running"] else None


def finished(runs: RunEnv, name: str) -> bool:
    return (runs.get(name).get("status") or {}).get("phase") in ("Succeeded", "Failed", "Aborted")


def check_woken_fenced(ending: dict[str, Any], log: Path, paused_at: float) -> None:
    """A runner woken after its lease lapsed exits Fenced (5). Two exceptions, both having done nothing since
    the pause: one frozen before any of its own code ran (the interpreter still starting) dies of its pod's
    SIGTERM (143); one frozen after its attempt had ended (the outcome written, the process exiting) exits
    with that outcome."""
    output = log.read_text(errors="replace") if log.exists() else ""
    if ending["exitCode"] == 143 and not output.strip():
        return
    finished = [json.loads(line) for line in output.splitlines() if line.startswith('{"time"') and
                '"run_finished"' in line]
    if finished and ending["exitCode"] != 5:
        at = datetime.fromisoformat(finished[-1]["time"].replace("Z", "+00:00")).timestamp()
        assert at < paused_at, f"the woken runner finished its attempt after the pause: {ending}"
        assert json.loads(ending["message"])["outcome"] == finished[-1]["outcome"], ending
        return
    assert ending["exitCode"] == 5, f"the woken runner did not exit Fenced: {ending}\n{output[-3000:]}"
    assert json.loads(ending["message"])["outcome"] == "Fenced", ending


@dataclass
class Paused:
    name: str
    mode: str  # "during-next-attempt" or "after-finish"
    input: dict[str, Any]
    pod: str | None = None
    attempt_id: str | None = None
    paused_at: float = 0.0
    continued_at: float = 0.0
    listing_before: dict[str, str] = field(default_factory=dict)
    listing_after: dict[str, str] = field(default_factory=dict)
    status_before: dict[str, Any] = field(default_factory=dict)
    status_after: dict[str, Any] = field(default_factory=dict)
    exit: dict[str, Any] | None = None
    log: str = ""
    error: BaseException | None = None


def check_woken_and_silent(runs: RunEnv, pods: PodRecorder, trial: Paused, root: str, journal: Journal) -> None:
    """A runner paused past its lease, then woken (``trial``; its run's store under ``root``, ``journal`` read
    after the wake-up): it exits Fenced, journals nothing it began after the pause and records no outcome
    after it; woken after the run finished, not one object and not the status change. The expired lease is
    counted as the run's restarts, and no pod ran twice in an epoch."""
    assert runs.testbed.s3
    assert trial.exit, "the continued runner did not end"
    check_woken_fenced(trial.exit, Path(trial.log), trial.paused_at)
    if trial.mode == "after-finish":
        # Not one object changes. The exceptions: a snapshot that was under way when the runner froze may finish
        # writing its chunks, but they stay unreferenced (the pointer has moved on and its swap is refused), so
        # nothing reads them; and the pod's log shipper may store the woken runner's last lines (its "fenced"),
        # as new parts of the attempt's own logs: never an object that was there, never run state.
        changed = {k for k, v in trial.listing_after.items() if trial.listing_before.get(k) != v}
        referenced = {c["key"] for c in (journal.pointer or {}).get("chunks", [])}
        orphans = {k for k in changed if (k.startswith("chunks/") and k not in referenced)
                   or (k.startswith(LOGS_DIR) and k not in trial.listing_before)}
        assert changed == orphans, f"the fenced runner changed the store after waking: {sorted(changed - orphans)}"
        assert set(trial.listing_before) <= set(trial.listing_after), "the fenced runner removed objects"
        assert trial.status_after == trial.status_before, "the fenced runner changed the run's status after waking"
    # What the paused runner wrote, it wrote before the pause (a write under way when it froze may land).
    late = [seq for seq, r in journal.records.items()
            if trial.attempt_id and r["w"] == trial.attempt_id and r["at"] >= trial.paused_at]
    assert not late, f"the paused runner journaled {late} after it was paused"
    # The outcome record may be the paused runner's only if it wrote it before the pause (it had finished).
    s3 = runs.testbed.s3.client()
    outcome = json.loads(s3.get_object(Bucket=runs.bucket, Key=root + "status.json")["Body"].read())["body"]
    if trial.attempt_id is not None and outcome.get("attempt") == trial.attempt_id:
        written = datetime.fromisoformat(outcome["time"].replace("Z", "+00:00")).timestamp()
        assert written < trial.paused_at, f"the fenced runner recorded an outcome after the pause: {outcome}"
    # The expired lease is counted once, as LeaseExpired; no other restart, no pod twice per epoch.
    status = runs.get(trial.name)["status"]
    pods.check_one_pod_per_epoch(trial.name, status["attempt"])
    seen = events(runs, trial.name)
    assert seen["LeaseExpired"] >= 1, seen
    assert seen["Restarting"] == status["restarts"], seen


def reference(input: dict[str, Any], tmp: Path) -> tuple[Any, Any]:
    """The result and totals of the same workflow run once, uncrashed, in this process."""
    store = open_store(f"memory://reference-{uuid.uuid4().hex}")
    ref = RunRef.local("reference")
    if input.get("waitRound") is not None:
        store.put_event(run=ref, name="go", payload=GO)
    result = Run(store=store, run=ref, workflow=torture_flows.torture,
                 input={**input, "ledger": str(tmp / f"reference-{uuid.uuid4().hex}.txt"), "pace": 0}).run_attempt()
    assert result.outcome == api.Outcome.COMPLETED, result.message
    return result.result, result.totals


class RunTimeline:
    """Watches the namespace's DurableRuns and records, with the time seen, every change of who holds a run:
    phase, epoch, pod, lease holder and renewal. A fault trial's lease timeline, for its recording."""

    def __init__(self, testbed: TestBed, namespace: str) -> None:
        from kubernetes import client

        self.custom = client.CustomObjectsApi(testbed.api_client())
        self.namespace = namespace
        self.lines: dict[str, list[str]] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name=f"runs-{namespace}", daemon=True)
        self._thread.start()

    def _record(self, run: dict[str, Any]) -> None:
        status = run.get("status") or {}
        lease = status.get("lease") or {}
        line = (f"{api.format_time(time.time(), precise=True)} {status.get('phase')} epoch={status.get('epoch')} "
                f"pod={status.get('pod')} lease={lease.get('holder')}@{lease.get('epoch')} "
                f"renewed={lease.get('renewTime')} restarts={status.get('restarts')} "
                f"step={(status.get('progress') or {}).get('step')}")
        lines = self.lines.setdefault(run["metadata"]["name"], [])
        if not lines or lines[-1].split(" ", 1)[1] != line.split(" ", 1)[1]:
            lines.append(line)

    def _loop(self) -> None:
        from kubernetes import watch

        while not self._stop.is_set():
            try:
                for event in watch.Watch().stream(self.custom.list_namespaced_custom_object, api.GROUP,
                                                  api.VERSION, self.namespace, api.PLURAL, timeout_seconds=5):
                    if event["type"] in ("ADDED", "MODIFIED"):
                        self._record(event["object"])
                    if self._stop.is_set():
                        break
            except Exception:  # the API server restarting: watch again
                time.sleep(0.2)

    def of(self, name: str) -> list[str]:
        return list(self.lines.get(name, []))

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=10)
