"""A run with no pod is first decided on the watch's body alone; it is read again only to act (pure logic).

The API is a recorder here: what is under test is which reads the reconciler makes, the reason an operator
(re)starting with 100,000 waiting runs costs the API server nothing per run (bench/RESULTS.md, section 4).
"""

from __future__ import annotations

import asyncio
import copy
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from durablerun import api
from durablerun_operator.config import Settings
from durablerun_operator.reconciler import Reconciler

NOW = datetime.now(UTC)


def at(seconds: float) -> str:
    return api.format_time(NOW + timedelta(seconds=seconds))


def run(phase: str, **status: Any) -> dict[str, Any]:
    return {
        "metadata": {"namespace": "ns", "name": "run", "uid": "u1", "generation": 1, "resourceVersion": "7",
                     "finalizers": [api.RUN_FINALIZER], "annotations": {}},
        "spec": {"workflow": "m:f", "checkpoint": {"uri": "s3://bucket/runs"},
                 "template": {"spec": {"containers": [{"name": "runner", "image": "runner:1"}]}}},
        "status": {"phase": phase, "epoch": 1, "attempt": 1, "pod": "run-a1", "startTime": at(-600),
                   "inputHash": api.input_hash({}), "observedGeneration": 1, "outcome": "Waiting",
                   "lastPodEndTime": at(-500), **status},
    }


WAITING = run("Waiting", waitingFor={"event": "go", "since": at(-500)})


def fresh(seconds: float) -> str:
    """A time relative to the moment a test runs, not to the module's import (xdist may run it much later)."""
    return api.format_time(datetime.now(UTC) + timedelta(seconds=seconds))


def pod(name: str, epoch: int = 1) -> dict[str, Any]:
    """A runner pod as the pod watch delivers it: running since a minute ago."""
    return {"metadata": {"namespace": "ns", "name": name, "uid": f"uid-{name}", "managedFields": [{"manager": "x"}],
                         "labels": {api.LABEL_RUN: "run", api.LABEL_EPOCH: str(epoch)},
                         "finalizers": [api.POD_FINALIZER]},
            "spec": {"containers": [{"name": "runner"}]},
            "status": {"phase": "Running", "containerStatuses": [
                {"name": "runner", "state": {"running": {"startedAt": fresh(-60)}}}]}}


def running() -> dict[str, Any]:
    """A Running run whose attempt renewed its lease a second ago."""
    return run("Running", outcome=None, lastPodEndTime=None, startTime=fresh(-600),
               lease={"holder": "run-a1", "epoch": 1, "acquireTime": fresh(-55), "renewTime": fresh(-1)})


class Recorder:
    """The API as the reconciler sees it: the run as stored, and every call made."""

    def __init__(self, stored: dict[str, Any], pods: list[dict[str, Any]] | None = None) -> None:
        self.stored, self.pods = stored, pods or []
        self.calls: list[str] = []

    def get_run(self, namespace: str, name: str) -> dict[str, Any]:
        self.calls.append("get_run")
        return copy.deepcopy(self.stored)

    def list_pods(self, namespace: str, name: str) -> list[dict[str, Any]]:
        self.calls.append("list_pods")
        return copy.deepcopy(self.pods)

    def patch_status(self, namespace: str, name: str, ops: list[dict[str, Any]]) -> dict[str, Any]:
        self.calls.append("patch_status")
        for op in ops:
            if op["op"] == "add":
                self.stored["status"][op["path"].split("/")[-1]] = op["value"]
        self.stored["metadata"]["resourceVersion"] = str(int(self.stored["metadata"]["resourceVersion"]) + 1)
        return copy.deepcopy(self.stored)

    def post_event(self, *_: Any, **__: Any) -> None:
        self.calls.append("post_event")

    def __getattr__(self, name: str) -> Any:
        def stop(*_: Any, **__: Any) -> None:  # what comes after the reads and the status write: not under test
            self.calls.append(name)
            raise Stop(name)
        return stop


class Stop(Exception):
    pass


def decide_once(reconciler: Reconciler) -> None:
    async def once() -> None:
        assert await reconciler.reconcile("ns", "run")
        for timer in reconciler.schedule.timers.values():
            timer.cancel()

    asyncio.run(once())


def watched(reconciler: Reconciler, body: dict[str, Any]) -> None:
    """The watch delivers ``body`` (in the event loop, as kopf calls the handler)."""
    async def deliver() -> None:
        reconciler.run_changed(body)
        for timer in reconciler.schedule.timers.values():
            timer.cancel()

    asyncio.run(deliver())


def test_a_waiting_run_seen_by_the_watch_settles_at_sight_with_no_read_and_nothing_held() -> None:
    kube = Recorder(copy.deepcopy(WAITING))
    reconciler = Reconciler(kube, Settings())  # type: ignore[arg-type]
    watched(reconciler, copy.deepcopy(WAITING))
    assert kube.calls == []
    assert ("ns", "run") in reconciler.schedule.settled
    assert not reconciler.queue.busy(("ns", "run"))  # no reconcile to come
    assert reconciler.schedule.first_look == {}  # no body kept: 100,000 of them were gigabytes


def test_a_run_with_a_pod_is_read_before_it_is_decided() -> None:
    kube = Recorder(copy.deepcopy(WAITING))
    reconciler = Reconciler(kube, Settings())  # type: ignore[arg-type]
    reconciler.pod_changed("ns", "run", pod("run-a1"))  # the pod watch saw one: the look cannot say "no pod"
    watched(reconciler, copy.deepcopy(WAITING))
    assert ("ns", "run") not in reconciler.schedule.settled
    decide_once(reconciler)
    assert kube.calls == ["get_run"]  # its pods are the pod watch's (a LIST only to act: below)


