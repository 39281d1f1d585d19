"""What the fault, bad-input and security tests share: manifests, a pod recorder, ledgers, metrics.

Built on the operator tests' fixtures (``tests.operator.fixtures``): a namespace
with its own operator, a bucket, a credentials Secret and a ledger directory.
"""

from __future__ import annotations

import json
import os
import random
import re
import threading
import time
import urllib.request
import uuid
from collections import Counter
from collections.abc import Callable, Collection
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

from prometheus_client.parser import text_string_to_metric_families

from durablerun import api
from durablerun.engine import Run
from durablerun.stores import RunRef, open_store
from durablerun_testbed import procs
from durablerun_testbed.s3 import S3Server
from durablerun_testbed.testbed import TestBed
from tests.faults.journal import Journal
from tests.faults.workflows import torture_flows
from tests.operator.helpers import WORKFLOWS as OPERATOR_WORKFLOWS
from tests.operator.helpers import Operator, RunEnv

WORKFLOWS = Path(__file__).resolve().parent / "workflows"
LEDGER_MOUNT = "/tmp/ledger"  # where RunEnv mounts the ledger directory in runner pods
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


def manifest(runs: RunEnv, name: str, workflow: str = "torture_flows:torture", input: dict[str, Any] | None = None,
             policy: dict[str, Any] | None = None, snapshot_every: int | None = None, **spec: Any) -> dict[str, Any]:
    """``runs.manifest`` with the fault suite's workflows importable too (and ``checkpoint.snapshotEvery``)."""
    body = runs.manifest(name, workflow, input, policy=policy, **spec)
    if snapshot_every is not None:
        body["spec"]["checkpoint"]["snapshotEvery"] = snapshot_every
    env = body["spec"]["template"]["spec"]["containers"][0]["env"]
    for var in env:
        if var["name"] == "PYTHONPATH":
            var["value"] = f"{WORKFLOWS}:{OPERATOR_WORKFLOWS}"
    return body


@dataclass
class Store:
    """A MinIO of a test's own, a bucket on it and the Secret holding its credentials."""

    server: S3Server
    bucket: str
    secret: str

    def use(self, body: dict[str, Any]) -> dict[str, Any]:
        """Point a DurableRun manifest at this store."""
        body["spec"]["checkpoint"].update(uri=f"s3://{self.bucket}/runs", endpoint=self.server.endpoint_url,
                                          credentialsSecret=self.secret)
        return body


#: The ``dedicated_store`` fixture: ``start(**minio_env)``.
StartStore = Callable[..., Store]


def torture_input(name: str, **extra: Any) -> dict[str, Any]:
    return {"ledger": f"{LEDGER_MOUNT}/{name}.txt", "rounds": 3, "width": 3, "pace": 0.15, **extra}


@dataclass
class Ledger:
    """A run's ledger: ``start|done <step> <pod>`` and ``effect <key> <pod>`` lines."""

    lines: list[tuple[str, str, str]]

    @classmethod
    def read(cls, runs: RunEnv, name: str) -> Ledger:
        path = runs.ledger_dir / f"{name}.txt"
        text = path.read_text() if path.exists() else ""
        return cls([tuple(line.split(" ")) for line in text.splitlines() if line])  # type: ignore[misc]

    def starts(self, step: str) -> list[str]:
        """The pods that started ``step``, one entry per execution."""
        return [pod for kind, name, pod in self.lines if kind == "start" and name == step]

    def effects(self) -> dict[str, list[str]]:
        """Idempotency keys the side-effect steps saw, with the pods that saw them."""
        out: dict[str, list[str]] = {}
        for kind, key, _pod in self.lines:
            if kind == "effect":
                out.setdefault(key.rsplit(":", 1)[1], []).append(key)
        return out


