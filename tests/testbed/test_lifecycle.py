"""The test bed stops everything it starts, pods' processes included."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from durablerun_testbed import procs
from durablerun_testbed.s3 import S3Server
from durablerun_testbed.testbed import TestBed

pytestmark = pytest.mark.testbed


def test_stopping_a_test_bed_leaves_no_process(tmp_path: Path, s3_server: S3Server) -> None:
    bed = TestBed(tmp_path / "bed").start(s3=s3_server)
    try:
        procs.wait_for(lambda: bed.kubectl("get", "sa", "default", check=False).returncode == 0,
                       timeout=30, what="the default ServiceAccount")
        pod = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "long", "namespace": "default"},
               "spec": {"restartPolicy": "Never",
                        "containers": [{"name": "c", "image": "unused", "command": ["sleep", "600"]}]}}
        bed.kubectl("apply", "-f", "-", input=json.dumps(pod))
        procs.wait_for(
            lambda: any(p["running"] for p in bed.node.processes()) if bed.node else False,
            timeout=30, what="the pod's process to run",
        )
        alive = bed.leftovers()
        names = " ".join(cmd for _, cmd in alive)
        for part in ("etcd", "kube-apiserver", "kube-controller-manager", "durablerun_testbed node", "sleep 600"):
            assert part in names, f"{part} was not running under the test bed's marker"
    finally:
        bed.stop()
    assert bed.leftovers() == []
