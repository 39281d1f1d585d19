"""The reconciler's counters follow the status write, and failed reconciles are counted (pure logic).

The API is a stub here: what is under test is the order in which the
reconciler applies a plan, which the test bed cannot make fail on demand.
"""

from __future__ import annotations

import asyncio
import copy
import json
from typing import Any

import pytest
from prometheus_client import CollectorRegistry

from durablerun import api
from durablerun_operator import metrics
from durablerun_operator.config import Settings
from durablerun_operator.reconciler import Reconciler
from tests.operator.reconciler_runs import RUN, at


# The runner's pod, ended: Completed (exit 0) or crashed (exit 137).
def ended_pod(exit_code: int, message: str) -> dict[str, Any]:
    return {"metadata": {"name": "run-a2", "uid": "p1", "labels": {api.LABEL_RUN: "run", api.LABEL_EPOCH: "2"},
                         "finalizers": [api.POD_FINALIZER]},
            "spec": {"containers": [{"name": "runner"}]},
            "status": {"phase": "Succeeded" if exit_code == 0 else "Failed", "containerStatuses": [
                {"name": "runner", "state": {"terminated": {
                    "exitCode": exit_code, "message": message, "finishedAt": at(-1)}}}]}}


class EventsFail:
    """The API as the reconciler sees it; every pod call and Event post fails after the status patch."""

    def __init__(self, pod: dict[str, Any]) -> None:
        self.run, self.pod = copy.deepcopy(RUN), pod
        self.patches = 0

    def get_run(self, namespace: str, name: str) -> dict[str, Any]:
        return copy.deepcopy(self.run)

    def list_pods(self, namespace: str, name: str) -> list[dict[str, Any]]:
        return [copy.deepcopy(self.pod)]

    def patch_status(self, namespace: str, name: str, ops: list[dict[str, Any]]) -> dict[str, Any]:
        for op in ops:
            if op["op"] == "add":
                self.run["status"][op["path"].split("/")[-1]] = op["value"]
            elif op["op"] == "remove":
                self.run["status"].pop(op["path"].split("/")[-1], None)
        self.patches += 1
        return copy.deepcopy(self.run)

    def _fail(self, *_: Any) -> None:
        raise ConnectionResetError("the API server went away")

    release_pod = delete_pod = post_event = create_pod = _fail


@pytest.mark.parametrize(("exit_code", "message", "counter", "labels"), [
    (0, json.dumps({"outcome": "Completed", "message": "done"}), "durablerun_run_completions_total",
     {"outcome": "Succeeded"}),
    (137, "", "durablerun_run_restarts_total", {"reason": "Crash"}),
])
def test_a_written_transition_is_counted_even_if_the_calls_after_it_fail(
        exit_code: int, message: str, counter: str, labels: dict[str, str]) -> None:
    registry = CollectorRegistry()
    run_metrics = metrics.RunMetrics(registry, version="test")
    kube = EventsFail(ended_pod(exit_code, message))
    reconciler = Reconciler(kube, Settings(), run_metrics)  # type: ignore[arg-type]
    with pytest.raises(ConnectionResetError):
        asyncio.run(reconciler.reconcile("ns", "run"))
    assert kube.patches == 1
    assert registry.get_sample_value(counter, {"namespace": "ns", "name": "run", **labels}) == 1.0


def test_a_failed_reconcile_counts_as_a_reconcile_error() -> None:
    registry = CollectorRegistry()
    run_metrics = metrics.RunMetrics(registry, version="test")
    kube = EventsFail(ended_pod(0, json.dumps({"outcome": "Completed", "message": "done"})))
    reconciler = Reconciler(kube, Settings(), run_metrics)  # type: ignore[arg-type]

    async def one_failed_reconcile() -> None:
        worker = asyncio.create_task(reconciler.run_workers())
        reconciler.queue.add(("ns", "run"))
        deadline = asyncio.get_running_loop().time() + 10
        while not registry.get_sample_value("durablerun_reconcile_errors_total"):
            assert asyncio.get_running_loop().time() < deadline, "no reconcile error was counted"
            await asyncio.sleep(0.01)
        worker.cancel()

    asyncio.run(one_failed_reconcile())
    assert registry.get_sample_value("durablerun_reconcile_errors_total") == 1.0