def check_executions(ledger: Ledger, steps: list[str], interrupted: set[str],
                     in_flight: Collection[tuple[str, str]] = ()) -> None:
    """Each step ran at least once, at most once per pod, and every pod but one that ran it was interrupted.

    ``interrupted``: pods the test killed or paused. So a step ran at most
    1 + (the number of kills that caught it in flight) times. ``in_flight``: executions (step, pod) that
    had passed their runner's lease check when the runner froze; such a step runs on when its runner wakes,
    whatever ran since, so where its ledger line falls says nothing (docs/faults.md, "The pause kind's
    failure of 2026-11-26").
    """
    for step in steps:
        pods = ledger.starts(step)
        assert pods, f"step {step} never ran"
        assert len(pods) == len(set(pods)), f"step {step} ran twice in one pod: {pods}"
        uninterrupted = [p for p in pods if p not in interrupted]
        assert len(uninterrupted) <= 1, f"step {step} ran in several pods nobody interrupted: {pods}"
        ordered = [p for p in pods if (step, p) not in in_flight]
        if len(ordered) > 1:
            # All but the last execution were cut short; the last is the journaled one.
            assert set(ordered[:-1]) <= interrupted, f"step {step} ran again after {ordered[:-1]} completed it"
    for step, keys in ledger.effects().items():
        assert len(set(keys)) == 1, f"side effect {step} saw different idempotency keys: {keys}"


def fenced_by_the_fencing(ending: dict[str, Any] | None, paused_attempt: str | None, journal: Any) -> bool:
    """Whether a later attempt's ending (its pod's terminated state) was the fencing's doing: it exited Fenced
    because its own lease lapsed, or because its journal write was refused (412) at a position the paused
    attempt's record holds (``journal``: a ``tests.faults.journal.Journal``)."""
    if not ending or ending.get("exitCode") != api.Outcome.FENCED.exit_code:
        return False
    why = str(json.loads(ending.get("message") or "{}").get("message") or "")
    if "lapsed without renewal" in why:
        return True
    refused = re.search(r"412 Precondition Failed\) \[.*key=.*/journal/(\d+)\.json", why)
    return bool(refused and paused_attempt is not None
                and journal.records.get(int(refused.group(1)), {}).get("w") == paused_attempt)


class PodRecorder:
    """Watches the namespace's pods and records every pod ever created: uid and how it ended."""

    def __init__(self, testbed: TestBed, namespace: str) -> None:
        from kubernetes import client

        self.core = client.CoreV1Api(testbed.api_client())
        self.namespace = namespace
        self.uids: dict[str, set[str]] = {}
        self.endings: dict[str, dict[str, Any]] = {}  # pod name -> terminated state of its runner
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self.seen = 0  # watch events, and the last watch error: diagnostics for a timed-out wait
        self.last_error: str | None = None
        self._thread = threading.Thread(target=self._loop, name=f"pods-{namespace}", daemon=True)
        self._thread.start()

    def _record(self, pod: dict[str, Any]) -> None:
        meta = pod["metadata"]
        with self._lock:
            self.uids.setdefault(meta["name"], set()).add(meta["uid"])
            for status in (pod.get("status") or {}).get("containerStatuses") or []:
                terminated = (status.get("state") or {}).get("terminated")
                if terminated:
                    self.endings[meta["name"]] = {"exitCode": terminated.get("exitCode"),
                                                  "reason": terminated.get("reason"),
                                                  "message": terminated.get("message")}

    def _loop(self) -> None:
        from kubernetes import watch

        version: str | None = None
        while not self._stop.is_set():
            try:
                if version is None:
                    listed = self.core.list_namespaced_pod(self.namespace)
                    for pod in listed.items:
                        self._record(self.core.api_client.sanitize_for_serialization(pod))
                    version = listed.metadata.resource_version
                # Resume from the last version seen, so no update between two watches is missed.
                for event in watch.Watch().stream(self.core.list_namespaced_pod, self.namespace,
                                                  resource_version=version, timeout_seconds=5,
                                                  allow_watch_bookmarks=True):
                    raw = event["raw_object"]  # a BOOKMARK's object is not a whole pod: use the raw dicts
                    if event["type"] == "ERROR":
                        raise RuntimeError(f"watch error: {raw}")
                    if event["type"] != "BOOKMARK":
                        self._record(raw)
                        self.seen += 1
                    version = raw["metadata"]["resourceVersion"]
                    if self._stop.is_set():
                        break
            except Exception as error:  # expired version (410) or the API server restarting: list again
                self.last_error = repr(error)[:300]
                version = None
                time.sleep(0.2)

    def pods_of(self, run: str) -> list[str]:
        with self._lock:
            return sorted((p for p in self.uids if p.startswith(f"{run}-a")), key=lambda p: int(p.rsplit("-a", 1)[1]))

    def ending(self, pod: str) -> dict[str, Any] | None:
        with self._lock:
            return self.endings.get(pod)

    def check_one_pod_per_epoch(self, run: str, attempts: int) -> None:
        pods = self.pods_of(run)
        with self._lock:
            recreated = {p: sorted(self.uids[p]) for p in pods if len(self.uids[p]) > 1}
        assert not recreated, f"an attempt's pod was created twice: {recreated}"
        assert len(pods) == attempts, f"{len(pods)} pods for {attempts} attempts: {pods}"

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=10)


