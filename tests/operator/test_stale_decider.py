"""An operator deciding on a stale read of a run never creates the pod of an attempt that is over.

Two operators that both decide a run (two replicas during a deploy, or a
split brain) race: one reads the run, the other moves it on, and then the
first lists the pods. If the other ended the attempt and deleted its pod, the
first sees that pod missing, as if its creation had been interrupted, and
would create it again; if the other started the next attempt, the first sees
a pod no attempt it knows owns, and would delete it. Neither action changes
the status, so neither had a guarded write before it. Both are guarded like
one now: the run's epoch and phase are tested by the API server just before,
and a run moved on refuses them.
"""

from __future__ import annotations

import asyncio
import copy
import json
from datetime import timedelta
from typing import Any

import pytest

from durablerun import api
from durablerun_operator.config import Settings
from durablerun_operator.kube import Kube
from durablerun_operator.reconciler import Reconciler
from tests.helpers.runs import RunEnv

pytestmark = pytest.mark.testbed


class ReadBefore(Kube):
    """The real API, but the first read of the run returns ``stale``: the run as read before a second operator
    moved it on."""

    def __init__(self, api_client: Any, stale: dict[str, Any]) -> None:
        super().__init__(api_client)
        self.stale: dict[str, Any] | None = stale

    def get_run(self, namespace: str, name: str) -> dict[str, Any] | None:
        stale, self.stale = self.stale, None
        return copy.deepcopy(stale) if stale is not None else super().get_run(namespace, name)


def set_status(runs: RunEnv, name: str, status: dict[str, Any]) -> dict[str, Any]:
    runs.patch_status(name, status)
    return runs.get(name)


def create_run(runs: RunEnv) -> None:
    """The run "moved", its finalizer in place, whose pods no node will run (they stay Pending)."""
    manifest = runs.manifest("moved", "optest_flows:steps", {"steps": 1})
    manifest["spec"]["template"]["spec"]["nodeSelector"] = {"durablerun.dev/test": "no-such-node"}
    runs.apply(manifest)
    runs.testbed.kubectl("patch", "dr", "moved", "-n", runs.namespace, "--type=merge", "-p",
                         json.dumps({"metadata": {"finalizers": [api.RUN_FINALIZER]}}))


def pods(runs: RunEnv) -> dict[str, dict[str, Any]]:
    return {p["metadata"]["name"]: p for p in json.loads(runs.testbed.kubectl(
        "get", "pods", "-n", runs.namespace, "-l", f"{api.LABEL_RUN}=moved", "-o", "json").stdout)["items"]}


def test_an_operator_that_read_the_run_before_it_moved_on_does_not_recreate_the_old_attempts_pod(
        runs: RunEnv) -> None:
    create_run(runs)
    # Attempt 2's pod was created and ended before its runner took the lease (an OOM kill at start, say) ...
    now = api.format_time(api.now())
    stale = set_status(runs, "moved", {
        "phase": "Running", "epoch": 2, "attempt": 2, "restarts": 1, "pod": "moved-a2", "startTime": now,
        "attemptStartTime": now, "inputHash": api.input_hash({"steps": 1}), "observedGeneration": 1,
        "lease": {}})
    # ... so the other operator restarted the run (epoch 3) and deleted moved-a2; this one read the run before.
    version = set_status(runs, "moved", {"epoch": 3, "attempt": 3, "restarts": 2, "pod": "moved-a3"})[
        "metadata"]["resourceVersion"]

    reconciler = Reconciler(ReadBefore(runs.testbed.api_client(), stale), Settings(runner_image="runner:test"))
    assert asyncio.run(reconciler.reconcile(runs.namespace, "moved"))
    # Refused on the stale read, then, on a fresh one, moved-a3 created (its create had not happened): both
    # guards were test ops alone, which write nothing (no new version of the run for every watcher to read).
    assert runs.get("moved")["metadata"]["resourceVersion"] == version

    assert list(pods(runs)) == ["moved-a3"], "the stale decision created a pod of attempt 2, which is over"


def test_an_operator_that_read_the_run_before_its_next_attempt_started_does_not_delete_that_attempts_pod(
        runs: RunEnv) -> None:
    create_run(runs)
    # Attempt 2 ended and the run waits out its backoff at epoch 3 ...
    now = api.now()
    stale = set_status(runs, "moved", {
        "phase": "Backoff", "epoch": 3, "attempt": 2, "restarts": 1, "pod": "moved-a2",
        "startTime": api.format_time(now), "nextAttemptTime": api.format_time(now + timedelta(minutes=5)),
        "inputHash": api.input_hash({"steps": 1}), "observedGeneration": 1, "lease": {}})
    # ... until the other operator, at the backoff's end, starts attempt 3; this one read the run before.
    set_status(runs, "moved", {"nextAttemptTime": api.format_time(now - timedelta(seconds=1))})
    settings = Settings(runner_image="runner:test")
    assert asyncio.run(Reconciler(Kube(runs.testbed.api_client()), settings).reconcile(runs.namespace, "moved"))
    started = pods(runs)
    assert list(started) == ["moved-a3"], started
    assert runs.get("moved")["status"]["phase"] == "Running"

    assert asyncio.run(Reconciler(ReadBefore(runs.testbed.api_client(), stale), settings).reconcile(
        runs.namespace, "moved"))
    after = pods(runs)["moved-a3"]
    assert after["metadata"]["uid"] == started["moved-a3"]["metadata"]["uid"]
    assert "deletionTimestamp" not in after["metadata"], "the stale decision deleted the pod of attempt 3"
