"""A DurableRunSchedule across operator downtime on the test bed: the ticks missed while no operator ran make
one catch-up run (the most recent), and two operators started at once fire that tick once.

The evidence is the API server's: the runs that exist, their ticks (names and scheduled-time annotations) and
creationTimestamps against when the operators stopped and started. About three minutes (two ticks of
downtime).
"""

from __future__ import annotations

import json
import signal
from datetime import timedelta

import pytest

from durablerun import api, schedules
from durablerun_testbed import procs
from tests.helpers.runs import RunEnv, StartOperator
from tests.operator.schedule_runs import (
    POLL,
    check_named_after_its_tick,
    created,
    get_schedule,
    manifest,
    scheduled_runs,
    tick_of,
)

# Over three minutes of real minute ticks: the faults tier (`make faults`), with the other fault tests.
pytestmark = [pytest.mark.testbed, pytest.mark.long]


def test_missed_ticks_make_one_catch_up_run_and_two_operators_fire_it_once(
        start_operator: StartOperator, runs: RunEnv) -> None:
    first_operator = start_operator("operator-a")
    runs.testbed.kubectl("apply", "-f", "-", input=json.dumps(
        manifest(runs, "nightly", "optest_flows:steps", {"steps": 1, "sleep": 0.05})))
    first = procs.wait_for(lambda: scheduled_runs(runs, "nightly"), timeout=90, interval=POLL,
                           what="the schedule's first run")
    (first_run,) = first.values()
    check_named_after_its_tick("nightly", first_run)
    first_operator.process.signal_group(signal.SIGKILL)  # dies as a crashed operator does
    down_since = api.now()

    # Two ticks pass with no operator: nothing creates their runs.
    missed = [tick_of(first_run) + timedelta(minutes=i) for i in (1, 2)]
    procs.wait_for(lambda: api.now() > missed[1] + timedelta(seconds=3), timeout=200, interval=POLL,
                   what="two ticks to pass with no operator")
    assert list(scheduled_runs(runs, "nightly")) == [first_run["metadata"]["name"]]

    # Two operators at once: the most recent missed tick gets its run, once; the earlier is not made up.
    restarted = api.now()
    start_operator("operator-b")
    start_operator("operator-c")
    caught_up = procs.wait_for(lambda: len(found := scheduled_runs(runs, "nightly")) >= 2 and found, timeout=60,
                               interval=POLL, what="the catch-up run")
    late = caught_up[schedules.run_name("nightly", missed[1])]
    check_named_after_its_tick("nightly", late)
    assert created(late) >= restarted.replace(microsecond=0)
    assert schedules.run_name("nightly", missed[0]) not in caught_up
    assert down_since < missed[0]
    # Both operators looked at that tick; one created its run, the other found it there (409): one RunCreated.
    procs.wait_for(lambda: get_schedule(runs, "nightly").get("status", {}).get("lastScheduleTime")
                   == api.format_time(missed[1]), timeout=30, interval=POLL, what="the status to name the tick")
    told = [e for e in runs.events("nightly") if e["reason"] == "RunCreated"
            and late["metadata"]["name"] in e["message"]]
    assert len(told) == 1, told
    assert runs.get(late["metadata"]["name"])["metadata"]["uid"] == late["metadata"]["uid"]
    # Every run there is the first, the catch-up, or one of a tick after it (the next minute may have come).
    for name, run in scheduled_runs(runs, "nightly").items():
        assert name == first_run["metadata"]["name"] or tick_of(run) >= missed[1], name
