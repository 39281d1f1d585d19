"""The real Kueue manager in the test bed: its webhooks and conversion are served, its queues become active."""

from __future__ import annotations

import json
import subprocess
import uuid

import pytest

from durablerun import api
from durablerun_testbed import procs
from durablerun_testbed.kueue import NAMESPACE, SERVICE_ACCOUNT, Kueue
from durablerun_testbed.testbed import TestBed
from tests.helpers.kueue import wait_active
from tests.helpers.session import REPO
from tests.kueue.helpers import apply, queues


def test_queues_become_active_and_kueue_webhooks_answer(testbed: TestBed, kueue: Kueue, namespace: str) -> None:
    suffix = uuid.uuid4().hex[:6]
    apply(testbed, queues(f"cq-{suffix}", "lq", namespace, cpu="2", flavor=f"flavor-{suffix}"))
    wait_active(testbed, "clusterqueues.kueue.x-k8s.io", f"cq-{suffix}")
    wait_active(testbed, "localqueues.kueue.x-k8s.io", "lq", namespace)

    # Kueue's mutating webhook defaulted the ClusterQueue (its queueing strategy), and the API server reads the
    # LocalQueue back in the older version through Kueue's conversion webhook.
    cq = json.loads(testbed.kubectl("get", "clusterqueues.kueue.x-k8s.io", f"cq-{suffix}", "-o", "json").stdout)
    assert cq["spec"]["queueingStrategy"] == "BestEffortFIFO"
    old = json.loads(testbed.kubectl("get", "localqueues.v1beta1.kueue.x-k8s.io", "lq", "-n", namespace,
                                     "-o", "json").stdout)
    assert old["apiVersion"] == "kueue.x-k8s.io/v1beta1"
    assert old["spec"]["clusterQueue"] == f"cq-{suffix}"

    # Kueue's validating webhook itself (not the CRD's schema) refuses a negative quota.
    bad = queues(f"cq-bad-{suffix}", "lq-bad", namespace, cpu="-1", flavor=f"flavor-{suffix}")[1]
    with pytest.raises(subprocess.CalledProcessError) as refused:
        apply(testbed, [bad])
    assert 'admission webhook "vclusterqueue.kb.io" denied the request' in refused.value.stderr
    kueue.check_alive()


def test_the_documented_sample_queues_become_active(testbed: TestBed, kueue: Kueue, namespace: str) -> None:
    sample = REPO / "deploy" / "samples" / "kueue" / "queues.yaml"
    testbed.kubectl("apply", "--server-side", "-n", namespace, "-f", str(sample))
    wait_active(testbed, "clusterqueues.kueue.x-k8s.io", "durablerun-runners")
    wait_active(testbed, "localqueues.kueue.x-k8s.io", "agents", namespace)


def test_the_manager_runs_with_its_release_rbac_alone_and_needs_no_right_on_durableruns(
        testbed: TestBed, kueue: Kueue) -> None:
    """Least privilege: the manager is the ServiceAccount its release binds, and Kueue's own roles are all it has.
    Every test in this folder admits and preempts DurableRuns with it; none of that needs a right on them."""
    assert kueue.manager_kubeconfig is not None
    user = f"system:serviceaccount:{NAMESPACE}:{SERVICE_ACCOUNT}"
    whoami = testbed.kubectl("--kubeconfig", str(kueue.manager_kubeconfig), "auth", "whoami", "-o", "json")
    assert json.loads(whoami.stdout)["status"]["userInfo"]["username"] == user

    def can(verb: str, resource: str) -> bool:
        answer = testbed.kubectl("auth", "can-i", verb, resource, "--all-namespaces", f"--as={user}", check=False)
        return answer.stdout.strip() == "yes"

    assert can("update", "workloads.kueue.x-k8s.io")
    assert can("update", "workloads.kueue.x-k8s.io/status")
    assert not can("get", f"{api.PLURAL}.{api.GROUP}")
    assert not can("update", f"{api.PLURAL}.{api.GROUP}")
    assert not can("create", "secrets")  # only the certificate Secret's namespace, through a Role
    kueue.check_alive()
    assert "is forbidden" not in (kueue.workdir / "kueue.log").read_text()


def test_the_visibility_api_is_served_through_the_api_server(testbed: TestBed, kueue: Kueue, namespace: str) -> None:
    """Kueue's on-demand visibility API, aggregated: the API server proxies to the manager's visibility server
    (front-proxy certificates, an ExternalName Service to localhost), verifying it with the CA in the APIService.
    That CA signed only the certificate seeded in the manager's own working directory, so this also shows the
    server read its certificates there, not from the host's /visibility."""
    procs.wait_for(lambda: kueue.visibility_ready(testbed.kubectl), timeout=60,
                   what="the APIService of Kueue's visibility API to be Available")
    suffix = uuid.uuid4().hex[:6]
    apply(testbed, queues(f"cq-{suffix}", "lq", namespace, cpu="1", flavor=f"flavor-{suffix}"))
    wait_active(testbed, "localqueues.kueue.x-k8s.io", "lq", namespace)
    pending = f"/apis/visibility.kueue.x-k8s.io/v1beta2/namespaces/{namespace}/localqueues/lq/pendingworkloads"
    summary = json.loads(testbed.kubectl("get", "--raw", pending).stdout)
    assert (summary["kind"], summary["items"]) == ("PendingWorkloadsSummary", [])
    kueue.check_alive()
