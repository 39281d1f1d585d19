"""DurableRun and pod bodies as the API server returns them, at a fixed clock: the inputs of decide's table tests."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

from durablerun import api

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
