"""The runner pods of a test's namespace: a recorder of every pod ever created and how each ended, and the
process node's entry for a pod's runner."""

from __future__ import annotations

import threading
import time
from datetime import datetime
from pathlib import Path
from typing import Any

from durablerun import api
from durablerun_testbed import procs
from durablerun_testbed.testbed import TestBed
from tests.helpers.runs import RunEnv


class PodRecorder:
    """Watches the namespace's pods and records every pod ever created: uid and how it ended."""

    def __init__(self, testbed: TestBed, namespace: str) -> None:
        from kubernetes import client

        self.core = client.CoreV1Api(testbed.api_client())
        self.namespace = namespace
        self.uids: dict[str, set[str]] = {}
        self.endings: dict[str, dict[str, Any]] = {}  # pod name -> terminated state of its runner
        self.starts: dict[str, datetime] = {}  # pod name -> when its runner's container started (the node says)
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
                started = api.parse_time(((status.get("state") or {}).get("running") or {}).get("startedAt"))
                if started is not None:
                    self.starts.setdefault(meta["name"], started)
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

    def started(self, pod: str) -> datetime | None:
        with self._lock:
            return self.starts.get(pod)

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


def process_of(testbed: TestBed, namespace: str, pod: str) -> dict[str, Any] | None:
    """The process node's entry for the pod's runner, while the node still knows it."""
    assert testbed.node
    return next((p for p in testbed.node.processes() if p["pod"] == f"{namespace}/{pod}"), None)


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
