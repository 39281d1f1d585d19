"""What the reconciler does between a run's wake-ups, and with a mass lease expiry (pure logic, a stub API).

The API is a stub: what is under test is when the reconciler decides a run
(never on a fixed period), how it retries a failed reconcile without a resync,
and that it holds a lease-only restart while many leases are late at once.
tests/operator/test_overload.py proves the hold on the test bed.
"""

from __future__ import annotations

import asyncio
import copy
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from prometheus_client import CollectorRegistry

from durablerun import api
from durablerun_operator import decide, metrics, overload
from durablerun_operator.config import Settings
from durablerun_operator.reconciler import Reconciler
from durablerun_operator.workqueue import Calls, RateLimiter
from tests.operator.reconciler_runs import RUN, at

WAITING: dict[str, Any] = {
    **RUN, "status": {**RUN["status"], "phase": "Waiting", "pod": "run-a1", "lease": {},
                      "waitingFor": {"event": "approve", "since": at(-10)}},
}


def live_pod() -> dict[str, Any]:
    return {"metadata": {"name": "run-a2", "uid": "p1", "labels": {api.LABEL_RUN: "run", api.LABEL_EPOCH: "2"},
                         "finalizers": [api.POD_FINALIZER]},
            "spec": {"containers": [{"name": "runner"}]},
            "status": {"phase": "Running", "containerStatuses": [
                {"name": "runner", "state": {"running": {
                    "startedAt": api.format_time(datetime.now(UTC) - timedelta(seconds=50))}}}]}}


class Stub:
    """The API as the reconciler sees it, counting calls; ``fail`` GETs raise first."""

    def __init__(self, run: dict[str, Any], pods: list[dict[str, Any]], fail: int = 0) -> None:
        self.run, self.pods, self.fail = copy.deepcopy(run), pods, fail
        self.gets = self.patches = 0
        self.events: list[tuple[str, str]] = []

    def get_run(self, namespace: str, name: str) -> dict[str, Any]:
        self.gets += 1
        if self.fail:
            self.fail -= 1
            raise ConnectionResetError("the API server went away")
        return copy.deepcopy(self.run)

    def list_pods(self, namespace: str, name: str) -> list[dict[str, Any]]:
        return copy.deepcopy(self.pods)

    def list_children(self, namespace: str, name: str) -> list[dict[str, Any]]:
        return []

    def patch_status(self, namespace: str, name: str, ops: list[dict[str, Any]]) -> dict[str, Any]:
        self.patches += 1
        return copy.deepcopy(self.run)

    def post_event(self, body: dict[str, Any], kind: str, reason: str, message: str) -> None:
        self.events.append((reason, message))

    def delete_pod(self, namespace: str, name: str) -> None:
        pass

    release_pod = delete_pod


def test_a_relisted_version_of_a_settled_run_costs_no_decision() -> None:
    kube = Stub(WAITING, [])
    rec = Reconciler(kube, Settings())  # type: ignore[arg-type]

    async def scenario() -> None:
        assert await rec.reconcile("ns", "run")
        for _ in range(3):  # kopf re-lists on every watch restart, the resync every interval
            rec.run_changed(copy.deepcopy(WAITING))
        assert rec.queue._queue.qsize() == 0
        # Its event arrives: a new version, decided at once.
        rec.run_changed({**copy.deepcopy(WAITING), "metadata": {**WAITING["metadata"], "resourceVersion": "8"},
                         "spec": {**WAITING["spec"], "events": {"approve": True}}})
        assert rec.queue._queue.qsize() == 1

    asyncio.run(scenario())
    assert kube.gets == 1


def test_a_failed_reconcile_is_retried_after_a_backoff_without_any_resync() -> None:
    kube = Stub(WAITING, [], fail=2)
    rec = Reconciler(kube, Settings(resync_seconds=3600))  # type: ignore[arg-type]

    async def scenario() -> None:
        workers = asyncio.create_task(rec.run_workers())
        rec.queue.add(("ns", "run"))
        deadline = asyncio.get_running_loop().time() + 10
        while ("ns", "run") not in rec.schedule.settled:
            assert asyncio.get_running_loop().time() < deadline, "the failed reconcile was not retried"
            await asyncio.sleep(0.02)
        workers.cancel()

    asyncio.run(scenario())
    assert kube.gets == 3  # two failures (0.5 s, then 1 s later), then the reconcile that settled it


