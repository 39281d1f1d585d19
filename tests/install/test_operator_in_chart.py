"""`helm install` on the test bed: the process node runs the chart's operator pod, and a run survives a crash.

The operator runs as the chart deploys it: its command, its environment, its
ServiceAccount's bound token (in-cluster config), its RBAC, a read-only root
filesystem, in a namespace that enforces the `restricted` Pod Security
Standard, like the runner pods it starts there.

One difference, stated: the chart's pods run as uid 65532, but the process node
runs their command with this machine's venv, whose interpreter may live where
only root can execute it (a pyenv Python under /root, mode 0700). So this test
drops runAsUser/runAsGroup from the pod's security context (runAsNonRoot and
seccomp stay, so the pod is still `restricted`) and the process node runs the
operator as its own user, as it runs the runner pods, which set no uid.
"""

from __future__ import annotations

import json
import urllib.request
from collections import Counter
from pathlib import Path
from typing import Any

import boto3
import pytest

from durablerun import api
from durablerun_testbed import procs
from durablerun_testbed.testbed import TestBed
from tests.helpers.clis import Helm, Kubectl

pytestmark = pytest.mark.testbed

WORKFLOWS = Path(__file__).resolve().parent / "workflows"
# The runner reports progress with its renewals (every 2 s for this run's 6 s lease): steps are still left to
# run when the status has shown two journaled and the test kills the pod.
STEPS = 12


def test_chart_operator_runs_a_run_through_a_crash(
    testbed: TestBed, helm: Helm, admin: Kubectl, namespace: str, s3_bucket: str
) -> None:
    assert testbed.s3
    assert testbed.node
    admin("label", "namespace", namespace, "pod-security.kubernetes.io/enforce=restricted")
    metrics_port, health_port = procs.free_port(), procs.free_port()
    release = f"durable-run-{namespace}"
    helm.install(release, namespace, {
        "crds": {"enabled": False},  # the session's test bed installed the CRD already
        "watchNamespaces": [namespace],  # this test's runs only
        "metrics": {"port": metrics_port}, "health": {"port": health_port},
        "resyncSeconds": 0.5,
        "podSecurityContext": {"runAsUser": None, "runAsGroup": None},  # null removes a default in Helm
    }, "--wait", "--timeout=90s")
    operator_pod = json.loads(admin("get", "pods", "-n", namespace, "-l", api.OPERATOR_SELECTOR,
                                    "-o", "json").stdout)["items"]
    assert [p["status"]["phase"] for p in operator_pod] == ["Running"]

    def healthy() -> bool:
        with urllib.request.urlopen(f"http://127.0.0.1:{health_port}/healthz", timeout=2) as reply:
            return bool(reply.status == 200)

    procs.wait_for(healthy, timeout=60, what="the chart's operator to answer /healthz")

    admin("create", "secret", "generic", "s3-credentials", "-n", namespace,
          f"--from-literal=AWS_ACCESS_KEY_ID={testbed.s3.access_key}",
          f"--from-literal=AWS_SECRET_ACCESS_KEY={testbed.s3.secret_key}")
    run = {
        "apiVersion": api.API_VERSION, "kind": "DurableRun",
        "metadata": {"name": "charted", "namespace": namespace},
        "spec": {
            "workflow": "install_flows:steps",
            "input": {"steps": STEPS, "sleep": 0.5, "bucket": s3_bucket, "endpoint": testbed.s3.endpoint_url},
            "checkpoint": {"uri": f"s3://{s3_bucket}/runs", "endpoint": testbed.s3.endpoint_url,
                           "region": "us-east-1", "credentialsSecret": "s3-credentials"},
            "policy": {"leaseDuration": "6s", "backoff": {"initial": "1s", "max": "2s"}},
            "template": {"spec": {"containers": [{
                "name": "runner", "env": [{"name": "PYTHONPATH", "value": str(WORKFLOWS)}]}]}},
        },
    }
    admin("apply", "-f", "-", input=json.dumps(run))

    def status() -> dict[str, Any]:
        return dict(json.loads(admin("get", "dr", "charted", "-n", namespace, "-o", "json").stdout).get("status")
                    or {})

    def two_steps_done() -> dict[str, Any] | None:
        current = status()
        return current if (current.get("progress") or {}).get("completedSteps", 0) >= 2 else None

    first = procs.wait_for(two_steps_done, timeout=90, what="the run to complete two steps in its first pod")
    testbed.node.kill(namespace, str(first["pod"]))
    admin("wait", "dr/charted", "-n", namespace, "--for=jsonpath={.status.phase}=Succeeded", "--timeout=120s",
          timeout=150)
    final = status()
    assert final["restarts"] == 1
    assert final["attempt"] == 2
    assert final["pod"] != first["pod"]

    # Steps journaled before the crash ran once, in the first attempt; the second attempt carried on.
    s3 = boto3.client("s3", endpoint_url=testbed.s3.endpoint_url, region_name="us-east-1",
                      aws_access_key_id=testbed.s3.access_key, aws_secret_access_key=testbed.s3.secret_key)
    keys = [o["Key"] for o in s3.list_objects_v2(Bucket=s3_bucket, Prefix="executions/").get("Contents", [])]
    runs_of = Counter(key.split("/")[1] for key in keys)
    assert runs_of["s0"] == runs_of["s1"] == 1, keys
    assert all(runs_of[f"s{i}"] >= 1 for i in range(STEPS)), keys
    assert sum(runs_of.values()) <= STEPS + 1, f"more than the in-flight step ran twice: {keys}"
    assert any(key.startswith(f"executions/s{STEPS - 1}/2-") for key in keys), keys

    # Runs go first (the operator removes their finalizers), then the release: nothing of it stays running.
    admin("delete", "dr", "charted", "-n", namespace, "--timeout=60s")
    helm("uninstall", release, "-n", namespace, "--wait", "--timeout=90s")
    procs.wait_for(lambda: admin("get", "deployments,replicasets,pods,serviceaccounts,roles,rolebindings,services",
                                 "-n", namespace, "-l", f"app.kubernetes.io/instance={release}", "-o", "name",
                                 ).stdout == "" or None,
                   timeout=60, interval=0.5, what="the release's objects and the operator pod to be gone")
