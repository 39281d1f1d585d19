"""Passes over a DurableRunSchedule (durablerun_operator.scheduled) against a stand-in for kube, no test bed:
the order a pass acts in, a create refused with 409 told as nothing new, its runs' changes that wake it and
those that do not, its timer at the next tick; what it reads (a LIST of its runs at its first pass only, never
the schedule: the watches tell both) and how it stays right without reading (its own creates and deletes, a
watch that tells a schedule's older version after the pass wrote its status, a run deleted during the LIST);
and the work queue's urgent lane, which puts a tick's pass ahead of passes queued by runs' changes. The test
bed's test_schedules.py proves the same end to end."""

from __future__ import annotations

import asyncio
import copy
import itertools
from collections.abc import Callable
from datetime import datetime, timedelta
from typing import Any

import pytest

from durablerun import api, schedules
from durablerun_operator import builders, scheduled
from durablerun_operator.workqueue import Calls, WorkQueue

KEY = ("team", "digest")


class StandIn:
    """What the passes read and write, in memory; ``calls`` (writes) and ``reads`` in the order they were made.

    The watches tell nothing by themselves: a test tells the pass (``schedule_changed``, ``run_changed``) what
    they would, when it wants."""

    def __init__(self, schedule: dict[str, Any]) -> None:
        self.schedule = schedule
        self.runs: dict[str, dict[str, Any]] = {}
        self.calls: list[tuple[str, str]] = []
        self.reads: list[tuple[str, str]] = []
        self.refuse_creates = False
        self.fail_creates = 0
        self.during_list: Callable[[], None] = lambda: None
        self._versions = itertools.count(2)

    def get_schedule(self, namespace: str, name: str) -> dict[str, Any] | None:
        self.reads.append(("get", name))  # not Kube's any more: a pass that called it would be seen here
        return copy.deepcopy(self.schedule)

    def list_scheduled_runs(self, namespace: str, schedule: str) -> list[dict[str, Any]]:
        self.reads.append(("list", schedule))
        listed = [copy.deepcopy(r) for r in self.runs.values()]
        self.during_list()
        return listed

    def create_run(self, run: dict[str, Any]) -> dict[str, Any] | None:
        self.calls.append(("create", run["metadata"]["name"]))
        if self.fail_creates:
            self.fail_creates -= 1
            raise RuntimeError("the API server is away")
        if self.refuse_creates or run["metadata"]["name"] in self.runs:
            return None
        made = {**run, "metadata": {**run["metadata"], "uid": "r-uid",
                                    "creationTimestamp": api.format_time(api.now())}}
        self.runs[run["metadata"]["name"]] = made
        return copy.deepcopy(made)

    def merge_patch_run(self, namespace: str, name: str, patch: dict[str, Any]) -> dict[str, Any] | None:
        self.calls.append(("abort", name))
        run = self.runs[name]
        run["metadata"].setdefault("annotations", {}).update(patch["metadata"]["annotations"])
        return copy.deepcopy(run)

    def delete_run(self, namespace: str, name: str, uid: str) -> None:
        self.calls.append(("delete", name))
        self.runs.pop(name, None)

    def patch_schedule_status(self, namespace: str, name: str, status: dict[str, Any]) -> dict[str, Any] | None:
        self.calls.append(("status", status["lastScheduleTime"] or ""))
        self.schedule["status"] = status
        self.schedule["metadata"]["resourceVersion"] = str(next(self._versions))
        return copy.deepcopy(self.schedule)

    def post_schedule_event(self, schedule: dict[str, Any], kind: str, reason: str, message: str) -> None:
        self.calls.append(("event", reason))


def a_schedule(**spec: Any) -> dict[str, Any]:
    return {"metadata": {"name": "digest", "namespace": "team", "uid": "s-uid", "resourceVersion": "1",
                         "creationTimestamp": api.format_time(api.now() - timedelta(minutes=5))},
            "spec": {"schedule": "* * * * *", "runTemplate": {"spec": {"workflow": "digest:run",
                                                                       "checkpoint": {"uri": "s3://b/p"}}}, **spec}}


