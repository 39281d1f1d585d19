"""The operator and the Kueue manager restart while runs are queued and admitted: no run is lost, none runs twice
at once, no step runs twice."""

from __future__ import annotations

import time
import uuid

import pytest

from durablerun import api
from durablerun_testbed.kueue import Kueue
from tests.helpers.kueue import wait_active
from tests.helpers.runs import RunEnv, StartOperator
from tests.kueue.helpers import apply, live_pods, phases, queued_run, queues

pytestmark = pytest.mark.testbed


def test_operator_and_kueue_restarts_lose_no_run_and_never_double_one(
        kueue: Kueue, start_operator: StartOperator, runs: RunEnv) -> None:
    apply(runs.testbed, queues(f"cq-{uuid.uuid4().hex[:6]}", "lq", runs.namespace, cpu="500m"))  # one at a time
    wait_active(runs.testbed, "localqueues.kueue.x-k8s.io", "lq", runs.namespace)
    operator = start_operator(**{api.OperatorEnv.KUEUE: "true"})
    names = ["a", "b", "c"]
    for name in names:
        runs.apply(queued_run(runs, name, "lq", steps=2, sleep=1.5))

    def check() -> dict[str, str]:
        assert len(live_pods(runs)) <= 1, f"more runner pods than the quota admits: {live_pods(runs)}"
        return phases(runs)

    deadline = time.monotonic() + 120
    while sorted((seen := check()).values()).count("Queued") < 2 or "Running" not in seen.values():
        assert time.monotonic() < deadline, f"never one Running and two Queued: {seen}"
        time.sleep(0.2)

    operator.stop()
    kueue.stop()
    check()
    kueue.launch()
    start_operator("operator-2", **{api.OperatorEnv.KUEUE: "true"})

    deadline = time.monotonic() + 180
    while set((seen := check()).values()) != {"Succeeded"}:
        assert time.monotonic() < deadline, f"not all Succeeded in 180s: {seen}"
        time.sleep(0.2)
    for name in names:
        assert [runs.executions(f"{name}-s{i}") for i in range(2)] == [1, 1], name