def test_a_pod_seen_after_the_run_settled_at_sight_has_it_read_again() -> None:
    kube = Recorder(copy.deepcopy(WAITING))
    reconciler = Reconciler(kube, Settings())  # type: ignore[arg-type]
    watched(reconciler, copy.deepcopy(WAITING))
    reconciler.pod_changed("ns", "run", pod("run-a1"))
    reconciler.pod_changed("ns", "run", pod("run-a1"), deleted=True)  # gone again: still, the look predates it
    assert reconciler.queue.busy(("ns", "run"))
    decide_once(reconciler)
    assert kube.calls == ["get_run"]  # its pods are the pod watch's (a LIST only to act: below)


def test_a_run_being_reconciled_is_not_decided_at_sight() -> None:
    kube = Recorder(copy.deepcopy(WAITING))
    reconciler = Reconciler(kube, Settings())  # type: ignore[arg-type]
    reconciler.queue.add(("ns", "run"))  # queued (a resync, a timer): its reconcile reads it
    watched(reconciler, copy.deepcopy(WAITING))
    assert ("ns", "run") not in reconciler.schedule.settled
    decide_once(reconciler)
    assert kube.calls == ["get_run"]  # its pods are the pod watch's (a LIST only to act: below)


def test_a_run_that_must_act_is_decided_again_on_fresh_reads_and_acts_on_those() -> None:
    # The watched body has the run's event: the look says act; the plan is applied only after reading it.
    body = copy.deepcopy(WAITING)
    body["spec"]["events"] = {"go": {"ok": True}}
    kube = Recorder(copy.deepcopy(body))
    reconciler = Reconciler(kube, Settings())  # type: ignore[arg-type]
    watched(reconciler, body)
    assert kube.calls == []
    assert reconciler.queue.busy(("ns", "run"))
    with pytest.raises(Stop):
        decide_once(reconciler)
    assert kube.calls[:3] == ["get_run", "list_pods", "patch_status"], kube.calls
    assert kube.stored["status"]["phase"] == api.Phase.RUNNING  # its next attempt starts


def test_a_running_run_woken_by_its_pod_is_decided_on_the_watched_pods_with_no_list() -> None:
    # A pod event (scheduled, started, its finalizer patched) of a run that goes on as it is: one GET, no LIST.
    kube = Recorder(running(), pods=[pod("run-a1")])
    reconciler = Reconciler(kube, Settings())  # type: ignore[arg-type]
    reconciler.pod_changed("ns", "run", pod("run-a1"))
    decide_once(reconciler)
    assert kube.calls == ["get_run"]
    assert ("ns", "run") in reconciler.schedule.settled
    assert "managedFields" not in reconciler.executor.pods.get(("ns", "run"))[0]["metadata"]


def test_a_watched_pod_set_that_would_move_the_run_is_listed_before_anything_is_done() -> None:
    # The watch has not delivered attempt 1's pod yet (or delivered its deletion late): no pod, a running run, so
    # the watched pods say "restart". The LIST finds it running: nothing moves, and the cache now has it.
    kube = Recorder(running(), pods=[pod("run-a1")])
    reconciler = Reconciler(kube, Settings())  # type: ignore[arg-type]
    reconciler.pod_changed("ns", "run", pod("run-a1"))
    reconciler.pod_changed("ns", "run", pod("run-a1"), deleted=True)
    decide_once(reconciler)
    assert kube.calls == ["get_run", "list_pods"]
    assert kube.stored["status"]["phase"] == api.Phase.RUNNING
    assert [p["metadata"]["name"] for p in reconciler.executor.pods.get(("ns", "run"))] == ["run-a1"]


def test_the_resync_lists_in_pages_and_decides_each_page_before_reading_the_next() -> None:
    # 100,000 runs in one LIST were gigabytes parsed at once; a page at a time, the operator holds one page.
    pages = {None: ("p1", 2), "p1": ("p2", 2), "p2": (None, 1)}
    reads: list[tuple[str | None, int]] = []  # (the page's token, runs settled when it was asked for)

    class Pages(Recorder):
        def list_runs_page(self, namespace: str | None, token: str | None) -> tuple[list[dict[str, Any]], str | None]:
            reads.append((token, len(reconciler.schedule.settled)))
            if len(reads) == 4:  # the next resync began: the first one is over
                done.set()
            following, count = pages[token]
            runs = []
            for i in range(count):
                body = copy.deepcopy(WAITING)
                body["metadata"]["name"] = f"run-{token}-{i}"
                runs.append(body)
            return runs, following

    kube = Pages(copy.deepcopy(WAITING))
    reconciler = Reconciler(kube, Settings(resync_seconds=0.01))  # type: ignore[arg-type]

    done = asyncio.Event()

    async def one_resync() -> None:
        task = asyncio.create_task(reconciler.resync_forever())
        await done.wait()
        task.cancel()
        for timer in reconciler.schedule.timers.values():
            timer.cancel()

    asyncio.run(asyncio.wait_for(one_resync(), 10))
    assert reads == [(None, 0), ("p1", 2), ("p2", 4), (None, 5)]
    assert kube.calls == []  # waiting runs with no pod: settled at sight