def scrape(operator: Operator) -> dict[tuple[str, frozenset[tuple[str, str]]], float]:
    with urllib.request.urlopen(f"http://127.0.0.1:{operator.metrics_port}/metrics", timeout=5) as reply:
        text = reply.read().decode()
    return {(s.name, frozenset(s.labels.items())): s.value
            for family in text_string_to_metric_families(text) for s in family.samples}


def run_metric(samples: dict[tuple[str, frozenset[tuple[str, str]]], float], metric: str, namespace: str,
               name: str, **labels: str) -> float | None:
    key = (metric, frozenset({"namespace": namespace, "name": name, **labels}.items()))
    return samples.get(key)


def events(runs: RunEnv, name: str) -> Counter[str]:
    return Counter(e["reason"] for e in runs.events(name))


def process_of(testbed: TestBed, namespace: str, pod: str) -> dict[str, Any] | None:
    """The process node's entry for the pod's runner, while the node still knows it."""
    assert testbed.node
    return next((p for p in testbed.node.processes() if p["pod"] == f"{namespace}/{pod}"), None)


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


def send_event(runs: RunEnv, name: str, event: str, payload: Any) -> None:
    runs.testbed.kubectl("patch", "dr", name, "-n", runs.namespace, "--type=merge",
                         "-p", json.dumps({"spec": {"events": {event: payload}}}))


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
        # Not one object changes. The one exception is a snapshot that was under way when the runner froze: it
        # may finish writing its chunks, but they stay unreferenced (the pointer has moved on and its swap is
        # refused), so nothing reads them.
        changed = {k for k, v in trial.listing_after.items() if trial.listing_before.get(k) != v}
        referenced = {c["key"] for c in (journal.pointer or {}).get("chunks", [])}
        orphans = {k for k in changed if k.startswith("chunks/") and k not in referenced}
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


def wait_pod_exit(runs: RunEnv, pods: PodRecorder, pod: str, timeout: float = 60) -> dict[str, Any]:
    """How the pod's runner ended, from the pod's status (as the recorder saw it, or read now) or, once
    the pod is gone, from the process node, which keeps each process's exit code and termination message."""

    def ended() -> dict[str, Any] | None:
        seen = pods.ending(pod)
        if seen:
            return seen
        entry = process_of(runs.testbed, runs.namespace, pod)
        if entry and entry["exitCode"] is not None:
            message = Path(entry["log"]).with_suffix(".termination-log")
            return {"exitCode": entry["exitCode"], "reason": "from the process node",
                    "message": message.read_text() if message.exists() else None}
        return None

    try:
        return procs.wait_for(ended, timeout=timeout, what=f"pod {pod} to report how it ended")
    except procs.Timeout as timeout_error:
        raise procs.Timeout(f"{timeout_error} (pod watch: {pods.seen} events, last error {pods.last_error}; "
                            f"pod now: {pods.ending(pod)})") from None


@dataclass
class Tally:
    """Trials and failures per fault, printed at the end of the session."""

    rows: dict[str, list[int]] = field(default_factory=dict)

    def add(self, fault: str, trials: int, failures: int) -> None:
        row = self.rows.setdefault(fault, [0, 0])
        row[0] += trials
        row[1] += failures


TALLY = Tally()


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
