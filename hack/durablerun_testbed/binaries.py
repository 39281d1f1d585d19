"""Where the test bed's binaries are: envtest assets first, then the build cache."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

HACK_DIR = Path(__file__).resolve().parent.parent
REPO_ROOT = HACK_DIR.parent


def versions() -> dict[str, str]:
    """The pinned versions from hack/versions.env."""
    pinned: dict[str, str] = {}
    for line in (HACK_DIR / "versions.env").read_text().splitlines():
        line = line.strip()
        if line and not line.startswith("#") and "=" in line:
            key, _, value = line.partition("=")
            pinned[key] = value
    return pinned


def cache_dir() -> Path:
    return Path(os.environ.get("DURABLERUN_CACHE", Path.home() / ".cache" / "durable-run"))


# name -> (TEST_ASSET_* variable, version key in versions.env)
_GO_BINARIES = {
    "kube-apiserver": ("TEST_ASSET_KUBE_APISERVER", "KUBERNETES_VERSION"),
    "kube-controller-manager": ("TEST_ASSET_KUBE_CONTROLLER_MANAGER", "KUBERNETES_VERSION"),
    "kube-scheduler": ("TEST_ASSET_KUBE_SCHEDULER", "KUBERNETES_VERSION"),
    "kubelet": (None, "KUBERNETES_VERSION"),
    "etcd": ("TEST_ASSET_ETCD", "ETCD_VERSION"),
    "minio": (None, "MINIO_VERSION"),
    "helm": (None, "HELM_VERSION"),
    "kubeconform": (None, "KUBECONFORM_VERSION"),
    "jaeger": (None, "JAEGER_VERSION"),
    "kueue": (None, "KUEUE_BUILD"),
}


class MissingBinary(RuntimeError):
    pass


def find(name: str, *, build: bool = True) -> Path:
    """The path of a test bed binary, building it once if it is missing.

    Order: TEST_ASSET_<NAME>, then $KUBEBUILDER_ASSETS/<name> (the envtest
    conventions), then the version-keyed build cache, then PATH for tools from
    Debian's packages (kubectl, prometheus, promtool).
    """
    asset_var, version_key = _GO_BINARIES.get(name, (None, None))
    if asset_var and os.environ.get(asset_var):
        return Path(os.environ[asset_var])
    assets = os.environ.get("KUBEBUILDER_ASSETS")
    if assets and (Path(assets) / name).exists():
        return Path(assets) / name
    if version_key:
        path = cache_dir() / "bin" / f"{name}-{versions()[version_key]}"
        if not path.exists() and build:
            subprocess.run([str(HACK_DIR / "build-binaries.sh"), name], check=True)
        if path.exists():
            return path
        raise MissingBinary(f"{name} is not built: run hack/build-binaries.sh {name}")
    found = shutil.which(name)
    if not found:
        raise MissingBinary(f"{name} is not on PATH: run hack/setup.sh")
    return Path(found)


def kubectl() -> Path:
    """A kubectl within one minor version of the pinned API server."""
    minor = versions()["KUBERNETES_VERSION"].split(".")[1]
    default = shutil.which("kubectl")
    if os.environ.get("TEST_ASSET_KUBECTL"):
        return Path(os.environ["TEST_ASSET_KUBECTL"])
    if default:
        beside = Path(os.path.realpath(default)).parent / f"kubectl.1.{minor}"
        if beside.exists():
            return beside
        return Path(default)
    return find("kubectl")


def helm_offline_args(args: list[str] | tuple[str, ...]) -> list[str]:
    """Arguments to append to a helm command line ``args`` that renders without a cluster (template, lint).

    The Kubernetes version to render for: the test bed's. helm built from its Go module lacks the release
    build's linker flags and would assume Kubernetes 1.20, older than the chart's kubeVersion allows.
    """
    offline = "template" in args or "lint" in args
    return ["--kube-version", versions()["KUBERNETES_VERSION"]] if offline else []
