"""The peer linters of `make lint` (hack/lint_manifests.py) pass on the repository and catch what they exist for."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import pytest

from durablerun import api

from .helpers import REPO

SCRIPT = REPO / "hack" / "lint_manifests.py"


@pytest.fixture(scope="module")
def lint() -> ModuleType:
    spec = importlib.util.spec_from_file_location("lint_manifests", SCRIPT)
    assert spec
    assert spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def schemas(lint: ModuleType, tmp_path_factory: pytest.TempPathFactory) -> Path:
    directory = tmp_path_factory.mktemp("schemas")
    lint.make_schemas(directory)
    return directory


def test_the_repository_passes() -> None:
    result = subprocess.run([sys.executable, str(SCRIPT)], capture_output=True, text=True, timeout=300, check=False)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "Invalid: 0, Errors: 0, Skipped: 0" in result.stdout, result.stdout
    assert result.stdout.count("0 chart(s) failed") == 2, result.stdout


BAD = {
    "unknown-field-in-a-pod-template": ("""
apiVersion: apps/v1
kind: Deployment
metadata: {name: x}
spec:
  selector: {matchLabels: {a: b}}
  template:
    metadata: {labels: {a: b}}
    spec:
      containers: [{name: c, image: busybox, imagePullPolicy: Always, resourcez: {}}]
""", "additional properties 'resourcez' not allowed"),
    "servicemonitor-typo": ("""
apiVersion: monitoring.coreos.com/v1
kind: ServiceMonitor
metadata: {name: x}
spec:
  selector: {matchLabels: {a: b}}
  endpoints: [{port: metrics, honorLabel: true}]
""", "additional properties 'honorLabel' not allowed"),
    "durablerun-typo": (f"""
apiVersion: {api.API_VERSION}
kind: {api.KIND}
metadata: {{name: x}}
spec:
  workflow: agents.research:run
  checkpoint: {{uri: "s3://bucket/runs"}}
  polciy: {{}}
""", "additional properties 'polciy' not allowed"),
    "wrong-type": ("""
apiVersion: v1
kind: Service
metadata: {name: x}
spec:
  ports: [{port: "http"}]
""", "got string, want integer"),
}


@pytest.mark.parametrize("case", sorted(BAD))
def test_kubeconform_refuses(case: str, lint: ModuleType, schemas: Path, tmp_path: Path) -> None:
    manifest, complaint = BAD[case]
    path = tmp_path / f"{case}.yaml"
    path.write_text(manifest)
    result = lint.kubeconform(schemas, [path])
    assert result.returncode != 0, result.stdout
    assert complaint in result.stdout, result.stdout


def test_kubeconform_knows_every_kind_the_chart_renders(lint: ModuleType, schemas: Path) -> None:
    """No kind is skipped or unknown: a missing schema would be an error, never a silent pass."""
    for kind, group_version in (("ServiceMonitor", "monitoring.coreos.com/v1"),
                                ("PrometheusRule", "monitoring.coreos.com/v1"),
                                (api.KIND, api.API_VERSION),
                                ("NetworkPolicy", "networking.k8s.io/v1"),
                                ("CustomResourceDefinition", "apiextensions.k8s.io/v1")):
        group, version = group_version.split("/")
        assert (schemas / group / f"{kind.lower()}-{version}.json").exists(), kind