def a_run(schedule: dict[str, Any], tick: datetime, phase: api.Phase | None, uid: str = "old-uid") -> dict[str, Any]:
    run = builders.scheduled_run(schedule, tick)
    run["metadata"]["uid"] = uid
    run["metadata"]["ownerReferences"][0]["uid"] = schedule["metadata"]["uid"]
    if phase is not None:
        run["status"] = {"phase": phase}
    return run


def operator(kube: StandIn) -> scheduled.ScheduledRuns:
    """A freshly started operator's schedules, told the schedule by its watch (as kopf does at start)."""
    runs = scheduled.ScheduledRuns(kube, Calls(100, 100, 2))
    runs.schedule_changed(copy.deepcopy(kube.schedule))
    return runs


def one_pass(kube: StandIn, runs: scheduled.ScheduledRuns | None = None) -> tuple[scheduled.ScheduledRuns, float]:
    """One pass (of a freshly started operator unless ``runs``), in a loop of its own (closed after): the
    pass's ScheduledRuns and the seconds its timer was set for."""
    runs = runs or operator(kube)

    async def body() -> float:
        await runs.reconcile(KEY)
        timer = runs._timers.get(KEY)
        return (timer.when() - asyncio.get_running_loop().time()) if timer else -1.0

    return runs, asyncio.run(body())


@pytest.fixture
def clock(monkeypatch: pytest.MonkeyPatch) -> list[datetime]:
    """``api.now`` reads ``clock[0]``: a test moves it to the next tick."""
    now = [api.now()]
    monkeypatch.setattr(api, "now", lambda: now[0])
    return now


def test_a_due_tick_creates_its_run_then_writes_the_status_then_tells_and_sets_a_timer() -> None:
    kube = StandIn(a_schedule())
    runs, timer = one_pass(kube)
    (name,) = kube.runs
    assert [c[0] for c in kube.calls] == ["create", "status", "event"]
    assert kube.calls[2] == ("event", "RunCreated")
    assert kube.runs[name]["metadata"]["ownerReferences"][0]["uid"] == "s-uid"
    assert kube.schedule["status"]["lastScheduleTime"] == kube.runs[name]["metadata"]["annotations"][
        api.ANNOTATION_SCHEDULED_TIME]
    assert 0 < timer <= 61  # at the next tick

    # Looked at again (the watches told nothing yet): the run it created is there and nothing is created; the
    # status gets the run's uid, once.
    kube.calls.clear()
    one_pass(kube, runs)
    assert [c[0] for c in kube.calls] == ["status"]
    assert kube.schedule["status"]["active"][0]["uid"] == "r-uid"
    kube.calls.clear()
    one_pass(kube, runs)
    assert kube.calls == []
    # So does a freshly started operator, which lists the run.
    one_pass(kube)
    assert kube.calls == []


def test_the_first_pass_lists_and_a_tick_pass_after_it_reads_nothing(clock: list[datetime]) -> None:
    kube = StandIn(a_schedule())
    runs, _ = one_pass(kube)
    assert kube.reads == [("list", "digest")]
    first = kube.calls[0][1]

    # The next tick: the timer's pass creates its run, having read neither the schedule nor the runs.
    kube.calls.clear()
    clock[0] += timedelta(minutes=1)
    one_pass(kube, runs)
    assert kube.reads == [("list", "digest")]
    (second,) = set(kube.runs) - {first}
    assert kube.calls == [("create", second), ("status", kube.runs[second]["metadata"]["annotations"][
        api.ANNOTATION_SCHEDULED_TIME]), ("event", "RunCreated")]

    # The schedule's watch tells the status written; its runs' watch tells the first run finished: still no read.
    runs.schedule_changed(copy.deepcopy(kube.schedule))
    done = copy.deepcopy(kube.runs[first])
    done["status"] = {"phase": api.Phase.SUCCEEDED, "completionTime": api.format_time(clock[0])}
    runs.run_changed(done)
    kube.calls.clear()
    one_pass(kube, runs)
    assert kube.reads == [("list", "digest")]
    assert [c[0] for c in kube.calls] == ["status"]
    assert kube.schedule["status"]["lastSuccessfulTime"] == api.format_time(clock[0])


