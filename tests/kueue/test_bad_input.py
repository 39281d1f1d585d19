"""Bad input around Kueue, as a user meets it: a queue that does not exist, a run no flavor can hold, and a
queue label changed under a queued run."""

from __future__ import annotations

import json
import subprocess
import uuid

import pytest

from durablerun import api, resource
from durablerun_testbed import procs
from durablerun_testbed.kueue import Kueue
from tests.helpers.kueue import wait_active
from tests.helpers.runs import RunEnv, StartOperator
from tests.kueue.helpers import apply, queued_run, queues

pytestmark = pytest.mark.testbed


def test_a_missing_queue_a_run_too_big_for_its_queue_and_a_moved_queue_label(
        kueue: Kueue, start_operator: StartOperator, runs: RunEnv) -> None:
    apply(runs.testbed, queues(f"cq-{uuid.uuid4().hex[:6]}", "small", runs.namespace, cpu="1"))
    wait_active(runs.testbed, "localqueues.kueue.x-k8s.io", "small", runs.namespace)
    start_operator(**{api.OperatorEnv.KUEUE: "true"})
    runs.apply(queued_run(runs, "lost", "no-such-queue"))
    runs.apply(queued_run(runs, "huge", "small", cpu="4"))

    # No such LocalQueue: the run stays Queued, says so, and a Warning Event says it too (no pod, ever).
    lost = procs.wait_for(lambda: "doesn't exist" in (r := runs.get("lost"))["status"].get("message", "") and r,
                          timeout=60, what="Kueue's reason on the run")
    assert lost["status"]["phase"] == "Queued"
    assert "LocalQueue no-such-queue doesn't exist" in lost["status"]["message"]
    warnings = procs.wait_for(lambda: [e for e in runs.events("lost") if e["type"] == "Warning"], timeout=30,
                              what="a Warning Event on the run")
    assert "no-such-queue" in warnings[0]["message"]
    # More CPU than the queue has: Kueue's own reason is in the run's status.
    huge = procs.wait_for(lambda: "insufficient" in (r := runs.get("huge"))["status"].get("message", "") and r,
                          timeout=60, what="Kueue's reason on the too-big run")
    assert huge["status"]["phase"] == "Queued"
    assert runs.pods("lost") == runs.pods("huge") == []

    # The queue label of a Queued run cannot move: the API server refuses, and says what to do instead.
    refused = runs.testbed.kubectl("label", "dr", "lost", "-n", runs.namespace, f"{api.LABEL_QUEUE_NAME}-",
                                   check=False)
    assert refused.returncode != 0
    assert resource.QUEUE_LABEL_FIXED in refused.stderr
    labels = json.loads(runs.testbed.kubectl("get", "dr", "lost", "-n", runs.namespace, "-o", "json").stdout)[
        "metadata"]["labels"]
    assert labels[api.LABEL_QUEUE_NAME] == "no-such-queue"
    # Once it is out of Kueue's hands (suspended, here), the label may change.
    runs.testbed.kubectl("patch", "dr", "lost", "-n", runs.namespace, "--type=merge", "-p",
                         '{"spec": {"suspend": true}}')
    runs.wait_phase("lost", "Suspended", timeout=60)
    runs.testbed.kubectl("label", "dr", "lost", "-n", runs.namespace, "--overwrite", f"{api.LABEL_QUEUE_NAME}=small")
    with pytest.raises(subprocess.CalledProcessError):
        runs.testbed.kubectl("label", "dr", "huge", "-n", runs.namespace, f"{api.LABEL_QUEUE_NAME}-")


def test_a_missing_priority_class_is_named_in_a_warning_and_the_run_queues_once_the_label_is_fixed(
        kueue: Kueue, start_operator: StartOperator, runs: RunEnv) -> None:
    apply(runs.testbed, queues(f"cq-{uuid.uuid4().hex[:6]}", "lq", runs.namespace, cpu="1"))
    wait_active(runs.testbed, "localqueues.kueue.x-k8s.io", "lq", runs.namespace)
    start_operator(**{api.OperatorEnv.KUEUE: "true"})
    missing = f"no-such-class-{uuid.uuid4().hex[:6]}"
    manifest = queued_run(runs, "classless", "lq", steps=1, sleep=0.1)
    manifest["metadata"]["labels"][api.LABEL_PRIORITY_CLASS] = missing
    runs.apply(manifest)

    warning = procs.wait_for(lambda: next((e for e in runs.events("classless")
                                           if e["reason"] == "PriorityClassNotFound"), None),
                             timeout=60, what="a PriorityClassNotFound Warning Event")
    assert warning["type"] == "Warning"
    assert f"WorkloadPriorityClass {missing!r}" in warning["message"]
    assert api.LABEL_PRIORITY_CLASS in warning["message"]
    status = runs.get("classless")["status"]
    assert status["phase"] == "Queued"
    assert missing in status["message"]
    workloads = runs.testbed.kubectl("get", "workloads.kueue.x-k8s.io", "-n", runs.namespace, "-o", "name").stdout
    assert workloads.strip() == ""
    assert runs.pods("classless") == []

    # The fix the Warning names: the label (or the class). The run is queued, admitted and runs.
    runs.testbed.kubectl("label", "dr", "classless", "-n", runs.namespace, f"{api.LABEL_PRIORITY_CLASS}-")
    runs.wait_phase("classless", "Succeeded", timeout=90)
    assert len([e for e in runs.events("classless") if e["reason"] == "PriorityClassNotFound"]) == 1
