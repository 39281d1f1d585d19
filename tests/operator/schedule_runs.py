"""What the DurableRunSchedule tests share: a schedule's manifest, and what the API server holds of its runs.

The evidence is the API server's, never the operator's word: the runs that exist, their names (the tick's:
``schedules.run_name``), their scheduled-time annotations and creationTimestamps.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from durablerun import api, schedules
from tests.helpers.runs import RunEnv


def manifest(runs: RunEnv, name: str, workflow: str, input: dict[str, Any] | None = None,
             expression: str = "* * * * *", **spec: Any) -> dict[str, Any]:
    """A schedule whose runs are ``runs.manifest``'s (the test bed's store, ledger and workflows)."""
    run = runs.manifest(name, workflow, input)
    return {
        "apiVersion": api.API_VERSION, "kind": api.SCHEDULE_KIND,
        "metadata": {"name": name, "namespace": runs.namespace},
        "spec": {"schedule": expression, "runTemplate": {"spec": run["spec"]}, **spec},
    }


#: How often a wait reads the API server again: a tick is a minute, so once a second loses nothing.
POLL = 1.0


def _custom(runs: RunEnv) -> Any:
    from kubernetes import client

    return client.CustomObjectsApi(runs._api())  # the waits' client, cached by the RunEnv


def scheduled_runs(runs: RunEnv, schedule: str) -> dict[str, dict[str, Any]]:
    """The schedule's runs as the API server holds them, by name."""
    reply = _custom(runs).list_namespaced_custom_object(api.GROUP, api.VERSION, runs.namespace, api.PLURAL,
                                                        label_selector=schedules.run_selector(schedule))
    return {r["metadata"]["name"]: r for r in reply["items"]}


def tick_of(run: dict[str, Any]) -> datetime:
    return api.parse_time(run["metadata"]["annotations"][api.ANNOTATION_SCHEDULED_TIME])


def created(run: dict[str, Any]) -> datetime:
    return api.parse_time(run["metadata"]["creationTimestamp"])


def phase(run: dict[str, Any]) -> str | None:
    return (run.get("status") or {}).get("phase")


def get_schedule(runs: RunEnv, name: str) -> dict[str, Any]:
    return dict(_custom(runs).get_namespaced_custom_object(api.GROUP, api.VERSION, runs.namespace,
                                                           api.SCHEDULE_PLURAL, name))


def schedule_events(runs: RunEnv, name: str) -> list[str]:
    return [e["reason"] for e in runs.events(name) if e["involvedObject"].get("kind") == api.SCHEDULE_KIND]


def check_named_after_its_tick(schedule: str, run: dict[str, Any]) -> None:
    """The run is named after its tick, which is a minute boundary, and was created after it."""
    tick = tick_of(run)
    assert tick.second == 0, run["metadata"]
    assert run["metadata"]["name"] == schedules.run_name(schedule, tick)
    assert created(run) >= tick
