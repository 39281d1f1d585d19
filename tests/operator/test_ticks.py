"""A schedule's decision (durablerun_operator.ticks.decide) as the pure function it is, on plain dicts: the tick
due, missed ticks (at most one catch-up, within startingDeadlineSeconds), a tick that already has its run,
each concurrency policy, suspension, history limits, a bad expression, a time zone with daylight saving."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

from durablerun import api, schedules
from durablerun_operator import builders, ticks

CREATED = datetime(2026, 6, 1, 9, 59, 30, tzinfo=UTC)


def minute(m: int, second: int = 0) -> datetime:
    """10:00 + m minutes (+ seconds) on 2026-06-01, UTC."""
    return datetime(2026, 6, 1, 10, 0, tzinfo=UTC) + timedelta(minutes=m, seconds=second)


def schedule(status: dict[str, Any] | None = None, **spec: Any) -> dict[str, Any]:
    return {
        "metadata": {"name": "digest", "namespace": "team", "uid": "u-1",
                     "creationTimestamp": api.format_time(CREATED)},
        "spec": {"schedule": "* * * * *", "runTemplate": {
            "metadata": {"labels": {api.LABEL_QUEUE_NAME: "team-queue"}},
            "spec": {"workflow": "digest:run", "checkpoint": {"uri": "s3://runs/team"}}}, **spec},
        "status": status or {},
    }


def run(tick: datetime, phase: str | None = None, completed: datetime | None = None,
        aborting: bool = False) -> ticks.RunView:
    body = builders.scheduled_run(schedule(), tick)
    body["metadata"]["uid"] = f"uid-{tick.minute}"
    body["metadata"]["creationTimestamp"] = api.format_time(tick)
    if aborting:
        body["metadata"]["annotations"][api.ANNOTATION_ABORT] = "x"
    body["status"] = {k: v for k, v in {"phase": phase, "completionTime": completed and api.format_time(completed)
                                         }.items() if v}
    return ticks.RunView.from_body(body)


def name(tick: datetime) -> str:
    return schedules.run_name("digest", tick)


def test_nothing_is_due_before_the_first_tick_after_creation() -> None:
    plan = ticks.decide(schedule(), [], minute(0, -10))
    assert plan.create is None
    assert plan.wake == minute(0)
    assert plan.status["nextScheduleTime"] == api.format_time(minute(0))


def test_a_tick_creates_its_run_named_after_it_and_owned_by_the_schedule() -> None:
    plan = ticks.decide(schedule(), [], minute(0, 1))
    assert plan.create == minute(0)
    assert plan.wake == minute(1)
    assert plan.status["lastScheduleTime"] == api.format_time(minute(0))
    assert plan.status["active"] == [{"name": name(minute(0)), "uid": None,
                                      "scheduledTime": api.format_time(minute(0))}]
    assert plan.status["activeCount"] == 1
    body = builders.scheduled_run(schedule(), minute(0))
    assert body["metadata"]["name"] == f"digest-{int(minute(0).timestamp()) // 60}"
    assert body["metadata"]["labels"][api.LABEL_SCHEDULE] == "digest"
    assert body["metadata"]["labels"][api.LABEL_QUEUE_NAME] == "team-queue"  # Kueue applies as to any run
    assert body["metadata"]["annotations"][api.ANNOTATION_SCHEDULED_TIME] == api.format_time(minute(0))
    assert body["metadata"]["ownerReferences"] == [{
        "apiVersion": api.API_VERSION, "kind": api.SCHEDULE_KIND, "name": "digest", "uid": "u-1",
        "controller": True, "blockOwnerDeletion": True}]
    assert body["spec"]["workflow"] == "digest:run"


def test_a_tick_whose_run_exists_is_done_even_if_the_status_never_said_so() -> None:
    # The operator created the run, then stopped before it wrote lastScheduleTime: the tick fired.
    plan = ticks.decide(schedule(), [run(minute(0))], minute(0, 30))
    assert plan.create is None
    assert plan.status["lastScheduleTime"] == api.format_time(minute(0))


def test_missed_ticks_make_at_most_one_catch_up_the_most_recent() -> None:
    status = {"lastScheduleTime": api.format_time(minute(0))}
    plan = ticks.decide(schedule(status), [], minute(7, 20))  # down from 10:00:30 to 10:07:20: 1..7 missed
    assert plan.create == minute(7)
    assert plan.wake == minute(8)


def test_a_missed_tick_past_the_starting_deadline_is_skipped_and_told_once() -> None:
    status = {"lastScheduleTime": api.format_time(minute(0))}
    plan = ticks.decide(schedule(status, startingDeadlineSeconds=15), [], minute(7, 20))
    assert plan.create is None
    assert [e[1] for e in plan.events] == ["MissedSchedule"]
    assert plan.status["lastSkippedTime"] == api.format_time(minute(7))
    again = ticks.decide(schedule(plan.status, startingDeadlineSeconds=15), [], minute(7, 40))
    assert again.create is None
    assert again.events == []
    within = ticks.decide(schedule(status, startingDeadlineSeconds=30), [], minute(7, 20))
    assert within.create == minute(7)


def test_allow_creates_beside_a_running_run() -> None:
    plan = ticks.decide(schedule(), [run(minute(0), "Running")], minute(1, 1))
    assert plan.create == minute(1)
    assert plan.abort == []
    assert [r["name"] for r in plan.status["active"]] == [name(minute(0)), name(minute(1))]


def test_forbid_skips_the_tick_while_a_run_is_not_finished_and_tells_it_once() -> None:
    spec = {"concurrencyPolicy": "Forbid", "startingDeadlineSeconds": 20}
    plan = ticks.decide(schedule(**spec), [run(minute(0), "Running")], minute(1, 1))
    assert plan.create is None
    assert [e[1] for e in plan.events] == ["RunAlreadyActive"]
    assert plan.status["lastSkippedTime"] == api.format_time(minute(1))
    assert plan.wake == minute(2)
    again = ticks.decide(schedule(plan.status, **spec), [run(minute(0), "Running")], minute(1, 5))
    assert again.create is None
    assert again.events == []
    # The run ends within the starting deadline: the tick still starts (as a CronJob's); past it, it does not.
    ended = run(minute(0), "Succeeded", completed=minute(1, 10))
    assert ticks.decide(schedule(plan.status, **spec), [ended], minute(1, 15)).create == minute(1)
    late = ticks.decide(schedule(plan.status, **spec), [ended], minute(1, 25))
    assert late.create is None
    assert late.events == []  # the skip was told already (status.lastSkippedTime)


def test_forbid_creates_when_the_earlier_run_has_finished() -> None:
    plan = ticks.decide(schedule(concurrencyPolicy="Forbid"), [run(minute(0), "Failed")], minute(1, 1))
    assert plan.create == minute(1)


def test_replace_aborts_the_running_runs_then_creates() -> None:
    runs = [run(minute(0), "Running"), run(minute(1), "Waiting"), run(minute(2), "Running", aborting=True)]
    plan = ticks.decide(schedule(concurrencyPolicy="Replace"), runs, minute(3, 1))
    assert plan.abort == [name(minute(0)), name(minute(1))]  # the one already aborting is left to end
    assert name(minute(3)) in plan.abort_reason
    assert plan.create == minute(3)
    assert [e[1] for e in plan.events] == ["Replacing"]


def test_suspended_creates_nothing_and_has_no_next_tick() -> None:
    plan = ticks.decide(schedule(suspend=True), [], minute(5, 1))
    assert plan.create is None
    assert plan.wake is None
    assert plan.status["nextScheduleTime"] is None


def test_history_keeps_the_newest_finished_runs_of_each_kind() -> None:
    runs = [run(minute(i), "Succeeded", completed=minute(i, 30)) for i in range(5)]
    runs += [run(minute(5), "Failed"), run(minute(6), "Aborted"), run(minute(7), "Running")]
    plan = ticks.decide(schedule(successfulRunsHistoryLimit=2, failedRunsHistoryLimit=1), runs, minute(7, 30))
    assert sorted(n for n, _ in plan.delete) == sorted([name(minute(0)), name(minute(1)), name(minute(2)),
                                                        name(minute(5))])
    assert plan.status["lastSuccessfulTime"] == api.format_time(minute(4, 30))
    assert [r["name"] for r in plan.status["active"]] == [name(minute(7))]


def test_a_bad_expression_says_so_once_and_never_wakes() -> None:
    plan = ticks.decide(schedule(schedule="5-3 * * * *"), [], minute(1))
    assert plan.create is None
    assert plan.wake is None
    assert "a range runs from low to high" in plan.status["message"]
    assert [e[:2] for e in plan.events] == [("Warning", "InvalidSchedule")]
    assert ticks.decide(schedule(plan.status, schedule="5-3 * * * *"), [], minute(2)).events == []


def test_the_status_is_not_written_again_when_nothing_changed() -> None:
    plan = ticks.decide(schedule(), [], minute(0, 1))
    body = schedule(plan.status)
    again = ticks.decide(body, [run(minute(0))], minute(0, 30))
    assert again.create is None
    assert again.status["active"][0]["uid"] == "uid-0"  # the run's uid, once it is read
    third = ticks.decide(schedule(again.status), [run(minute(0))], minute(0, 40))
    assert not third.status_changed


def test_a_daily_tick_in_a_time_zone_through_spring_forward() -> None:
    # 02:30 in New York does not exist on 2026-03-08: the tick after the 7th's is the 9th's.
    spec = {"schedule": "30 2 * * *", "timeZone": "America/New_York"}
    seventh = datetime(2026, 3, 7, 7, 30, tzinfo=UTC)
    plan = ticks.decide(schedule({"lastScheduleTime": api.format_time(seventh)}, **spec), [], seventh
                        + timedelta(hours=12))
    assert plan.create is None
    assert plan.wake == datetime(2026, 3, 9, 6, 30, tzinfo=UTC)
