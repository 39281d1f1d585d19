"""The pinned helm against one cluster, the real kubectl as one identity (the admin's kubeconfig or a
ServiceAccount's token), and manifests to and from YAML: the install, Kueue, operator and real-node tests' tools."""

from __future__ import annotations

import json
import subprocess
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from durablerun_testbed import binaries
from durablerun_testbed.testbed import TestBed
from tests.helpers.session import REPO

CHART = REPO / "charts" / "durable-run"


Manifest = dict[str, Any]


@dataclass
class Helm:
    """The pinned helm (built from its Go module), with its own scratch home, against one cluster."""

    home: Path
    kubeconfig: Path | None = None

    def __call__(self, *args: str, check: bool = True, timeout: float = 120) -> subprocess.CompletedProcess[str]:
        env = {
            "PATH": "/usr/bin:/bin",
            "HOME": str(self.home),
            "HELM_CACHE_HOME": str(self.home / "cache"),
            "HELM_CONFIG_HOME": str(self.home / "config"),
            "HELM_DATA_HOME": str(self.home / "data"),
        }
        if self.kubeconfig:
            env["KUBECONFIG"] = str(self.kubeconfig)
        argv = [str(binaries.find("helm")), *args, *binaries.helm_offline_args(args)]
        result = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=timeout, check=False)
        if check and result.returncode != 0:
            raise AssertionError(f"helm {' '.join(args)} failed ({result.returncode}): {result.stderr}")
        return result

    def template(self, release: str, namespace: str, values: Manifest | None = None, *args: str) -> list[Manifest]:
        """The chart rendered with ``values`` (a dict, written to a values file): its objects."""
        return parse(self(*self._values_args(values), "template", release, str(CHART),
                          "--namespace", namespace, *args).stdout)

    def _values_args(self, values: Manifest | None) -> list[str]:
        if values is None:
            return []
        path = self.home / f"values-{abs(hash(json.dumps(values, sort_keys=True)))}.yaml"
        path.write_text(yaml.safe_dump(values))
        return ["--values", str(path)]

    def install(self, release: str, namespace: str, values: Manifest | None = None, *args: str) -> str:
        return self(*self._values_args(values), "install", release, str(CHART), "--namespace", namespace,
                    *args).stdout


def parse(text: str) -> list[Manifest]:
    return [doc for doc in yaml.safe_load_all(text) if doc]


def dump(objects: Iterable[Manifest]) -> str:
    return "\n---\n".join(yaml.safe_dump(obj, sort_keys=False) for obj in objects)


@dataclass
class Kubectl:
    """The real kubectl as one identity: the admin's kubeconfig or a ServiceAccount's token."""

    kubeconfig: Path

    def __call__(self, *args: str, input: str | None = None, check: bool = True,
                 timeout: float = 60) -> subprocess.CompletedProcess[str]:
        argv = [str(binaries.kubectl()), "--kubeconfig", str(self.kubeconfig), *args]
        result = subprocess.run(argv, input=input, capture_output=True, text=True, timeout=timeout, check=False)
        if check and result.returncode != 0:
            raise subprocess.CalledProcessError(result.returncode, argv, result.stdout, result.stderr)
        return result

    def can_i(self, verb: str, resource: str, namespace: str | None = None, *extra: str) -> bool:
        """`kubectl auth can-i`: a SelfSubjectAccessReview answered by the API server's RBAC authorizer."""
        where = ["--namespace", namespace] if namespace else []
        result = self("auth", "can-i", verb, resource, *where, *extra, check=False)
        answer = result.stdout.strip()
        assert answer in ("yes", "no"), f"kubectl auth can-i {verb} {resource}: {result.stdout}{result.stderr}"
        return answer == "yes"


def service_account_kubectl(testbed: TestBed, account: str, namespace: str, directory: Path,
                            pod: str | None = None) -> Kubectl:
    """kubectl with a real token of ``account`` from the TokenRequest API (`kubectl create token`), bound to
    ``pod`` if given (as a pod's mounted token is: the API server then knows the pod it was issued for)."""
    assert testbed.controlplane
    bound = ["--bound-object-kind=Pod", f"--bound-object-name={pod}"] if pod else []
    token = testbed.kubectl("create", "token", account, "-n", namespace, "--duration=10m", *bound).stdout.strip()
    user = f"system:serviceaccount:{namespace}:{account}"
    path = directory / f"{namespace}.{account}{'.' + pod if pod else ''}.kubeconfig"
    path.write_text(yaml.safe_dump(testbed.controlplane.kubeconfig_dict(user, token)))
    path.chmod(0o600)
    return Kubectl(path)
