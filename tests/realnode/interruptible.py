"""The test a session of its own runs until a signal ends it (tests/realnode/test_interrupted_session.py); not
collected by the suite (its name is not ``test_*.py``)."""

from __future__ import annotations

import json
from pathlib import Path

from durablerun_testbed import podfaults, procs
from durablerun_testbed.testbed import TestBed
from tests.helpers.interrupted_sessions import hold


def test_hold_a_pod_on_the_real_node(real_bed: TestBed, testbed_root: Path) -> None:
    node = real_bed.real_node
    assert node
    procs.wait_for(lambda: real_bed.kubectl("get", "serviceaccount", "default", check=False).returncode == 0,
                   timeout=60, what="the default ServiceAccount")
    pod = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "held", "namespace": "default"},
           "spec": {"containers": [{"name": "main", "image": node.images["pause"], "imagePullPolicy": "Never"}]}}
    real_bed.kubectl("apply", "-f", "-", input=json.dumps(pod))

    def container_id() -> str | None:
        statuses = json.loads(real_bed.kubectl("get", "pod", "held", "-o", "json").stdout)["status"]
        running = [s for s in statuses.get("containerStatuses", []) if "running" in s.get("state", {})]
        return str(running[0]["containerID"]) if running else None

    cid = procs.wait_for(container_id, timeout=120, what="the held pod's container to run")
    hold(testbed_root, [podfaults.task_pid(node, cid)])
