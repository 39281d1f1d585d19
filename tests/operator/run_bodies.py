"""DurableRun and pod bodies as the API server returns them, at a fixed clock: the inputs of decide's table tests,
and what a plan makes of them (``plan_for``, ``apply``)."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from typing import Any

from durablerun import api
from durablerun_operator import decide

T0 = datetime(2026, 11, 22, 12, 0, 0, tzinfo=UTC)
POLICY = {"leaseDuration": "60s", "progressTimeout": "10m", "maxDuration": "2h"}


def at(seconds: float) -> str:
    return api.format_time(T0 + timedelta(seconds=seconds))


def body(status: dict[str, Any], *, spec: dict[str, Any] | None = None, generation: int = 1,
         annotations: dict[str, str] | None = None, finalizers: tuple[str, ...] = (api.RUN_FINALIZER,),
         deleting: bool = False) -> dict[str, Any]:
    meta: dict[str, Any] = {"namespace": "ns", "name": "run", "uid": "u1", "generation": generation,
                            "resourceVersion": "7", "finalizers": list(finalizers), "annotations": annotations or {}}
    if deleting:
        meta["deletionTimestamp"] = at(0)
    return {"metadata": meta,
            "spec": {"workflow": "m:f", "checkpoint": {"uri": "s3://bucket/runs"}, "policy": dict(POLICY),
                     **(spec or {})},
            "status": {"epoch": 2, "attempt": 1, "inputHash": api.input_hash({}), "startTime": at(0),
                       "observedGeneration": generation, **status}}


def running(**extra: Any) -> dict[str, Any]:
    return {"phase": "Running", "pod": "run-a2",
            "lease": {"holder": "run-a2", "epoch": 2, "acquireTime": at(0), "renewTime": at(100)},
            "progress": {"completedSteps": 3, "lastProgressTime": at(90)}, **extra}


def runner_pod() -> dict[str, Any]:
    return {"metadata": {"name": "run-a2", "uid": "p1", "labels": {api.LABEL_RUN: "run", api.LABEL_EPOCH: "2"},
                         "finalizers": [api.POD_FINALIZER]},
            "spec": {"containers": [{"name": "runner"}]},
            "status": {"phase": "Running", "containerStatuses": [
                {"name": "runner", "state": {"running": {"startedAt": at(0)}}}]}}


def plan_for(run_body: dict[str, Any], pods: list[dict[str, Any]] | None = None,
             seconds: float = 200, create_failure: decide.CreateFailure | None = None,
             start_timeout: timedelta | None = None) -> tuple[decide.Plan, dict[str, Any]]:
    """The plan at T0 + ``seconds``, and the status it writes (the whole new status)."""
    now = T0 + timedelta(seconds=seconds)
    views = [decide.PodView.from_pod(p, now, 60.0) for p in pods or []]
    kwargs = {"start_timeout": start_timeout} if start_timeout else {}
    plan = decide.decide(decide.RunView.from_body(run_body), views, now, create_failure=create_failure, **kwargs)
    status = dict(run_body["status"])
    for op in plan.patch:
        if op["op"] == "add":
            status[op["path"].split("/")[-1]] = op["value"]
        elif op["op"] == "remove":
            status.pop(op["path"].split("/")[-1])
    return plan, status


def apply(run_body: dict[str, Any], plan: decide.Plan) -> dict[str, Any]:
    """The status after the plan's patch, checking that its test ops hold on the status it was made from."""
    status = dict(run_body.get("status") or {})
    for op in plan.patch:
        key = op["path"].removeprefix("/status").removeprefix("/")
        if op["op"] == "test":
            current: Any = run_body
            for part in op["path"].strip("/").split("/"):
                current = current.get(part) if isinstance(current, dict) else None
            assert current == op["value"], op
        elif op["path"] == "/status":
            status = dict(op["value"])
        elif op["op"] == "add":
            status[key] = op["value"]
        else:
            status.pop(key)
    return status


def ended(exit_code: int, *, report: dict[str, Any] | None = None, reason: str | None = None,
          deleting: bool = False, conditions: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    """The current attempt's pod, its runner container terminated at T0+110."""
    pod = runner_pod()
    terminated: dict[str, Any] = {"exitCode": exit_code, "finishedAt": at(110)}
    if report is not None:
        terminated["message"] = json.dumps(report)
    if reason:
        terminated["reason"] = reason
    pod["status"] = {"phase": "Failed" if exit_code else "Succeeded", "conditions": conditions or [],
                     "containerStatuses": [{"name": api.RUNNER_CONTAINER, "state": {"terminated": terminated}}]}
    if deleting:
        pod["metadata"]["deletionTimestamp"] = at(105)
    return pod


def waiting_report(**waiting_for: str) -> dict[str, Any]:
    return {"outcome": "Waiting", "message": "waiting", "waitingFor": waiting_for}
