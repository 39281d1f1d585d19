"""DurableRunSchedules on the test bed: the CRD refuses a bad cron expression or time zone at apply time, and
schedules of `* * * * *` fire at their ticks under each concurrency policy, with their history pruned, and a
schedule deleted takes its runs with it.

The schedules of the policies and of the history all run at once, from one module fixture (one operator, one
namespace), so the file waits for their ticks once: about three minutes. Each test then waits, with a
deadline, for what it proves, and reads the evidence from the API server (the runs that exist, their ticks
and creationTimestamps), not from the operator.
"""

from __future__ import annotations

import json
import re
import subprocess
import threading
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import timedelta
from itertools import pairwise
from pathlib import Path
from typing import Any

import pytest

from durablerun import api, schedules
from durablerun_testbed import procs
from durablerun_testbed.s3 import S3Server
from durablerun_testbed.testbed import TestBed
from tests.helpers.bed import launch_operator
from tests.helpers.runs import Operator, RunEnv, create_namespaces, send_event
from tests.operator.schedule_runs import (
    POLL,
    check_named_after_its_tick,
    created,
    get_schedule,
    manifest,
    phase,
    schedule_events,
    scheduled_runs,
    tick_of,
)

pytestmark = pytest.mark.testbed

#: A tick is a minute: the file's waits are a few of them, each with room for a loaded machine.
TICKS = 200.0
#: A run of `* * * * *` is created within this long of its tick (a loaded 2-core machine).
CREATE_WITHIN = 20.0
WAITS = "optest_flows:approval"  # a step, then waits (no pod) for the event "review": unfinished until told
QUICK = "optest_flows:steps"


@dataclass
class Fleet:
    runs: RunEnv
    operator: Operator
    #: Every run of each schedule the API server has held since they were applied, as last read, by schedule
    #: and name: the tests prove what happened to runs that the schedules' history limits have deleted since,
    #: while earlier tests waited on their ticks.
    seen: dict[str, dict[str, dict[str, Any]]]

    def seen_runs(self, schedule: str) -> dict[str, dict[str, Any]]:
        return dict(self.seen.get(schedule, {}))  # a copy: the fixture's thread adds to it meanwhile


SCHEDULES = ("allow", "forbid", "replace", "history")


def _watch(runs: RunEnv, seen: dict[str, dict[str, dict[str, Any]]], stop: threading.Event) -> None:
    while not stop.wait(POLL):
        for schedule in SCHEDULES:
            try:
                seen.setdefault(schedule, {}).update(scheduled_runs(runs, schedule))
            except Exception:  # a read that failed on a loaded machine is tried again at the next poll
                continue


@pytest.fixture(scope="module")
def fleet(testbed: TestBed, testbed_root: Path, s3_server: S3Server,
          tmp_path_factory: pytest.TempPathFactory) -> Iterator[Fleet]:
    """One namespace and one operator, with a schedule of each policy and one whose history is pruned, all
    applied at once."""
    (namespace,) = create_namespaces(testbed, 1)
    try:
        ledger = tmp_path_factory.mktemp("ledger")
        ledger.chmod(0o777)
        assert testbed.s3
        testbed.kubectl("create", "secret", "generic", "s3-credentials", "-n", namespace,
                        f"--from-literal=AWS_ACCESS_KEY_ID={testbed.s3.access_key}",
                        f"--from-literal=AWS_SECRET_ACCESS_KEY={testbed.s3.secret_key}")
        runs = RunEnv(testbed, namespace, s3_server.create_bucket("t-" + uuid.uuid4().hex[:16]), ledger)
        operator = launch_operator(testbed, testbed_root, [namespace])
        try:
            for body in (
                manifest(runs, "allow", WAITS),
                manifest(runs, "forbid", WAITS, concurrencyPolicy="Forbid", startingDeadlineSeconds=15),
                manifest(runs, "replace", WAITS, concurrencyPolicy="Replace"),
                manifest(runs, "history", QUICK, {"steps": 1, "sleep": 0.05}, successfulRunsHistoryLimit=1),
            ):
                testbed.kubectl("apply", "-f", "-", input=json.dumps(body))
            seen: dict[str, dict[str, dict[str, Any]]] = {}
            stop = threading.Event()
            watcher = threading.Thread(target=_watch, args=(runs, seen, stop), daemon=True)
            watcher.start()
            try:
                yield Fleet(runs, operator, seen)
            finally:
                stop.set()
                watcher.join(timeout=30)
        finally:
            operator.stop()
    finally:
        testbed.kubectl("delete", "namespace", namespace, "--wait=false", check=False)


