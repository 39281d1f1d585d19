"""A higher-priority run preempts a lower one through Kueue: the lower one is stopped as a disruption, goes back
to Queued, and resumes from its journal. It stops as a suspended run does: within policy.stopGracePeriod its step
in flight finishes and is journaled, so nothing runs twice."""

from __future__ import annotations

import uuid

import pytest

from durablerun import api
from durablerun_testbed import procs
from durablerun_testbed.kueue import Kueue
from tests.helpers.kueue import V1BETA2, wait_active
from tests.helpers.runs import RunEnv, StartOperator
from tests.kueue.helpers import apply, queued_run, queues, reasons

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
    low["spec"]["policy"]["stopGracePeriod"] = "35s"  # the pod's grace raised to 45 s to hold it
    runs.apply(low)
    procs.wait_for(lambda: runs.executions("low-s1") == 1, timeout=90, what="the low run to be in its step s1")

    high = queued_run(runs, "high", "lq", steps=1, sleep=0.1)
    high["metadata"]["labels"][api.LABEL_PRIORITY_CLASS] = f"high-{suffix}"
    runs.apply(high)
    # Preempted as a suspended run stops: its pod is deleted with its own grace, and the runner is
    # still there, not fenced, to finish the step in flight and stop at the next step boundary.
    pod = procs.wait_for(lambda: next((p for p in runs.pods("low") if p["metadata"].get("deletionTimestamp")), None),
                         timeout=90, what="the low run's pod to be stopping")
    assert pod["metadata"]["deletionGracePeriodSeconds"] == 45
    assert runs.get("low")["status"]["phase"] == "Running"
    # Released once the runner has its SIGTERM (the node sends it some time after the deletion): released
    # before, the run could finish all its steps first, and end by itself rather than be preempted.
    runs.wait_stop_requested(pod["metadata"]["name"])
    (runs.ledger_dir / "release-low-s1").touch()

    runs.wait_phase("high", "Succeeded", timeout=120)
    assert "Preempted" in reasons(runs, "low")
    done = runs.wait_phase("low", "Succeeded", timeout=120)["status"]
    assert (done["disruptions"], done.get("restarts", 0)) == (1, 0)
    # The step in flight finished within the grace and was journaled: no step ran twice.
    assert [runs.executions(f"low-s{i}") for i in range(3)] == [1, 1, 1]
