"""A Queued run's position in its Kueue queue, as ``kubectl durablerun status`` prints it: read from Kueue's
visibility API (the real manager's, aggregated by the bed's API server) as the user, whose RBAC decides whether
they see it. Without the right to read it the position is unknown, said plainly, and the command still works."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import urllib.request
import uuid
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
import yaml

from durablerun import api
from durablerun_testbed import binaries, procs
from durablerun_testbed.kueue import Kueue
from durablerun_testbed.testbed import TestBed
from tests.helpers.clis import service_account_kubectl
from tests.helpers.kueue import wait_active
from tests.helpers.runs import RunEnv, StartOperator
from tests.helpers.session import SESSION_ID
from tests.kueue.helpers import apply, queued_run, queues

pytestmark = pytest.mark.testbed


def status(kubeconfig: Path, namespace: str, run: str) -> str:
    """``kubectl durablerun status RUN`` (the plugin's console script, with the bed's kubectl) as a user."""
    script = Path(sys.executable).parent / "kubectl-durablerun"
    result = subprocess.run([str(script), "--kubeconfig", str(kubeconfig), "-n", namespace, "status", run],
                            capture_output=True, text=True, timeout=60,
                            env={**os.environ, "KUBECTL": str(binaries.kubectl())})
    assert result.returncode == 0, result.stderr
    return result.stdout


def page(testbed: TestBed, namespace: str, run: str) -> dict[str, Any]:
    """What the run browser (`kubectl durablerun ui`, as the bed's admin) serves for a run's page."""
    port = procs.free_port()
    ui = procs.ManagedProcess(
        "ui", [sys.executable, "-m", "durablerun.kubectl", "--kubeconfig", str(testbed.kubeconfig), "-n", namespace,
               "ui", "--port", str(port)],
        log_path=testbed.root / "logs" / f"ui-{uuid.uuid4().hex[:6]}.log",
        env={**testbed.env(), "KUBECTL": str(binaries.kubectl())}, testbed_id=SESSION_ID)
    try:
        def fetch() -> dict[str, Any] | None:
            ui.check_alive()
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/api/runs/{namespace}/{run}", timeout=10) as r:
                    return dict(json.loads(r.read()))
            except OSError:
                return None

        answer: dict[str, Any] = procs.wait_for(fetch, timeout=60, what="the run browser's page of " + run)
        return answer
    finally:
        ui.stop()


def reader_kubeconfig(testbed: TestBed, namespace: str, directory: Path) -> Path:
    """A kubeconfig with a real token of a ServiceAccount that may only read the namespace's runs."""
    rbac = [
        {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": "reader", "namespace": namespace}},
        {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "Role",
         "metadata": {"name": "run-reader", "namespace": namespace},
         "rules": [{"apiGroups": [api.GROUP], "resources": [api.PLURAL], "verbs": ["get"]}]},
        binding(namespace, "Role", "run-reader"),
    ]
    testbed.kubectl("apply", "-f", "-", input=yaml.safe_dump_all(rbac))
    return service_account_kubectl(testbed, "reader", namespace, directory).kubeconfig


def binding(namespace: str, kind: str, role: str) -> dict[str, Any]:
    return {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding",
            "metadata": {"name": role, "namespace": namespace},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": kind, "name": role},
            "subjects": [{"kind": "ServiceAccount", "name": "reader", "namespace": namespace}]}


def workload_created(runs: RunEnv, run: str) -> datetime | None:
    out = runs.testbed.kubectl("get", "workloads.kueue.x-k8s.io", "-n", runs.namespace, "-l",
                               f"{api.LABEL_RUN}={run}", "-o", "json").stdout
    items = json.loads(out)["items"]
    return datetime.fromisoformat(items[0]["metadata"]["creationTimestamp"]) if items else None


def test_three_runs_queued_behind_a_full_quota_show_their_positions(
        kueue: Kueue, start_operator: StartOperator, runs: RunEnv, testbed: TestBed, tmp_path: Path) -> None:
    procs.wait_for(lambda: kueue.visibility_ready(testbed.kubectl), timeout=60,
                   what="Kueue's visibility API to be Available")
    apply(testbed, queues(f"cq-{uuid.uuid4().hex[:6]}", "lq", runs.namespace, cpu="500m"))  # one runner at a time
    wait_active(testbed, "localqueues.kueue.x-k8s.io", "lq", runs.namespace)
    start_operator(**{api.OperatorEnv.KUEUE: "true"})
    runs.apply(queued_run(runs, "first", "lq", steps=1, hold="s0"))
    procs.wait_for(lambda: runs.executions("first-s0") == 1, timeout=90, what="the first run to hold the quota")
    # A run in a queue that is not Queued shows its queue, no position.
    lines = status(testbed.kubeconfig, runs.namespace, "first").splitlines()
    assert lines[-1] == "queue: lq", lines  # after its progress and its attempt's lease
    assert not [line for line in lines if "position" in line], lines

    queued = ["q0", "q1", "q2"]
    for name in queued:
        runs.apply(queued_run(runs, name, "lq", steps=1, sleep=0.1))
        created = procs.wait_for(lambda name=name: workload_created(runs, name), timeout=60,
                                 what=f"the Workload of {name}")
        # Kueue orders equal priorities by creation time, which has one-second resolution: the next Workload is
        # created in a later second, so the order is the test's.
        procs.wait_for(lambda created=created: datetime.now(UTC).replace(microsecond=0) > created, timeout=5,
                       what="the next second")

    # As the bed's admin (every right): each run's place, 0 next.
    admin = testbed.kubeconfig
    for position, name in enumerate(queued):
        out = status(admin, runs.namespace, name)
        assert out.startswith(f"durablerun.durablerun.dev/{name} Queued"), out
        assert (f"queue: lq, position {position} in the LocalQueue and {position} in its ClusterQueue"
                in out), out

    # A user who may read runs but not Kueue's pending workloads: the position is unknown, and says why.
    reader = reader_kubeconfig(testbed, runs.namespace, tmp_path)
    out = status(reader, runs.namespace, "q1")
    assert out.startswith("durablerun.durablerun.dev/q1 Queued"), out
    assert "queue: lq, position unknown: Kueue's visibility API did not answer" in out, out
    assert "forbidden" in out, out
    # Kueue's own role for reading a LocalQueue's pending workloads (its batch users have it) is enough.
    testbed.kubectl("apply", "-f", "-", input=yaml.safe_dump(
        binding(runs.namespace, "ClusterRole", "kueue-pending-workloads-lq-viewer-role")))
    out = procs.wait_for(lambda: "position 1 in" in (out := status(reader, runs.namespace, "q1")) and out,
                         timeout=30, what="the reader to see q1's position")
    assert "queue: lq, position 1 in the LocalQueue and 1 in its ClusterQueue" in out, out

    # The run browser's page of a queued run shows the same line.
    assert page(testbed, runs.namespace, "q2")["queue"] == (
        "lq, position 2 in the LocalQueue and 2 in its ClusterQueue (the pending Workloads ahead of this run's)")

    # The quota frees: q0 is admitted and the others move up.
    (runs.ledger_dir / "release-first-s0").touch()
    procs.wait_for(lambda: "position 0 in" in status(admin, runs.namespace, "q1"), timeout=90,
                   what="q1 to be next once q0 is admitted")
    assert "position 1 in the LocalQueue" in status(admin, runs.namespace, "q2")
    kueue.check_alive()
