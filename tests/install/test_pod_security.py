"""The chart's operator pod and the operator's runner pods pass the `restricted` Pod Security Standard.

The API server's PodSecurity admission decides, in a namespace labelled
`pod-security.kubernetes.io/enforce=restricted`, on pods created with
--dry-run=server (the installed chart's and a real run's pods are admitted for
real in test_operator_in_chart.py).
"""

from __future__ import annotations

import copy
import json
from typing import Any

import pytest

from durablerun import api
from durablerun_operator import builders
from durablerun_operator.config import Settings
from durablerun_testbed.testbed import TestBed
from tests.helpers.clis import Helm, Kubectl

from .helpers import full_values, of_kind

pytestmark = pytest.mark.testbed


@pytest.fixture
def restricted(testbed: TestBed, namespace: str) -> str:
    testbed.kubectl("label", "namespace", namespace, "pod-security.kubernetes.io/enforce=restricted",
                    "pod-security.kubernetes.io/enforce-version=latest")
    return namespace


def operator_pods(helm: Helm, admin: Kubectl, namespace: str, full: bool = True) -> list[dict[str, Any]]:
    """The chart's pods (the operator's; with full values the webhook ingress's too), their ServiceAccounts created."""
    pods = []
    for values in (None, full_values([namespace])) if full else (None,):
        objects = helm.template("durable-run", namespace, values)
        for account in of_kind(objects, "ServiceAccount"):
            admin("apply", "-f", "-", input=json.dumps(account))
        for deployment in of_kind(objects, "Deployment"):
            template = deployment["spec"]["template"]
            pods.append({"apiVersion": "v1", "kind": "Pod",
                         "metadata": {**template["metadata"], "generateName": "operator-", "namespace": namespace},
                         "spec": template["spec"]})
    return pods


def runner_pod(admin: Kubectl, namespace: str) -> dict[str, Any]:
    """Attempt 1's pod of a run, as the operator builds it."""
    run = {"apiVersion": api.API_VERSION, "kind": "DurableRun",
           "metadata": {"name": "psa", "namespace": namespace},
           "spec": {"workflow": "agents.research:run",
                    "checkpoint": {"uri": "s3://runs/prefix", "credentialsSecret": "s3"},
                    "template": {"spec": {"containers": [{"name": "runner", "image": "registry.example/agents:1"}]}}}}
    admin("apply", "-f", "-", input=json.dumps(run))
    stored = json.loads(admin("get", "dr", "psa", "-n", namespace, "-o", "json").stdout)
    for rbac_object in builders.runner_rbac(stored, Settings()):
        admin("apply", "-f", "-", input=json.dumps(rbac_object))
    return builders.runner_pod(stored, 1, Settings())


def admitted(admin: Kubectl, pod: dict[str, Any]) -> tuple[bool, str]:
    result = admin("create", "--dry-run=server", "-f", "-", input=json.dumps(pod), check=False)
    return result.returncode == 0, result.stderr


def test_restricted_namespace_admits_the_operator_and_runner_pods(
    helm: Helm, admin: Kubectl, restricted: str
) -> None:
    for pod in [*operator_pods(helm, admin, restricted), runner_pod(admin, restricted)]:
        ok, error = admitted(admin, pod)
        assert ok, f"{pod['metadata'].get('name') or pod['metadata']['generateName']}: {error}"


@pytest.mark.parametrize(
    ("change", "violation"),
    [
        (lambda pod: pod["spec"].pop("securityContext"), "runAsNonRoot != true"),
        (lambda pod: pod["spec"]["containers"][0]["securityContext"].pop("allowPrivilegeEscalation"),
         "allowPrivilegeEscalation != false"),
        (lambda pod: pod["spec"]["containers"][0]["securityContext"].pop("capabilities"), "unrestricted capabilities"),
    ],
    ids=["no-pod-security-context", "privilege-escalation", "capabilities"],
)
def test_restricted_namespace_refuses_the_operator_pod_without_its_security_context(
    helm: Helm, admin: Kubectl, restricted: str, change: Any, violation: str
) -> None:
    """The control: the namespace really enforces, and each part of the chart's security context counts."""
    pod = copy.deepcopy(operator_pods(helm, admin, restricted, full=False)[0])
    change(pod)
    ok, error = admitted(admin, pod)
    assert not ok
    assert 'violates PodSecurity "restricted:latest"' in error, error
    assert violation in error, error
