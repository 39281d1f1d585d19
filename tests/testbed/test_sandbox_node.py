"""`sandbox node ACTION NAMESPACE POD` on a pod that is gone (the run moved on to its next attempt): one sentence
naming the pod and how to list the run's pods, exit 1, no traceback (issue 43), on either node.

The sandbox's state file points the command at this session's test bed: its process node and its API server.
"""

from __future__ import annotations

import json
import subprocess
import sys
from dataclasses import asdict
from pathlib import Path

import pytest

from durablerun_testbed import sandbox
from durablerun_testbed.testbed import TestBed

pytestmark = pytest.mark.testbed


@pytest.mark.parametrize(("node", "actions"), [("process", ("kill", "oom", "pause")), ("real", ("kill",))])
def test_acting_on_a_pod_that_is_gone_says_so_without_a_traceback(
    testbed: TestBed, namespace: str, tmp_path: Path, node: str, actions: tuple[str, ...],
) -> None:
    assert testbed.node is not None
    state = sandbox.SandboxState(
        id="gone-pod", dir=str(tmp_path), kubeconfig=str(testbed.kubeconfig), s3_endpoint="", s3_access_key="",
        s3_secret_key="", s3_bucket="", node_url=testbed.node.url if node == "process" else "", metrics_url="",
        pids=[], node=node)
    (tmp_path / "state.json").write_text(json.dumps(asdict(state)))
    for action in actions:
        told = subprocess.run([sys.executable, "-m", "durablerun_testbed", "sandbox", "--dir", str(tmp_path), "node",
                               action, namespace, "review-agent-a1"], capture_output=True, text=True, timeout=60,
                              check=False)
        assert told.returncode == 1, (action, told.stdout, told.stderr)
        assert "Traceback" not in told.stderr, told.stderr
        assert told.stderr.startswith(f"no pod {namespace}/review-agent-a1 to {action}"), told.stderr
        assert told.stderr.rstrip().endswith(f"(kubectl get pods -n {namespace} lists the run's pods)"), told.stderr
