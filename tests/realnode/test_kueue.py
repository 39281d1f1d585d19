"""Admission through Kueue on the real node: a queued run is admitted by a real Kueue manager, its pod carries the
flavor's node labels and tolerations, and it runs to Succeeded in a real container (the chart's operator, with
``kueue.enabled``)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from durablerun import api
from durablerun_testbed import binaries, procs
from durablerun_testbed.kueue import Kueue
from durablerun_testbed.testbed import TestBed
from tests.helpers.clis import Helm
from tests.helpers.kueue import V1BETA2, wait_active
from tests.helpers.session import SESSION_ID
from tests.realnode.helpers import OPERATOR_NAMESPACE, RELEASE, RealRuns

TOLERATION = {"key": "example.com/runners", "operator": "Exists", "effect": "NoSchedule"}


def _operator(real_bed: TestBed, real_helm: Helm, kueue_on: bool) -> None:
    real_helm("upgrade", RELEASE, str(binaries.REPO_ROOT / "charts" / "durable-run"), "--namespace",
              OPERATOR_NAMESPACE, "--reuse-values", "--set", f"kueue.enabled={str(kueue_on).lower()}",
              "--wait", "--timeout=180s", timeout=240)
    real_bed.kubectl("rollout", "status", "deployment", "-n", OPERATOR_NAMESPACE, "--timeout=180s", timeout=200)


@pytest.fixture(scope="module")
def kueue(real_bed: TestBed, testbed_root: Path, real_helm: Helm, chart_operator: object) -> Iterator[Kueue]:
    manager = Kueue(testbed_root / "realnode-kueue", SESSION_ID, real_bed.kubeconfig).start(real_bed.kubectl)
    try:
        _operator(real_bed, real_helm, True)
        yield manager
    finally:
        manager.stop()
        _operator(real_bed, real_helm, False)  # the session's other real-node tests expect the chart as installed


@pytest.mark.timeout(900)  # it may be the first to need the session's real node: its start counts here
def test_a_queued_run_is_admitted_placed_on_its_flavor_and_succeeds_in_a_real_container(
        real_bed: TestBed, kueue: Kueue, real_runs: RealRuns) -> None:
    node = json.loads(real_bed.kubectl("get", "node", "realnode", "-o", "json").stdout)
    hostname = {"kubernetes.io/hostname": node["metadata"]["labels"]["kubernetes.io/hostname"]}
    objects = [
        {"apiVersion": V1BETA2, "kind": "ResourceFlavor", "metadata": {"name": "realnode-flavor"},
         "spec": {"nodeLabels": hostname, "tolerations": [TOLERATION]}},
        {"apiVersion": V1BETA2, "kind": "ClusterQueue", "metadata": {"name": "realnode-cq"},
         "spec": {"namespaceSelector": {}, "resourceGroups": [{"coveredResources": ["cpu"], "flavors": [
             {"name": "realnode-flavor", "resources": [{"name": "cpu", "nominalQuota": "1"}]}]}]}},
        {"apiVersion": V1BETA2, "kind": "LocalQueue", "metadata": {"name": "lq", "namespace": real_runs.namespace},
         "spec": {"clusterQueue": "realnode-cq"}}]
    real_bed.kubectl("apply", "--server-side", "-f", "-", input="\n---\n".join(json.dumps(o) for o in objects))
    wait_active(real_bed, "localqueues.kueue.x-k8s.io", "lq", real_runs.namespace, timeout=120)

    manifest = real_runs.manifest("queued", "realnode_flows:steps", {"steps": 3, "sleep": 0.2},
                                  resources={"requests": {"cpu": "200m"}})
    manifest["metadata"]["labels"] = {api.LABEL_QUEUE_NAME: "lq"}
    real_runs.apply(manifest)
    status = real_runs.wait_phase("queued", "Succeeded", "Failed", "Aborted", timeout=240)
    assert status["phase"] == "Succeeded", status
    assert real_runs.executions() == {"s0": 1, "s1": 1, "s2": 1}

    pod = real_runs.pod(status["pod"])
    assert pod["spec"]["nodeName"] == "realnode"
    assert pod["spec"]["nodeSelector"].items() >= hostname.items()
    assert TOLERATION in pod["spec"]["tolerations"]
    assert pod["status"]["containerStatuses"][0]["state"]["terminated"]["exitCode"] == 0
    reasons = [e["reason"] for e in json.loads(real_runs.kubectl(
        "get", "events", "--field-selector", "involvedObject.name=queued", "-o", "json"))["items"]]
    assert "Queued" in reasons
    procs.wait_for(lambda: real_runs.kubectl("get", "workloads.kueue.x-k8s.io", "-o", "name").strip() == "",
                   timeout=60, what="the run's Workload to be released")
