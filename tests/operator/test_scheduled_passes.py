"""One pass over a DurableRunSchedule (durablerun_operator.scheduled) against a stand-in for kube, no test bed:
the order it acts in, a create refused with 409 told as nothing new, its runs' changes that wake it and those
that do not, and its timer at the next tick; the work queue's urgent lane, which the timers use. The test
bed's test_schedules.py proves the same end to end."""

from __future__ import annotations

import asyncio
import copy
from datetime import timedelta
from typing import Any

import pytest

from durablerun import api, schedules
from durablerun_operator import builders, scheduled
from durablerun_operator.workqueue import Calls, WorkQueue


class StandIn:
    """What the pass reads and writes, in memory; ``calls`` in the order they were made."""

    def __init__(self, schedule: dict[str, Any]) -> None:
        self.schedule = schedule
        self.runs: dict[str, dict[str, Any]] = {}
        self.calls: list[tuple[str, str]] = []
        self.refuse_creates = False

    def get_schedule(self, namespace: str, name: str) -> dict[str, Any] | None:
        return copy.deepcopy(self.schedule)

    def list_scheduled_runs(self, namespace: str, schedule: str) -> list[dict[str, Any]]:
        return [copy.deepcopy(r) for r in self.runs.values()]

    def create_run(self, run: dict[str, Any]) -> bool:
        self.calls.append(("create", run["metadata"]["name"]))
        if self.refuse_creates or run["metadata"]["name"] in self.runs:
            return False
        self.runs[run["metadata"]["name"]] = {**run, "metadata": {**run["metadata"], "uid": "r-uid",
                                                                  "creationTimestamp": api.format_time(api.now())}}
        return True

    def merge_patch_run(self, namespace: str, name: str, patch: dict[str, Any]) -> None:
        self.calls.append(("abort", name))

    def delete_run(self, namespace: str, name: str, uid: str) -> None:
        self.calls.append(("delete", name))

    def patch_schedule_status(self, namespace: str, name: str, status: dict[str, Any]) -> None:
        self.calls.append(("status", status["lastScheduleTime"] or ""))
        self.schedule["status"] = status

    def post_schedule_event(self, schedule: dict[str, Any], kind: str, reason: str, message: str) -> None:
        self.calls.append(("event", reason))


def a_schedule(**spec: Any) -> dict[str, Any]:
    return {"metadata": {"name": "digest", "namespace": "team", "uid": "s-uid",
                         "creationTimestamp": api.format_time(api.now() - timedelta(minutes=5))},
            "spec": {"schedule": "* * * * *", "runTemplate": {"spec": {"workflow": "digest:run",
                                                                       "checkpoint": {"uri": "s3://b/p"}}}, **spec}}


def one_pass(kube: StandIn) -> tuple[scheduled.ScheduledRuns, float]:
    """One pass, in a loop of its own (closed after): the pass and the seconds its timer was set for."""
    async def body() -> tuple[scheduled.ScheduledRuns, float]:
        runs = scheduled.ScheduledRuns(kube, Calls(100, 100, 2))
        await runs.reconcile(("team", "digest"))
        timer = runs._timers.get(("team", "digest"))
        return runs, (timer.when() - asyncio.get_running_loop().time()) if timer else -1.0

    return asyncio.run(body())


def test_a_due_tick_creates_its_run_then_writes_the_status_then_tells_and_sets_a_timer() -> None:
    kube = StandIn(a_schedule())
    _, timer = one_pass(kube)
    (name,) = kube.runs
    assert [c[0] for c in kube.calls] == ["create", "status", "event"]
    assert kube.calls[2] == ("event", "RunCreated")
    assert kube.runs[name]["metadata"]["ownerReferences"][0]["uid"] == "s-uid"
    assert kube.schedule["status"]["lastScheduleTime"] == kube.runs[name]["metadata"]["annotations"][
        api.ANNOTATION_SCHEDULED_TIME]
    assert 0 < timer <= 61  # at the next tick

    # Looked at again: the tick's run is there and nothing is created; the status gets the run's uid, once.
    kube.calls.clear()
    one_pass(kube)
    assert [c[0] for c in kube.calls] == ["status"]
    assert kube.schedule["status"]["active"][0]["uid"] == "r-uid"
    kube.calls.clear()
    one_pass(kube)
    assert kube.calls == []


