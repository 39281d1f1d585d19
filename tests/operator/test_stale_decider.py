"""An operator deciding on a stale read of a run never creates the pod of an attempt that is over.

Two operators that both decide a run (two replicas during a deploy, or a
split brain) race: one reads the run, the other moves it to its next attempt
and deletes the old attempt's pod, and then the first lists the pods. It sees
its attempt's pod missing, as it would if its creation had been interrupted.
Creating that pod again is the one action the operator takes without a status
write, so it is guarded like one: the run's epoch and phase are tested by the
API server just before the create, and a run moved on refuses it.
"""

from __future__ import annotations

import asyncio
import copy
import json
from typing import Any

import pytest

from durablerun import api
from durablerun_operator.config import Settings
from durablerun_operator.kube import Kube
from durablerun_operator.reconciler import Reconciler
from tests.operator.helpers import RunEnv

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
    runs.testbed.kubectl("patch", "dr", name, "-n", runs.namespace, "--subresource=status", "--type=merge",
                         "-p", json.dumps({"status": status}))
    return runs.get(name)


def test_an_operator_that_read_the_run_before_it_moved_on_does_not_recreate_the_old_attempts_pod(
        runs: RunEnv) -> None:
    runs.apply(runs.manifest("moved", "optest_flows:steps", {"steps": 1}))
    runs.testbed.kubectl("patch", "dr", "moved", "-n", runs.namespace, "--type=merge", "-p",
                         json.dumps({"metadata": {"finalizers": [api.RUN_FINALIZER]}}))
    # Attempt 2's pod was created and ended before its runner took the lease (an OOM kill at start, say) ...
    now = api.format_time(api.now())
    stale = set_status(runs, "moved", {
        "phase": "Running", "epoch": 2, "attempt": 2, "restarts": 1, "pod": "moved-a2", "startTime": now,
        "attemptStartTime": now, "inputHash": api.input_hash({"steps": 1}), "observedGeneration": 1,
        "lease": {}})
    # ... so the other operator restarted the run (epoch 3) and deleted moved-a2; this one read the run before.
    set_status(runs, "moved", {"epoch": 3, "attempt": 3, "restarts": 2, "pod": "moved-a3"})

    reconciler = Reconciler(ReadBefore(runs.testbed.api_client(), stale), Settings(runner_image="runner:test"))
    assert asyncio.run(reconciler.reconcile(runs.namespace, "moved"))

    pods = [p["metadata"]["name"] for p in json.loads(runs.testbed.kubectl(
        "get", "pods", "-n", runs.namespace, "-l", f"{api.LABEL_RUN}=moved", "-o", "json").stdout)["items"]]
    assert pods == ["moved-a3"], f"the stale decision created a pod of attempt 2, which is over: {pods}"
