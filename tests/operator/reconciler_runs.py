"""A Running DurableRun at the time the tests start, for the reconciler's tests against a stub API
(test_reconciler_counts.py, test_reconciler_wakeups.py)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

from durablerun import api

NOW = datetime.now(UTC)


def at(seconds: float) -> str:
    return api.format_time(NOW + timedelta(seconds=seconds))


RUN: dict[str, Any] = {
    "metadata": {"namespace": "ns", "name": "run", "uid": "u1", "generation": 1, "resourceVersion": "7",
                 "finalizers": [api.RUN_FINALIZER], "annotations": {}},
    "spec": {"workflow": "m:f", "checkpoint": {"uri": "s3://bucket/runs"}},
    "status": {"phase": "Running", "epoch": 2, "attempt": 1, "pod": "run-a2", "startTime": at(-60),
               "inputHash": api.input_hash({}), "observedGeneration": 1,
               "lease": {"holder": "run-a2", "epoch": 2, "acquireTime": at(-50), "renewTime": at(-1)}},
}