def test_the_first_pass_after_start_lists_the_runs_the_watch_has_not_told() -> None:
    kube = StandIn(a_schedule(concurrencyPolicy="Forbid"))
    running = a_run(kube.schedule, api.now() - timedelta(minutes=3), api.Phase.RUNNING)
    kube.runs[running["metadata"]["name"]] = running
    one_pass(kube)
    assert kube.reads == [("list", "digest")]
    assert ("create", schedules.run_name("digest", api.now().replace(second=0, microsecond=0))) not in kube.calls
    assert ("event", "RunAlreadyActive") in kube.calls  # Forbid counted the run only the LIST told


def test_a_run_deleted_while_the_first_pass_lists_stays_deleted() -> None:
    kube = StandIn(a_schedule(concurrencyPolicy="Forbid"))
    running = a_run(kube.schedule, api.now() - timedelta(minutes=3), api.Phase.RUNNING)
    kube.runs[running["metadata"]["name"]] = running
    runs = operator(kube)
    runs.run_changed(copy.deepcopy(running))

    def deleted_meanwhile() -> None:  # the LIST saw it; the watch tells its deletion before the LIST returns
        kube.runs.pop(running["metadata"]["name"])
        loop.call_soon_threadsafe(runs.run_changed, copy.deepcopy(running), True)

    async def body() -> None:
        nonlocal loop
        loop = asyncio.get_running_loop()
        await runs.reconcile(KEY)

    loop: asyncio.AbstractEventLoop
    kube.during_list = deleted_meanwhile
    asyncio.run(body())
    assert ("event", "RunCreated") in kube.calls  # Forbid held by nothing: the deleted run is not believed


def test_a_run_deleted_by_the_watch_no_longer_holds_forbid() -> None:
    kube = StandIn(a_schedule(concurrencyPolicy="Forbid"))
    running = a_run(kube.schedule, api.now() - timedelta(minutes=3), api.Phase.RUNNING)
    kube.runs[running["metadata"]["name"]] = running
    runs, _ = one_pass(kube)
    assert ("event", "RunAlreadyActive") in kube.calls
    runs.schedule_changed(copy.deepcopy(kube.schedule))
    del kube.runs[running["metadata"]["name"]]
    runs.run_changed(copy.deepcopy(running), deleted=True)
    kube.calls.clear()
    one_pass(kube, runs)
    assert kube.reads == [("list", "digest")]
    assert ("event", "RunCreated") in kube.calls


def test_an_older_schedule_told_after_the_status_was_written_does_not_fire_the_tick_again() -> None:
    kube = StandIn(a_schedule(successfulRunsHistoryLimit=0))
    told = copy.deepcopy(kube.schedule)  # resourceVersion 1, no status
    runs, _ = one_pass(kube)
    (name,) = kube.runs
    # The run finished and went (history limit 0); the schedule's watch tells, late, the version before the
    # pass's status write.
    del kube.runs[name]
    runs.run_changed(kube_run := a_run(kube.schedule, api.parse_time(
        kube.schedule["status"]["lastScheduleTime"]), api.Phase.SUCCEEDED), deleted=True)
    assert kube_run["metadata"]["name"] == name
    runs.schedule_changed(told)
    kube.calls.clear()
    one_pass(kube, runs)
    assert ("create", name) not in kube.calls
    # The watch tells the write: from then on its version is believed.
    runs.schedule_changed(copy.deepcopy(kube.schedule))
    assert not runs._written
    one_pass(kube, runs)
    assert ("create", name) not in kube.calls