def test_the_rate_limiter_lets_a_burst_through_then_paces_at_qps() -> None:
    clock = [0.0]
    limiter = RateLimiter(qps=10, burst=3, clock=lambda: clock[0])
    assert [limiter.reserve() for _ in range(3)] == [0.0, 0.0, 0.0]
    assert [round(limiter.reserve(), 3) for _ in range(2)] == [0.1, 0.2]
    clock[0] = 10.0  # a lull refills the bucket, up to the burst
    assert [limiter.reserve() for _ in range(3)] == [0.0, 0.0, 0.0]


def test_an_urgent_call_goes_before_the_calls_that_wait_with_it_and_the_pace_holds() -> None:
    """The schedules' calls are urgent: one that comes while others wait for the rate limiter goes first; the
    others keep their order, and all of them together keep to the limiter's pace."""
    calls = Calls(qps=20, burst=1, threads=1)
    sent: list[tuple[str, float]] = []

    async def scenario() -> None:
        loop = asyncio.get_running_loop()
        start = loop.time()

        def send(name: str) -> None:
            sent.append((name, loop.time() - start))

        waiting = [asyncio.ensure_future(calls(send, f"run-{i}")) for i in range(4)]
        await asyncio.sleep(0)  # run-0 took the one token; the others wait
        waiting.append(asyncio.ensure_future(calls(send, "tick", urgent=True)))
        await asyncio.gather(*waiting)

    asyncio.run(scenario())
    assert [name for name, _ in sent] == ["run-0", "tick", "run-1", "run-2", "run-3"]
    assert sent[-1][1] >= 4 / 20 - 0.01  # four calls past the burst, at 20 a second


def expired() -> dict[str, Any]:
    """A run whose lease lapsed 70 s ago, stamped now: times fixed at import would, 10 minutes into a
    full test session, also exceed the default progressTimeout and abort the run instead."""
    now = datetime.now(UTC)

    def ago(seconds: float) -> str:
        return api.format_time(now - timedelta(seconds=seconds))

    return {**RUN, "status": {**RUN["status"], "startTime": ago(200),
                              "lease": {"holder": "run-a2", "epoch": 2, "acquireTime": ago(200),
                                        "renewTime": ago(100), "durationSeconds": 30}}}


def late_leases(rec: Reconciler, late: int, fresh: int) -> None:
    """Other active runs, as the watch showed them: ``late`` leases renewed 100 s ago, ``fresh`` ones just now."""
    now = datetime.now(UTC)
    for i in range(late):
        rec.holds.leases[("ns", f"late-{i}")] = overload.Lease(now - timedelta(seconds=100), timedelta(seconds=32), 1)
    for i in range(fresh):
        rec.holds.leases[("ns", f"fresh-{i}")] = overload.Lease(now, timedelta(seconds=32), 1)


def test_a_lease_restart_is_held_during_a_mass_expiry_and_reported() -> None:
    registry = CollectorRegistry()
    kube = Stub(expired(), [live_pod()])
    rec = Reconciler(kube, Settings(), metrics.RunMetrics(registry, version="test"))  # type: ignore[arg-type]
    late_leases(rec, late=50, fresh=10)

    async def scenario() -> None:
        assert await rec.reconcile("ns", "run")
        assert await rec.reconcile("ns", "run")  # decided again (a timer, say): still held, told once

    asyncio.run(scenario())
    assert kube.patches == 0
    assert [reason for reason, _ in kube.events] == ["LeaseExpiryHeld"]
    assert "51 of 61 active runs" in kube.events[0][1]
    assert registry.get_sample_value("durablerun_mass_lease_expiry") == 1.0
    assert registry.get_sample_value("durablerun_lease_restarts_held") == 1.0


def not_acquired() -> dict[str, Any]:
    """A run whose attempt 2 started its container (live_pod) 50 s ago on a 30 s lease and never acquired it."""
    run = expired()
    run["spec"] = {**run["spec"], "policy": {**run["spec"].get("policy", {}), "leaseDuration": "30s"}}
    run["status"]["lease"] = {}
    return run


