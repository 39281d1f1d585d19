"""Install, upgrade and uninstall on a cluster of their own; `kubectl apply -k deploy/` installs the same.

These tests need a cluster whose CRD nobody else owns (the session's test bed
installs the CRD itself), so they start a control plane of their own, without a
node: the operator's pod stays Pending, which is all an install needs.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from durablerun import api
from durablerun_testbed import procs
from durablerun_testbed.s3 import S3Server
from durablerun_testbed.testbed import TestBed
from tests.helpers.clis import CHART, Helm, Kubectl, parse
from tests.helpers.session import SESSION_ID

from .helpers import DEPLOY

pytestmark = pytest.mark.testbed

# Objects that come and go by themselves: events expire after an hour, leases are renewed.
TRANSIENT = {"events", "events.events.k8s.io", "leases.coordination.k8s.io"}
Identity = tuple[str, str, str]  # (resource, namespace, name)


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory, s3_server: S3Server) -> Iterator[TestBed]:
    bed = TestBed(tmp_path_factory.mktemp("install-cluster"), id=SESSION_ID).start(s3=s3_server, node=False)
    try:
        yield bed
    finally:
        bed.stop()


@pytest.fixture
def kubectl(cluster: TestBed) -> Kubectl:
    return Kubectl(cluster.kubeconfig)


@pytest.fixture
def helm(tmp_path: Path, cluster: TestBed) -> Helm:
    home = tmp_path / "helm"
    home.mkdir()
    return Helm(home, cluster.kubeconfig)


def everything(kubectl: Kubectl) -> set[Identity]:
    """Every object of every listable kind in the cluster (but the transient ones), by identity."""
    kinds = kubectl("api-resources", "--verbs=list", "-o", "name").stdout.split()
    kinds = [k for k in kinds if k not in TRANSIENT]
    listed = json.loads(kubectl("get", ",".join(kinds), "--all-namespaces", "-o", "json").stdout)["items"]
    return {(o["kind"], o["metadata"].get("namespace", ""), o["metadata"]["name"]) for o in listed}


def settles_to(kubectl: Kubectl, expected: set[Identity], what: str) -> None:
    """Wait until the cluster holds exactly ``expected`` (garbage collection is asynchronous)."""
    def settled() -> bool:
        return everything(kubectl) == expected

    try:
        procs.wait_for(settled, timeout=60, interval=0.5, what=what)
    except procs.Timeout:
        now = everything(kubectl)
        raise AssertionError(f"{what}: left behind {sorted(now - expected)}, missing {sorted(expected - now)}") \
            from None


def test_helm_install_upgrade_uninstall_leaves_only_what_is_kept(helm: Helm, kubectl: Kubectl,
                                                                 cluster: TestBed) -> None:
    # Not deploy/'s namespace, which the kustomize test creates and deletes.
    kubectl("create", "namespace", "dr-system")
    kubectl("create", "namespace", "agents")
    procs.wait_for(lambda: kubectl("get", "sa", "default", "-n", "agents", check=False).returncode == 0,
                   timeout=30, what="the namespaces' default ServiceAccounts")
    before = everything(kubectl)

    notes = helm.install("durable-run", "dr-system")
    assert "kubectl -n dr-system rollout status deployment/durable-run" in notes
    assert "kubectl -n $NS get durableruns -w" in notes
    installed = everything(kubectl) - before
    assert {kind for kind, _, _ in installed} >= {
        "CustomResourceDefinition", "ServiceAccount", "ClusterRole", "ClusterRoleBinding", "Deployment", "Service"}
    # The user-facing roles are aggregated into the built-in ones.
    def view_covers_runs() -> bool:
        rules = json.loads(kubectl("get", "clusterrole", "view", "-o", "json").stdout)["rules"]
        return any("durableruns" in rule.get("resources", []) for rule in rules)

    procs.wait_for(view_covers_runs, timeout=30, what="the view ClusterRole to aggregate durableruns")

    cluster.wait_established(timeout=30)
    run = {"apiVersion": api.API_VERSION, "kind": "DurableRun", "metadata": {"name": "kept"},
           "spec": {"workflow": "agents.research:run", "checkpoint": {"uri": "s3://runs/prefix"}}}
    kubectl("apply", "-n", "agents", "-f", "-", input=json.dumps(run))

    # An upgrade that changes the operator's settings and switches the user roles off.
    helm("upgrade", "durable-run", str(CHART), "-n", "dr-system", "--reuse-values",
         "--set", "logLevel=DEBUG", "--set", "rbac.aggregateClusterRoles=false")
    deployment = json.loads(kubectl("get", "deployment", "durable-run", "-n", "dr-system", "-o", "json").stdout)
    env = {e["name"]: e.get("value") for e in deployment["spec"]["template"]["spec"]["containers"][0]["env"]}
    assert env[api.OperatorEnv.LOG_LEVEL] == "DEBUG"
    assert kubectl("get", "clusterrole", "durable-run-viewer", check=False).returncode != 0

    # Uninstall: what docs/install.md says stays is the CRDs (crds.keep) and with them every run.
    helm("uninstall", "durable-run", "-n", "dr-system", "--wait")
    kept = {("CustomResourceDefinition", "", api.CRD_NAME), ("DurableRun", "agents", "kept"),
            ("CustomResourceDefinition", "", api.QUOTA_CRD_NAME),
            ("CustomResourceDefinition", "", api.SCHEDULE_CRD_NAME),
            ("ValidatingAdmissionPolicy", "", api.CRD_NAME),
            ("ValidatingAdmissionPolicyBinding", "", api.CRD_NAME),
            ("ValidatingAdmissionPolicy", "", f"{api.PLURAL}-status.{api.GROUP}"),
            ("ValidatingAdmissionPolicyBinding", "", f"{api.PLURAL}-status.{api.GROUP}"),
            ("APIService", "", f"{api.VERSION}.{api.GROUP}")}  # the API server's own registration of the CRD
    settles_to(kubectl, before | kept, "helm uninstall with crds.keep")

    # Installing again adopts the kept CRD; with crds.keep=false, uninstalling deletes it and every run.
    helm.install("durable-run", "dr-system", {"crds": {"keep": False}})
    helm("uninstall", "durable-run", "-n", "dr-system", "--wait")
    settles_to(kubectl, before, "helm uninstall with crds.keep=false")


def test_kustomize_base_installs_what_the_chart_does(helm: Helm, kubectl: Kubectl) -> None:
    """`kubectl apply -k deploy/` creates the objects `helm install` would, and `delete -k` removes them."""
    before = everything(kubectl)
    rendered = parse(kubectl("kustomize", str(DEPLOY)).stdout)
    charted = helm.template("durable-run", "durable-run")
    identity = {(o["kind"], o["metadata"].get("namespace", ""), o["metadata"]["name"]) for o in charted}
    assert {(o["kind"], o["metadata"].get("namespace", ""), o["metadata"]["name"]) for o in rendered} == identity | {
        ("Namespace", "", "durable-run")}

    kubectl("apply", "-k", str(DEPLOY))
    assert everything(kubectl) >= before | identity
    namespace = json.loads(kubectl("get", "namespace", "durable-run", "-o", "json").stdout)
    assert namespace["metadata"]["labels"]["pod-security.kubernetes.io/enforce"] == "restricted"
    kubectl("delete", "-k", str(DEPLOY), "--wait=true", timeout=120)
    settles_to(kubectl, before, "kubectl delete -k deploy/")