def _apply_refused(testbed: TestBed, namespace: str, body: dict[str, Any]) -> str:
    with pytest.raises(subprocess.CalledProcessError) as refused:
        testbed.kubectl("apply", "-f", "-", input=json.dumps(body))
    return str(refused.value.stderr)


def test_the_crd_refuses_a_bad_cron_expression_or_time_zone_at_apply(testbed: TestBed, namespace: str,
                                                                      runs: RunEnv) -> None:
    good = manifest(runs, "digest", QUICK, expression="*/15 9-17 * * MON-FRI", timeZone="Europe/Paris")
    testbed.kubectl("apply", "-f", "-", input=json.dumps(good))  # the zone list's CEL rule fits the cost budget
    for expression in ("* * * *", "61 * * * *", "* * * * FUNDAY", "@every 5m", "*/0 * * * *"):
        bad = manifest(runs, "bad-cron", QUICK, expression=expression)
        message = _apply_refused(testbed, namespace, bad)
        assert "spec.schedule" in message, message
        assert "not a cron expression" in message, message
    bad_zone = manifest(runs, "bad-zone", QUICK, timeZone="Mars/Olympus")
    message = _apply_refused(testbed, namespace, bad_zone)
    assert "spec.timeZone" in message, message
    assert "not a time zone of the IANA database" in message, message
    long_name = manifest(runs, "s" * (schedules.NAME_MAX + 1), QUICK)
    assert "at most 52 characters" in _apply_refused(testbed, namespace, long_name)
    # The template is a DurableRun's spec: a typo there is refused at apply too, not at the first tick.
    typo = manifest(runs, "typo", QUICK)
    typo["spec"]["runTemplate"]["spec"]["polcy"] = {}
    assert "polcy" in _apply_refused(testbed, namespace, typo)


def first_two_ticks(runs: RunEnv, schedule: str) -> tuple[dict[str, Any], dict[str, Any]]:
    """The schedule's first two runs, once both exist: each named after its tick, the ticks a minute apart."""
    both = procs.wait_for(lambda: len(found := scheduled_runs(runs, schedule)) >= 2 and found, timeout=TICKS,
                          interval=POLL, what=f"two runs of the {schedule} schedule")
    first, second = sorted(both.values(), key=tick_of)[:2]
    for run in (first, second):
        check_named_after_its_tick(schedule, run)
    assert (tick_of(second) - tick_of(first)).total_seconds() == 60
    return first, second


def test_allow_fires_at_each_tick_with_two_runs_unfinished_at_once(fleet: Fleet) -> None:
    runs = fleet.runs
    first, second = first_two_ticks(runs, "allow")
    for run in (first, second):
        assert (created(run) - tick_of(run)).total_seconds() < CREATE_WITHIN, run["metadata"]
    # Both unfinished at once: the first still waits for its review while the second runs or waits.
    waiting = runs.wait_phase(first["metadata"]["name"], "Waiting", timeout=60)
    assert phase(runs.get(second["metadata"]["name"])) not in ("Succeeded", "Failed", "Aborted")
    assert phase(waiting) == "Waiting"
    owner = first["metadata"]["ownerReferences"][0]
    assert (owner["kind"], owner["name"], owner["controller"]) == (api.SCHEDULE_KIND, "allow", True)
    status = get_schedule(runs, "allow")["status"]
    assert status["activeCount"] >= 2
    # kubectl get shows the schedule, its suspension, active runs, and last and next ticks.
    table = runs.testbed.kubectl("get", api.SCHEDULE_PLURAL, "allow", "-n", runs.namespace).stdout.splitlines()
    assert table[0].split()[:8] == ["NAME", "SCHEDULE", "TIME", "ZONE", "SUSPEND", "ACTIVE", "LAST", "SCHEDULE"]
    assert "NEXT SCHEDULE" in table[0]
    assert re.search(r"\d{4}-\d\d-\d\dT\d\d:\d\d:00Z", table[1]), table