def reconciled(run: dict[str, Any], late: int, fresh: int, **settings: Any) -> tuple[Stub, Reconciler]:
    """``run`` reconciled once, its pod live, among ``late`` late and ``fresh`` fresh leases of other runs."""
    kube = Stub(run, [live_pod()])
    rec = Reconciler(kube, Settings(**settings))  # type: ignore[arg-type]
    late_leases(rec, late=late, fresh=fresh)
    asyncio.run(rec.reconcile("ns", "run"))
    return kube, rec


# Runners started together on a starved node acquire late, as renewals behind a slow API server do: a lease not
# yet acquired counts from its container's start (50 s ago, past its 32 s), and is held or restarted alike.
@pytest.mark.parametrize("run", [expired, not_acquired], ids=["renewal-late", "never-acquired"])
@pytest.mark.parametrize(("late", "fresh", "held"), [(50, 10, True), (3, 500, False)], ids=["many-late", "alone"])
def test_a_late_lease_is_held_when_many_are_late_and_restarted_at_once_when_alone(
        run: Callable[[], dict[str, Any]], late: int, fresh: int, held: bool) -> None:
    kube, _ = reconciled(run(), late, fresh)
    reasons = [reason for reason, _ in kube.events]
    if held:
        assert kube.patches == 0
        assert reasons == ["LeaseExpiryHeld"]
        assert "51 of 61 active runs" in kube.events[0][1]
    else:
        assert kube.patches >= 1
        assert "LeaseExpired" in reasons
        assert "LeaseExpiryHeld" not in reasons


def test_a_start_not_acquired_counts_from_its_container_and_a_watch_event_keeps_that() -> None:
    kube, rec = reconciled(not_acquired(), late=50, fresh=10)
    started = rec.holds.leases[("ns", "run")]
    assert (started.epoch, started.validity) == (2, timedelta(seconds=30) + decide.CLOCK_SKEW_MARGIN)
    # A watch event of the same attempt, which carries no pods, keeps the start read with them.
    rec.executor.observe(decide.RunView.from_body(kube.run), datetime.now(UTC))
    assert rec.holds.leases[("ns", "run")] == started


def test_the_hold_is_off_when_the_fraction_is_zero() -> None:
    kube, _ = reconciled(expired(), late=500, fresh=0, mass_expiry_fraction=0)
    assert kube.patches >= 1


QUEUED: dict[str, Any] = {
    **RUN,
    "metadata": {**RUN["metadata"], "labels": {api.LABEL_QUEUE_NAME: "lq", api.LABEL_PRIORITY_CLASS: "urgent"}},
    "status": {**RUN["status"], "phase": "Queued", "lease": {}},
}


class KueueStub(Stub):
    """A cluster where the run's WorkloadPriorityClass does not exist and it has no Workload yet."""

    def get_workload(self, namespace: str, name: str) -> None:
        return None

    def get_cluster_object(self, plural: str, name: str) -> None:
        return None

    def patch_status(self, namespace: str, name: str, ops: list[dict[str, Any]]) -> dict[str, Any]:
        """The status as the patch leaves it, so the run settles."""
        for op in ops:
            key = op["path"].removeprefix("/status/")
            if op["op"] == "add":
                self.run["status"][key] = op["value"]
            elif op["op"] == "remove":
                self.run["status"].pop(key, None)
        return super().patch_status(namespace, name, ops)


def test_a_queued_run_whose_priority_class_is_missing_is_looked_at_again_and_decided_on_a_label_fix() -> None:
    kube = KueueStub(QUEUED, [])
    rec = Reconciler(kube, Settings(kueue=True))  # type: ignore[arg-type]

    async def scenario() -> None:
        loop = asyncio.get_running_loop()
        assert await rec.reconcile("ns", "run")
        assert [reason for reason, _ in kube.events] == ["PriorityClassNotFound"]
        # Nothing watches the classes: a class created later is seen within PRIORITY_CLASS_RECHECK (30 s).
        assert 25 < rec.schedule.timers[("ns", "run")].when() - loop.time() <= 31
        # A new version of the run (its label fixed) is decided at once, though a Queued run's own versions
        # otherwise wait for its Workload.
        fixed = copy.deepcopy(QUEUED)
        fixed["metadata"].update(resourceVersion="8", labels={api.LABEL_QUEUE_NAME: "lq"})
        rec.run_changed(fixed)
        assert rec.queue._queue.qsize() == 1

    asyncio.run(scenario())
