"""Checks the bad-input tests share with the security tier: a run that fails once and stays failed, and the
stored objects of a run (to damage them, or to prove nothing was overwritten)."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from durablerun._private.records import layout
from durablerun_testbed import procs
from tests.helpers.journal_checks import list_objects, run_root
from tests.helpers.runs import RunEnv, events

SETTLE = 2.0  # seconds finished runs are watched for a restart that must not come (4 operator resyncs)


def failed(runs: RunEnv, name: str, *, restarts: int = 0, timeout: float = 120) -> dict[str, Any]:
    """The run ends Failed, with the Failed condition carrying its message, after ``restarts`` restarts."""
    status = runs.wait_phase(name, "Failed", "Aborted", "Succeeded", timeout=timeout)["status"]
    assert status["phase"] == "Failed", status
    conditions = {c["type"]: c for c in status["conditions"]}
    assert conditions["Failed"]["status"] == "True"
    assert conditions["Failed"]["message"] == status["message"][:1024]
    assert conditions["Progressing"]["status"] == "False"
    assert status["restarts"] == restarts, [f"{e['reason']}: {e['message']}" for e in runs.events(name)]
    # The operator writes the status first and posts the run's Events after it: wait for the Event, then count.
    procs.wait_for(lambda: events(runs, name)["Failed"] >= 1, timeout=30, what=f"the Failed Event of {name}")
    assert events(runs, name)["Failed"] == 1
    return dict(status)


def stay_failed(runs: RunEnv, statuses: dict[str, dict[str, Any]]) -> None:
    """An observation window: no finished run moves again (no new attempt, no restart)."""
    deadline = time.monotonic() + SETTLE
    while time.monotonic() < deadline:
        for name, status in statuses.items():
            again = runs.get(name)["status"]
            assert (again["phase"], again["attempt"], again["restarts"]) == \
                   ("Failed", status["attempt"], status["restarts"]), f"{name} moved on after failing: {again}"
        time.sleep(0.25)


def failed_once(runs: RunEnv, name: str, *, restarts: int = 0, timeout: float = 120) -> dict[str, Any]:
    status = failed(runs, name, restarts=restarts, timeout=timeout)
    stay_failed(runs, {name: status})
    return status


def root_of(runs: RunEnv, name: str) -> str:
    return run_root("runs", runs.namespace, name, runs.get(name)["metadata"]["uid"])


def objects(runs: RunEnv, name: str) -> dict[str, str]:
    assert runs.testbed.s3
    return list_objects(runs.testbed.s3.client(), runs.bucket, root_of(runs, name))


def journal(objects: dict[str, str]) -> dict[str, str]:
    """A run's objects as :func:`objects` gives them (keys relative to its root) but its status and its attempts'
    logs, which every attempt writes, a failing one too."""
    return {k: v for k, v in objects.items() if k != "status.json" and not k.startswith(layout.LOGS_DIR)}


def check_all(cases: dict[str, Callable[[], None]]) -> None:
    """Run every case's checks; fail once, naming every case that failed."""
    failures = []
    for case, check in cases.items():
        try:
            check()
        except AssertionError as error:
            failures.append(f"{case}: {error}")
    assert not failures, "\n".join(failures)


def flip(runs: RunEnv, key: str, how: str) -> bytes:
    """Damage one stored object in place: flip one byte of its body, or cut it short."""
    assert runs.testbed.s3
    s3 = runs.testbed.s3.client()
    data = s3.get_object(Bucket=runs.bucket, Key=key)["Body"].read()
    if how == "flipped":
        index = data.index(b'"body":') + len(b'"body":') + 3
        data = data[:index] + bytes([data[index] ^ 0x01]) + data[index + 1:]
    else:
        data = data[: len(data) // 2]
    s3.put_object(Bucket=runs.bucket, Key=key, Body=data)
    return bytes(data)