def test_forbid_skips_the_tick_while_its_run_has_not_finished(fleet: Fleet) -> None:
    runs = fleet.runs
    first = procs.wait_for(lambda: scheduled_runs(runs, "forbid"), timeout=TICKS, interval=POLL,
                           what="the Forbid schedule's run")
    (name,) = first
    runs.wait_phase(name, "Waiting", timeout=60)
    # The next tick passes while it waits: no run for it, and the schedule says why.
    skipped = procs.wait_for(lambda: get_schedule(runs, "forbid").get("status", {}).get("lastSkippedTime"),
                             timeout=TICKS, interval=POLL, what="the Forbid schedule to skip a tick")
    assert api.parse_time(skipped) > tick_of(first[name])
    assert list(scheduled_runs(runs, "forbid")) == [name]
    assert "RunAlreadyActive" in schedule_events(runs, "forbid")
    # Released only once the skipped tick is past its starting deadline (15 s), so that it stays skipped (within
    # it, it would still start, as a CronJob's); then the next tick creates the next run.
    procs.wait_for(lambda: api.now() > api.parse_time(skipped) + timedelta(seconds=16), timeout=60, interval=POLL,
                   what="the skipped tick's starting deadline to pass")
    assert list(scheduled_runs(runs, "forbid")) == [name]
    send_event(runs, name, "review", {"approved": True})
    runs.wait_phase(name, "Succeeded", timeout=60)
    later = procs.wait_for(lambda: len(found := scheduled_runs(runs, "forbid")) == 2 and found, timeout=TICKS,
                           interval=POLL, what="the Forbid schedule's next run, after the first finished")
    (nxt,) = [r for n, r in later.items() if n != name]
    check_named_after_its_tick("forbid", nxt)
    assert tick_of(nxt) > api.parse_time(skipped)  # the skipped tick stayed skipped (past its deadline)


def test_replace_aborts_the_running_run_and_creates_the_next(fleet: Fleet) -> None:
    runs = fleet.runs

    def replaced() -> tuple[dict[str, Any], dict[str, Any]] | None:
        # A run seen Aborted and the run of the next tick (the failed-runs history may have deleted the first since).
        mine = sorted(fleet.seen_runs("replace").values(), key=tick_of)
        return next(((a, b) for a, b in pairwise(mine) if phase(a) == "Aborted"), None)

    ended, second = procs.wait_for(replaced, timeout=TICKS, interval=POLL,
                                   what="a run of the replace schedule aborted by the next tick's")
    for run in (ended, second):
        check_named_after_its_tick("replace", run)
    assert (tick_of(second) - tick_of(ended)).total_seconds() == 60
    # The earlier run was ended by the later one's tick, through the abort annotation (its runner's grace).
    assert f"replaced by {second['metadata']['name']}" in ended["status"]["message"], ended["status"]
    assert "Replacing" in schedule_events(runs, "replace")
    # At any moment at most the newest run is left unfinished: every older one is Aborted (or being aborted).
    def only_the_newest_runs() -> bool:
        now = sorted(scheduled_runs(runs, "replace").values(), key=tick_of)
        return all(phase(r) == "Aborted" or api.ANNOTATION_ABORT in r["metadata"].get("annotations", {})
                   for r in now[:-1])

    procs.wait_for(only_the_newest_runs, timeout=60, interval=POLL, what="every run but the newest aborted")


def test_history_keeps_only_the_newest_succeeded_run(fleet: Fleet) -> None:
    runs = fleet.runs
    seen: dict[str, dict[str, Any]] = {}

    def pruned() -> bool:
        now = scheduled_runs(runs, "history")
        seen.update(fleet.seen_runs("history"), **now)
        done = [r for r in now.values() if phase(r) == "Succeeded"]
        return len(seen) >= 3 and len(done) <= 1 and set(now) != set(seen)

    procs.wait_for(pruned, timeout=TICKS + 60, interval=POLL,
                   what="three runs of the history schedule, the older pruned")
    now = scheduled_runs(runs, "history")
    oldest = min(seen.values(), key=tick_of)
    assert oldest["metadata"]["name"] not in now  # it existed, it finished, it was deleted
    assert "RunDeleted" in schedule_events(runs, "history")
    assert get_schedule(runs, "history")["status"].get("lastSuccessfulTime")


def test_deleting_a_schedule_deletes_its_runs(fleet: Fleet) -> None:
    runs = fleet.runs
    owned = procs.wait_for(lambda: scheduled_runs(runs, "history"), timeout=TICKS, interval=POLL,
                           what="a run of the history schedule")
    runs.testbed.kubectl("delete", api.SCHEDULE_PLURAL, "history", "-n", runs.namespace)
    # The garbage collector follows the runs' owner references to the deleted schedule.
    procs.wait_for(lambda: not scheduled_runs(runs, "history"), timeout=120, interval=POLL,
                   what="the deleted schedule's runs to be deleted")
    for name in owned:
        assert name not in scheduled_runs(runs, "history")