def test_a_pass_that_failed_lists_again(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(scheduled, "BACKOFF_SECONDS", 0.01)
    kube = StandIn(a_schedule())
    kube.fail_creates = 1

    async def body() -> None:
        runs, passes, second = operator(kube), [], asyncio.Event()
        done = runs.queue.done

        def counted(key: tuple[str, str]) -> None:
            done(key)
            passes.append(key)
            if len(passes) == 2:
                second.set()

        monkeypatch.setattr(runs.queue, "done", counted)
        worker = asyncio.create_task(runs._worker())
        await asyncio.wait_for(second.wait(), 10)  # the failed pass, then its retry after the backoff
        worker.cancel()

    asyncio.run(body())
    assert [c[0] for c in kube.calls] == ["create", "create", "status", "event"]
    assert kube.reads == [("list", "digest"), ("list", "digest")]


def test_a_create_refused_as_existing_is_the_tick_fired_before_and_tells_nothing() -> None:
    kube = StandIn(a_schedule())
    kube.refuse_creates = True
    one_pass(kube)
    assert [c[0] for c in kube.calls] == ["create", "status"]


def test_replace_aborts_before_it_creates() -> None:
    kube = StandIn(a_schedule(concurrencyPolicy="Replace"))
    old = a_run(kube.schedule, api.now() - timedelta(minutes=3), api.Phase.RUNNING)
    kube.runs[old["metadata"]["name"]] = old
    one_pass(kube)
    assert [c[0] for c in kube.calls] == ["abort", "create", "status", "event", "event"]


def test_runs_of_another_schedule_of_that_name_are_not_its_own() -> None:
    kube = StandIn(a_schedule(concurrencyPolicy="Forbid"))
    stranger = a_run(kube.schedule, api.now() - timedelta(minutes=3), api.Phase.RUNNING)
    stranger["metadata"]["ownerReferences"][0]["uid"] = "an-earlier-schedule"
    kube.runs[stranger["metadata"]["name"]] = stranger
    runs, _ = one_pass(kube)
    assert ("event", "RunCreated") in kube.calls  # Forbid did not count the stranger as its own running run
    # Nor when the watch tells it.
    runs.run_changed(copy.deepcopy(stranger))
    kube.calls.clear()
    one_pass(kube, runs)
    assert [c[0] for c in kube.calls] == ["status"]  # the created run's uid; nothing of the stranger's


def test_a_runs_phase_change_wakes_its_schedule_and_a_renewal_does_not() -> None:
    runs = scheduled.ScheduledRuns(StandIn(a_schedule()), Calls(100, 100, 2))
    body = builders.scheduled_run(a_schedule(), api.now())
    body["status"] = {"phase": "Running"}
    runs.run_changed(copy.deepcopy(body))  # each watch event its own body
    assert runs.queue.busy(KEY)
    runs.queue = type(runs.queue)()
    body["status"]["lease"] = {"renewTime": "later"}
    runs.run_changed(copy.deepcopy(body))  # each watch event its own body
    assert not runs.queue.busy(KEY)
    body["status"]["phase"] = "Succeeded"
    runs.run_changed(copy.deepcopy(body))  # each watch event its own body
    assert runs.queue.busy(KEY)
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


def test_a_run_the_pass_deleted_is_not_deleted_again_before_the_watch_tells() -> None:
    kube = StandIn(a_schedule(successfulRunsHistoryLimit=0))
    done = a_run(kube.schedule, api.now() - timedelta(minutes=3), api.Phase.SUCCEEDED)
    kube.runs[done["metadata"]["name"]] = done
    runs, _ = one_pass(kube)
    assert ("delete", done["metadata"]["name"]) in kube.calls
    kube.calls.clear()
    one_pass(kube, runs)
    assert [c[0] for c in kube.calls] == ["status"]  # the created run's uid; no delete, no RunDeleted again


def test_a_resyncs_older_run_is_not_believed_and_the_next_pass_lists() -> None:
    kube = StandIn(a_schedule(concurrencyPolicy="Forbid"))
    running = a_run(kube.schedule, api.now() - timedelta(minutes=3), api.Phase.RUNNING)
    running["metadata"]["resourceVersion"] = "5"
    runs = operator(kube)
    runs.run_changed(copy.deepcopy(running))
    # The watch tells it finished; then the resync's LIST, read before that, tells it running.
    done = copy.deepcopy(running)
    done["metadata"]["resourceVersion"] = "6"
    done["status"] = {"phase": api.Phase.SUCCEEDED, "completionTime": api.format_time(api.now())}
    kube.runs[done["metadata"]["name"]] = done
    runs.run_changed(copy.deepcopy(done))
    runs._listed.add(KEY)  # its first pass was long ago
    runs.run_changed(copy.deepcopy(running), relisted=True)
    one_pass(kube, runs)
    assert kube.reads == [("list", "digest")]
    assert ("event", "RunCreated") in kube.calls  # Forbid held by nothing: the run finished
    # A resync that agrees with the watch costs nothing.
    runs.run_changed(copy.deepcopy(done), relisted=True)
    kube.calls.clear()
    one_pass(kube, runs)
    assert kube.reads == [("list", "digest")]
