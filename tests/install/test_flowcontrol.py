"""The chart's API Priority and Fairness objects, classified by the real API server.

Every response of a kube-apiserver names the priority level that served the request
(``X-Kubernetes-PF-PriorityLevel-UID``): the test asks as a runner and as the operator, with real
ServiceAccount tokens, and reads which level each request went to.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes import client, config

from durablerun import api
from durablerun_operator import builders
from durablerun_operator.config import Settings
from durablerun_testbed.testbed import TestBed
from tests.helpers.clis import CHART, Helm, Kubectl, service_account_kubectl

pytestmark = pytest.mark.testbed

PF_LEVEL = "X-Kubernetes-PF-PriorityLevel-UID"


@pytest.fixture
def release(helm: Helm, admin: Kubectl, namespace: str) -> Iterator[str]:
    """The chart's operator ServiceAccount, its RBAC and flow-control objects applied (nothing runs)."""
    name = "pf-" + uuid.uuid4().hex[:6]
    rendered = helm("template", name, str(CHART), "--namespace", namespace,
                    "--show-only", "templates/serviceaccount.yaml", "--show-only", "templates/rbac-operator.yaml",
                    "--show-only", "templates/flowcontrol.yaml").stdout
    applied = admin("apply", "-f", "-", input=rendered, check=False)
    assert applied.returncode == 0, applied.stderr
    yield name
    admin("delete", "--ignore-not-found", "--wait=false", "-f", "-", input=rendered, check=False)


def level_uids(admin: Kubectl, release: str) -> dict[str, str]:
    levels = json.loads(admin("get", "prioritylevelconfigurations", "-o", "json").stdout)["items"]
    prefix = f"{release}-durable-run-"
    return {p["metadata"]["uid"]: p["metadata"]["name"].removeprefix(prefix)
            for p in levels if p["metadata"]["name"].startswith(prefix)}


def api_client(kubectl: Kubectl) -> client.ApiClient:
    return config.new_client_from_config(config_file=str(kubectl.kubeconfig))


def served_by(levels: dict[str, str], headers: Any) -> str:
    return levels.get(headers.get(PF_LEVEL, ""), f"another level ({headers.get(PF_LEVEL)})")


def test_renewals_and_the_operators_reads_have_levels_of_their_own_and_starts_queue_behind(
    testbed: TestBed, admin: Kubectl, release: str, namespace: str, tmp_path: Path
) -> None:
    levels = level_uids(admin, release)
    assert sorted(levels.values()) == ["operator", "renewals", "starts"]
    run = {"apiVersion": api.API_VERSION, "kind": api.KIND, "metadata": {"name": "mine", "namespace": namespace},
           "spec": {"workflow": "agents.research:run", "checkpoint": {"uri": "s3://runs/prefix"}}}
    admin("apply", "-f", "-", input=json.dumps(run))
    stored = yaml.safe_load(admin("get", "dr", "mine", "-n", namespace, "-o", "yaml").stdout)
    admin("apply", "-f", "-", input=json.dumps({"apiVersion": "v1", "kind": "List",
                                               "items": builders.runner_rbac(stored, Settings())}))

    runner = client.CustomObjectsApi(api_client(
        service_account_kubectl(testbed, api.RUNNER_ACCOUNT, namespace, tmp_path)))
    _, _, headers = runner.get_namespaced_custom_object_with_http_info(
        api.GROUP, api.VERSION, namespace, api.PLURAL, "mine")
    assert served_by(levels, headers) == "renewals"
    _, _, headers = runner.get_namespaced_custom_object_status_with_http_info(
        api.GROUP, api.VERSION, namespace, api.PLURAL, "mine")
    assert served_by(levels, headers) == "renewals"

    operator_config = api_client(service_account_kubectl(testbed, f"{release}-durable-run", namespace, tmp_path))
    operator = client.CustomObjectsApi(operator_config)
    _, _, headers = operator.list_namespaced_custom_object_with_http_info(api.GROUP, api.VERSION, namespace,
                                                                          api.PLURAL)
    assert served_by(levels, headers) == "operator"
    pod = builders.runner_pod(stored, 1, Settings())
    _, _, headers = client.CoreV1Api(operator_config).create_namespaced_pod_with_http_info(
        namespace, pod, dry_run="All")
    assert served_by(levels, headers) == "starts"
