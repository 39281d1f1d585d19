"""A higher-priority run preempts a lower one through Kueue: the lower one is stopped as a disruption, goes back
to Queued, and resumes from its journal with at most its step in flight run again."""

from __future__ import annotations

import uuid

import pytest

from durablerun import api
from durablerun_testbed import procs
from durablerun_testbed.kueue import Kueue
from tests.kueue.helpers import V1BETA2, apply, queued_run, queues, reasons, wait_active
from tests.operator.helpers import RunEnv, StartOperator

pytestmark = pytest.mark.testbed


def test_a_high_priority_run_preempts_a_low_one_mid_step_and_both_succeed(
        kueue: Kueue, start_operator: StartOperator, runs: RunEnv) -> None:
    suffix = uuid.uuid4().hex[:6]
    objects = queues(f"cq-{suffix}", "lq", runs.namespace, cpu="500m")  # one runner at a time
    objects[1]["spec"]["preemption"] = {"withinClusterQueue": "LowerPriority"}
    objects += [{"apiVersion": V1BETA2, "kind": "WorkloadPriorityClass", "metadata": {"name": f"{level}-{suffix}"},
                 "value": value} for level, value in (("low", 10), ("high", 1000))]
    apply(runs.testbed, objects)
    wait_active(runs.testbed, "localqueues.kueue.x-k8s.io", "lq", runs.namespace)
    start_operator(**{api.OperatorEnv.KUEUE: "true"})

    low = queued_run(runs, "low", "lq", steps=3, sleep=0.1, hold="s1")
    low["metadata"]["labels"][api.LABEL_PRIORITY_CLASS] = f"low-{suffix}"
    runs.apply(low)
    procs.wait_for(lambda: runs.executions("low-s1") == 1, timeout=90, what="the low run to be in its step s1")

    high = queued_run(runs, "high", "lq", steps=1, sleep=0.1)
    high["metadata"]["labels"][api.LABEL_PRIORITY_CLASS] = f"high-{suffix}"
    runs.apply(high)
    runs.wait_phase("high", "Succeeded", timeout=120)
    stopped = runs.get("low")["status"]
    # Back in the queue (Pending for the moment its stopped pod takes to go), perhaps admitted again already.
    assert stopped["phase"] in ("Pending", "Queued", "Running")
    assert (stopped["disruptions"], stopped.get("restarts", 0)) == (1, 0)
    assert "Preempted" in reasons(runs, "low")

    (runs.ledger_dir / "release-low-s1").touch()
    done = runs.wait_phase("low", "Succeeded", timeout=120)["status"]
    assert (done["disruptions"], done.get("restarts", 0)) == (1, 0)
    # At most the step in flight ran again (the stopped pod may still finish it within its grace period, and
    # the next attempt then replays it); the steps before and after it ran once.
    assert runs.executions("low-s0") == runs.executions("low-s2") == 1
    assert runs.executions("low-s1") in (1, 2)
