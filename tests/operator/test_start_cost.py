"""What starting a run costs the API server, call by call (pure logic: the API is a recorder).

A start is the operator's finalizer on the run, one status write (admitted and started together), the pod and
one Event; the namespace's runner ServiceAccount, Role and RoleBinding are made for its first run only. Reads:
a GET of the run and a LIST of its pods before it acts; the pod it created is known from the API server's
answer, so settling after the start reads nothing (issue 42; the scale bench measures the same on the bed).
"""

from __future__ import annotations

import asyncio
import copy
from typing import Any

from durablerun import api
from durablerun_operator.config import Settings
from durablerun_operator.reconciler import Reconciler


def new_run(name: str) -> dict[str, Any]:
    return {"metadata": {"namespace": "ns", "name": name, "uid": f"uid-{name}", "generation": 1,
                         "resourceVersion": "1", "annotations": {}},
            "spec": {"workflow": "m:f", "checkpoint": {"uri": "s3://bucket/runs"},
                     "template": {"spec": {"containers": [{"name": "runner", "image": "runner:1"}]}}}}


class Recorder:
    """The API server as the operator's client sees it, for runs that start: every call, named."""

    def __init__(self) -> None:
        self.runs: dict[str, dict[str, Any]] = {}
        self.pods: dict[str, list[dict[str, Any]]] = {}
        self.calls: list[str] = []

    def _bump(self, name: str) -> dict[str, Any]:
        meta = self.runs[name]["metadata"]
        meta["resourceVersion"] = str(int(meta["resourceVersion"]) + 1)
        return copy.deepcopy(self.runs[name])

    def get_run(self, namespace: str, name: str) -> dict[str, Any]:
        self.calls.append("GET run")
        return copy.deepcopy(self.runs[name])

    def list_pods(self, namespace: str, name: str) -> list[dict[str, Any]]:
        self.calls.append("LIST pods")
        return copy.deepcopy(self.pods.get(name, []))

    def set_run_finalizer(self, body: dict[str, Any], on: bool) -> dict[str, Any]:
        self.calls.append("PATCH run")
        name = body["metadata"]["name"]
        self.runs[name]["metadata"]["finalizers"] = [api.RUN_FINALIZER]
        return self._bump(name)

    def patch_status(self, namespace: str, name: str, ops: list[dict[str, Any]]) -> dict[str, Any]:
        self.calls.append("PATCH status")
        status = self.runs[name].setdefault("status", {})
        for op in ops:
            if op["op"] == "add" and op["path"] == "/status":
                status.update(op["value"])
            elif op["op"] == "add":
                status[op["path"].split("/")[2]] = op["value"]
        return self._bump(name)

    def ensure(self, obj: dict[str, Any]) -> None:
        self.calls.append(f"CREATE {obj['kind']}")

    def create_pod(self, pod: dict[str, Any]) -> dict[str, Any]:
        self.calls.append("CREATE pod")
        pod["metadata"]["uid"] = f"uid-{pod['metadata']['name']}"
        pod["status"] = {"phase": "Pending"}
        self.pods.setdefault(pod["metadata"]["labels"][api.LABEL_RUN], []).append(pod)
        return copy.deepcopy(pod)

    def post_event(self, body: dict[str, Any], kind: str, reason: str, message: str) -> None:
        self.calls.append(f"POST Event {reason}")


def start(kube: Recorder, reconciler: Reconciler, name: str) -> list[str]:
    kube.runs[name] = new_run(name)
    kube.calls.clear()

    async def once() -> None:
        assert await reconciler.reconcile("ns", name)
        for timer in reconciler.schedule.timers.values():
            timer.cancel()

    asyncio.run(once())
    return list(kube.calls)


def test_a_start_costs_four_writes_one_list_and_the_namespaces_runner_account_is_made_once() -> None:
    kube = Recorder()
    reconciler = Reconciler(kube, Settings())  # type: ignore[arg-type]
    assert start(kube, reconciler, "first") == [
        "GET run", "LIST pods", "PATCH run", "PATCH status",
        "CREATE ServiceAccount", "CREATE Role", "CREATE RoleBinding", "CREATE pod", "POST Event AttemptStarted"]
    assert kube.runs["first"]["status"]["phase"] == api.Phase.RUNNING
    assert start(kube, reconciler, "second") == [
        "GET run", "LIST pods", "PATCH run", "PATCH status", "CREATE pod", "POST Event AttemptStarted"]


def test_per_run_access_makes_each_runs_account() -> None:
    kube = Recorder()
    reconciler = Reconciler(kube, Settings(runner_access=api.RUNNER_ACCESS_RUN))  # type: ignore[arg-type]
    start(kube, reconciler, "first")
    assert start(kube, reconciler, "second").count("CREATE RoleBinding") == 1
