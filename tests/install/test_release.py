"""`make release` (hack/release.py): the artifacts a release publishes, and the packaged chart installs
with its images pinned by the digests of the image archives built beside it."""

from __future__ import annotations

import hashlib
import json
import subprocess
import sys
import tarfile
import uuid
from pathlib import Path

import pytest
import yaml

from durablerun import api
from tests.helpers.clis import CHART, Helm, Kubectl

from .helpers import DEPLOY, REPO

pytestmark = pytest.mark.testbed


@pytest.fixture(scope="module")
def dist(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("release") / "dist"
    result = subprocess.run([sys.executable, str(REPO / "hack" / "release.py"), "--dist", str(out)],
                            capture_output=True, text=True, timeout=900, check=False)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    return out


def index(archive: Path) -> dict[str, object]:
    with tarfile.open(archive) as tar:
        member = tar.extractfile("index.json")
        assert member is not None
        return dict(json.load(member))


def packaged(dist: Path, name: str) -> str:
    (chart,) = dist.glob("durable-run-*.tgz")
    with tarfile.open(chart) as tar:
        member = tar.extractfile(f"durable-run/{name}")
        assert member is not None, name
        return member.read().decode()


def test_the_release_holds_packages_images_chart_and_checksums(dist: Path) -> None:
    version = yaml.safe_load((CHART / "Chart.yaml").read_text())["appVersion"]
    names = {str(p.relative_to(dist)) for p in dist.rglob("*") if p.is_file()}
    assert names == {f"durable_run-{version}-py3-none-any.whl", f"durable_run-{version}.tar.gz",
                     f"durable-run-{version}.tgz", f"images/operator-{version}.oci.tar",
                     f"images/runner-{version}.oci.tar", "SHA256SUMS"}
    for line in (dist / "SHA256SUMS").read_text().splitlines():
        digest, name = line.split("  ")
        assert hashlib.sha256((dist / name).read_bytes()).hexdigest() == digest, name

    chart = yaml.safe_load(packaged(dist, "Chart.yaml"))
    assert chart["kubeVersion"] == ">=1.30.0-0"
    assert chart["icon"].startswith("https://")
    assert (REPO / "docs" / Path(chart["icon"]).name).exists()  # the icon the URL points at is in the repo
    readme = packaged(dist, "README.md")
    for key in yaml.safe_load((CHART / "values.yaml").read_text()):
        assert f"`{key}" in readme, f"the chart's README does not document {key}"


def test_the_packaged_chart_pins_the_built_images_and_installs(dist: Path, helm: Helm, admin: Kubectl) -> None:
    version = yaml.safe_load((CHART / "Chart.yaml").read_text())["appVersion"]
    digests = {}
    for name in ("operator", "runner"):
        (manifest,) = index(dist / "images" / f"{name}-{version}.oci.tar")["manifests"]  # type: ignore[misc]
        assert manifest["mediaType"] == "application/vnd.oci.image.manifest.v1+json"
        assert manifest["annotations"]["org.opencontainers.image.ref.name"] == f"ghcr.io/durable-run/{name}:{version}"
        digests[name] = manifest["digest"]
    values = yaml.safe_load(packaged(dist, "values.yaml"))
    assert (values["image"]["digest"], values["runner"]["image"]["digest"]) == (digests["operator"],
                                                                                digests["runner"])

    # Installs from the .tgz (the session's test bed holds the CRD already: the release leaves it alone).
    namespace = "rel-" + uuid.uuid4().hex[:6]
    (chart,) = dist.glob("durable-run-*.tgz")
    helm("install", "released", str(chart), "--namespace", namespace, "--create-namespace",
         "--set", "crds.enabled=false")
    try:
        deployment = json.loads(admin("get", "deployment", "-n", namespace, "-o", "json").stdout)["items"][0]
        (container,) = deployment["spec"]["template"]["spec"]["containers"]
        assert container["image"] == f"ghcr.io/durable-run/operator@{digests['operator']}"
        env = {e["name"]: e.get("value") for e in container["env"]}
        assert f"ghcr.io/durable-run/runner@{digests['runner']}" in env.values(), env
    finally:
        helm("uninstall", "released", "--namespace", namespace, "--wait")
        admin("delete", "namespace", namespace, "--wait=false")


def test_the_kustomize_base_is_not_labelled_as_helm_managed() -> None:
    text = (DEPLOY / "operator" / "durable-run.yaml").read_text()
    assert "managed-by: Helm" not in text
    assert f"{api.LABEL_MANAGED_BY}: kustomize" in text
