"""The real-node tier: a kubelet and containerd run the images built from deploy/images/.

One test bed for the session (``real_bed``): the control plane, kube-scheduler,
MinIO, containerd and the kubelet (hack/durablerun_testbed/realnode.py); the
chart installed with `helm install` as docs/install.md tells users, its
operator pod running the operator image; and a workflow image of this folder's
workflows built FROM the runner image with the one command users run for their
own (``hack/build-images.sh workflow DIR``).

If the machine cannot run the real node, the tier fails and says why. Set
DURABLERUN_SKIP_REAL_NODE=1 to skip it on purpose (the skip names itself).
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from durablerun import api
from durablerun_testbed import binaries, procs
from durablerun_testbed.realnode import RealNodeUnavailable, build_workflow_image, check_machine
from durablerun_testbed.testbed import TestBed
from tests.helpers.clis import Helm
from tests.helpers.session import SESSION_ID, skip_real_node_if_asked
from tests.realnode.helpers import OPERATOR_NAMESPACE, RELEASE, START_TIMEOUT_SECONDS, RealRuns

WORKFLOWS = Path(__file__).resolve().parent / "workflows"


@pytest.fixture(scope="session")
def real_bed(testbed_root: Path) -> Iterator[TestBed]:
    skip_real_node_if_asked()
    try:
        check_machine()
    except RealNodeUnavailable as error:
        pytest.fail(str(error), pytrace=False)
    bed = TestBed(testbed_root / "realnode", id=SESSION_ID).start(real_node=True)
    try:
        yield bed
    finally:
        bed.stop()


@pytest.fixture(scope="session")
def workflow_image(real_bed: TestBed) -> str:
    """This folder's workflows in an image FROM the runner image, built and put on the node."""
    archive, ref = build_workflow_image(WORKFLOWS)
    assert real_bed.real_node
    real_bed.real_node.import_image(archive)
    return ref


@pytest.fixture(scope="session")
def real_helm(real_bed: TestBed, testbed_root: Path) -> Helm:
    home = testbed_root / "realnode-helm"
    home.mkdir(exist_ok=True)
    return Helm(home, real_bed.kubeconfig)


@pytest.fixture(scope="session")
def chart_operator(real_bed: TestBed, real_helm: Helm) -> dict[str, Any]:
    """The chart installed as docs/install.md says, into a namespace enforcing `restricted`; its operator pod."""
    real_bed.kubectl("create", "namespace", OPERATOR_NAMESPACE)
    real_bed.kubectl("label", "namespace", OPERATOR_NAMESPACE, "pod-security.kubernetes.io/enforce=restricted")
    installed = real_helm("install", RELEASE, str(binaries.REPO_ROOT / "charts" / "durable-run"),
                          "--namespace", OPERATOR_NAMESPACE, "--set", "resyncSeconds=1",
                          "--set", f"startTimeoutSeconds={START_TIMEOUT_SECONDS}", "--wait", "--timeout=180s",
                          timeout=240, check=False)
    if installed.returncode != 0:
        pods = real_bed.kubectl("describe", "pods", "-n", OPERATOR_NAMESPACE, check=False).stdout
        logs = real_bed.kubectl("logs", "-n", OPERATOR_NAMESPACE, "-l", api.OPERATOR_SELECTOR,
                                "--tail=40", check=False)
        pytest.fail(f"helm install failed: {installed.stderr}\n{pods}\n{logs.stdout}{logs.stderr}", pytrace=False)
    pods = json.loads(real_bed.kubectl("get", "pods", "-n", OPERATOR_NAMESPACE, "-l",
                                       api.OPERATOR_SELECTOR, "-o", "json").stdout)["items"]
    assert len(pods) == 1, [p["metadata"]["name"] for p in pods]
    return dict(pods[0])


@pytest.fixture
def real_runs(real_bed: TestBed, chart_operator: dict[str, Any], workflow_image: str) -> Iterator[RealRuns]:
    assert real_bed.s3
    namespace = "t-" + uuid.uuid4().hex[:10]
    real_bed.kubectl("create", "namespace", namespace)
    real_bed.kubectl("label", "namespace", namespace, "pod-security.kubernetes.io/enforce=restricted")
    procs.wait_for(
        lambda: real_bed.kubectl("get", "serviceaccount", "default", "-n", namespace, check=False).returncode == 0,
        timeout=30, what=f"the default ServiceAccount in {namespace}",
    )
    bucket = real_bed.s3.create_bucket("t-" + uuid.uuid4().hex[:16])
    real_bed.kubectl("create", "secret", "generic", "s3-credentials", "-n", namespace,
                     f"--from-literal=AWS_ACCESS_KEY_ID={real_bed.s3.access_key}",
                     f"--from-literal=AWS_SECRET_ACCESS_KEY={real_bed.s3.secret_key}")
    yield RealRuns(real_bed, namespace, bucket, workflow_image)
    real_bed.kubectl("delete", "namespace", namespace, "--wait=false", check=False)