def test_a_create_refused_as_existing_is_the_tick_fired_before_and_tells_nothing() -> None:
    kube = StandIn(a_schedule())
    kube.refuse_creates = True
    one_pass(kube)
    assert [c[0] for c in kube.calls] == ["create", "status"]


def test_replace_aborts_before_it_creates() -> None:
    kube = StandIn(a_schedule(concurrencyPolicy="Replace"))
    old = builders.scheduled_run(kube.schedule, api.now() - timedelta(minutes=3))
    old["metadata"]["uid"] = "old-uid"
    old["metadata"]["ownerReferences"][0]["uid"] = "s-uid"
    old["status"] = {"phase": "Running"}
    kube.runs[old["metadata"]["name"]] = old
    one_pass(kube)
    assert [c[0] for c in kube.calls] == ["abort", "create", "status", "event", "event"]


def test_runs_of_another_schedule_of_that_name_are_not_its_own() -> None:
    kube = StandIn(a_schedule(concurrencyPolicy="Forbid"))
    stranger = builders.scheduled_run(kube.schedule, api.now() - timedelta(minutes=3))
    stranger["metadata"]["ownerReferences"][0]["uid"] = "an-earlier-schedule"
    stranger["status"] = {"phase": "Running"}
    kube.runs[stranger["metadata"]["name"]] = stranger
    one_pass(kube)
    assert ("event", "RunCreated") in kube.calls  # Forbid did not count the stranger as its own running run


def test_a_runs_phase_change_wakes_its_schedule_and_a_renewal_does_not() -> None:
    runs = scheduled.ScheduledRuns(StandIn(a_schedule()), Calls(100, 100, 2))
    body = builders.scheduled_run(a_schedule(), api.now())
    body["status"] = {"phase": "Running"}
    runs.run_changed(body)
    assert runs.queue.busy(("team", "digest"))
    runs.queue = type(runs.queue)()
    body["status"]["lease"] = {"renewTime": "later"}
    runs.run_changed(body)
    assert not runs.queue.busy(("team", "digest"))
    body["status"]["phase"] = "Succeeded"
    runs.run_changed(body)
    assert runs.queue.busy(("team", "digest"))
    other = {"metadata": {"name": "x", "namespace": "team", "labels": {}}}
    runs.queue = type(runs.queue)()
    runs.run_changed(other)
    assert not runs.queue.busy(("team", "x"))
    assert schedules.run_selector("digest").endswith("=digest")


def test_a_schedule_whose_tick_is_due_is_served_before_those_its_runs_changes_queued(
        monkeypatch: pytest.MonkeyPatch) -> None:
    async def body() -> list[tuple[str, str]]:
        runs, timed = scheduled.ScheduledRuns(StandIn(a_schedule()), Calls(100, 100, 2)), asyncio.Event()
        add = runs.queue.add

        def told(key: tuple[str, str], urgent: bool = False) -> None:
            add(key, urgent)
            timed.set()

        for schedule in ("a", "b"):  # runs of a and b changed phase
            run = builders.scheduled_run({**a_schedule(), "metadata": {**a_schedule()["metadata"],
                                                                       "name": schedule}}, api.now())
            run["status"] = {"phase": "Running"}
            runs.run_changed(run)
        monkeypatch.setattr(runs.queue, "add", told)
        runs._wake(("team", "ticking"), 0)  # its timer: the tick is due
        await asyncio.wait_for(timed.wait(), 10)
        return [await runs.queue.get() for _ in range(3)]

    assert asyncio.run(body()) == [("team", "ticking"), ("team", "a"), ("team", "b")]


def test_the_urgent_lane_keeps_one_entry_and_one_worker_per_key() -> None:
    async def body() -> list[tuple[str, str]]:
        queue = WorkQueue()
        a, b, c = ("ns", "a"), ("ns", "b"), ("ns", "c")
        queue.add(a)
        queue.add(b)
        queue.add(b, urgent=True)  # moves ahead; still once
        queue.add(b)  # already ahead: stays there
        served = [await queue.get()]
        queue.add(b, urgent=True)  # while b is worked on: after it is done, and once
        queue.add(c)
        served.append(await queue.get())
        queue.done(b)
        served.append(await queue.get())
        served.append(await queue.get())
        queue.done(a)
        queue.done(b)
        queue.done(c)
        assert not any(queue.busy(key) for key in (a, b, c))
        return served

    assert asyncio.run(body()) == [("ns", "b"), ("ns", "a"), ("ns", "b"), ("ns", "c")]
