"""Helm, kubectl-as-someone-else and manifest helpers for the install tests."""

from __future__ import annotations

import json
import subprocess
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from durablerun_testbed import binaries
from durablerun_testbed.testbed import TestBed

REPO = Path(__file__).resolve().parents[2]
CHART = REPO / "charts" / "durable-run"
DEPLOY = REPO / "deploy"

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


def of_kind(objects: Iterable[Manifest], kind: str) -> list[Manifest]:
    return [obj for obj in objects if obj["kind"] == kind]


def one(objects: Iterable[Manifest], kind: str) -> Manifest:
    found = of_kind(objects, kind)
    assert len(found) == 1, f"expected one {kind}, found {[o['metadata']['name'] for o in found]}"
    return found[0]


def schema_leaves(schema: Manifest, path: tuple[str, ...] = ()) -> Iterator[tuple[str, ...]]:
    """Paths of a values schema's leaves: its values that are not objects of named properties."""
    if "properties" in schema:
        for key, sub in schema["properties"].items():
            yield from schema_leaves(sub, (*path, key))
    else:
        yield path


def at(values: Any, path: tuple[str, ...]) -> Any:
    """The value at a path of keys, or None."""
    for key in path:
        if not isinstance(values, dict) or key not in values:
            return None
        values = values[key]
    return values


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


def service_account_kubectl(testbed: TestBed, account: str, namespace: str, directory: Path) -> Kubectl:
    """kubectl with a real token of ``account`` from the TokenRequest API (`kubectl create token`)."""
    assert testbed.controlplane
    token = testbed.kubectl("create", "token", account, "-n", namespace, "--duration=10m").stdout.strip()
    user = f"system:serviceaccount:{namespace}:{account}"
    path = directory / f"{namespace}.{account}.kubeconfig"
    path.write_text(yaml.safe_dump(testbed.controlplane.kubeconfig_dict(user, token)))
    path.chmod(0o600)
    return Kubectl(path)


def full_values(watch_namespaces: list[str]) -> Manifest:
    """A value for every key in values.yaml, each but the switches unlike its default (a test checks)."""
    return {
        "nameOverride": "dr",
        "fullnameOverride": "durable-run-full",
        "commonLabels": {"example.com/cost-center": "agents"},
        "crds": {"enabled": True, "keep": False},
        "watchNamespaces": watch_namespaces,
        "image": {"repository": "registry.example/durable-run/operator", "tag": "0.1.0-test",
                  "digest": "sha256:" + "a" * 64, "pullPolicy": "Always"},
        "imagePullSecrets": [{"name": "registry-credentials"}],
        "runner": {"image": {"repository": "registry.example/durable-run/runner", "tag": "0.1.0-test",
                             "digest": "sha256:" + "b" * 64}},
        "logLevel": "DEBUG",
        "resyncSeconds": 2.5,
        "kubeClient": {"qps": 80, "burst": 160},
        "replicas": 2,
        "sharding": {"shards": 8, "leaseSeconds": 20},
        "massLeaseExpiry": {"fraction": 0.6, "minRuns": 25},
        "kueue": {"enabled": True},
        "clusterName": "prod-eu",
        "tracing": {"endpoint": "http://otel-collector.tracing:4318",
                    "env": {"OTEL_TRACES_SAMPLER": "parentbased_traceidratio", "OTEL_TRACES_SAMPLER_ARG": "0.25"}},
        "serviceAccount": {"create": True, "name": "durable-run-operator",
                           "annotations": {"iam.example/role": "durable-run"}},
        "rbac": {"aggregateClusterRoles": False},
        "resources": {"requests": {"cpu": "100m", "memory": "200Mi"}, "limits": {"cpu": "1", "memory": "1Gi"}},
        "priorityClassName": "system-cluster-critical",
        "nodeSelector": {"kubernetes.io/os": "linux", "node-role.example/system": "true"},
        "tolerations": [{"key": "dedicated", "operator": "Equal", "value": "system", "effect": "NoSchedule"}],
        "affinity": {"nodeAffinity": {"preferredDuringSchedulingIgnoredDuringExecution": [
            {"weight": 1, "preference": {"matchExpressions": [
                {"key": "node-role.example/system", "operator": "Exists"}]}}]}},
        "podAnnotations": {"example.com/team": "agents"},
        "podLabels": {"example.com/tier": "control"},
        "extraEnv": [{"name": "HTTPS_PROXY", "value": "http://proxy.example:3128"},
                     {"name": "NODE_NAME", "valueFrom": {"fieldRef": {"fieldPath": "spec.nodeName"}}}],
        "podSecurityContext": {"runAsNonRoot": True, "runAsUser": 10001, "runAsGroup": 10001, "fsGroup": 10001,
                               "seccompProfile": {"type": "RuntimeDefault"}},
        "containerSecurityContext": {"allowPrivilegeEscalation": False, "readOnlyRootFilesystem": True,
                                     "privileged": False, "capabilities": {"drop": ["ALL"]}},
        "health": {"port": 18080},
        "livenessProbe": {"enabled": True, "initialDelaySeconds": 5, "periodSeconds": 20, "timeoutSeconds": 3,
                          "failureThreshold": 4},
        "readinessProbe": {"enabled": False, "initialDelaySeconds": 1, "periodSeconds": 5, "timeoutSeconds": 2,
                           "failureThreshold": 2},
        "metrics": {
            "port": 19090,
            "service": {"enabled": True, "type": "NodePort", "port": 8443,
                        "annotations": {"prometheus.io/scrape": "true"}},
            "serviceMonitor": {"enabled": True, "interval": "15s", "scrapeTimeout": "10s",
                               "labels": {"release": "kube-prometheus-stack"},
                               "annotations": {"example.com/owner": "platform"},
                               "honorLabels": True,
                               "relabelings": [{"action": "replace", "targetLabel": "cluster",
                                                "replacement": "prod-eu"}],
                               "metricRelabelings": [{"action": "drop", "sourceLabels": ["__name__"],
                                                      "regex": "python_gc_.*"}]},
            "prometheusRule": {"enabled": True, "labels": {"release": "kube-prometheus-stack"}},
            "dashboard": {"enabled": True, "namespace": watch_namespaces[0],
                          "labels": {"grafana_dashboard": "1", "team": "agents"},
                          "annotations": {"grafana_folder": "durable-run"}},
        },
        "networkPolicy": {
            "enabled": True,
            "metricsFrom": [{"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "monitoring"}}}],
            "egress": [{"ports": [{"port": 6443, "protocol": "TCP"}]}],
        },
        "webhooks": {
            "enabled": True, "url": "https://hooks.example.com", "namespaces": watch_namespaces, "replicas": 2,
            "sourceSecrets": ["ci-hooks"],
            "port": 9443, "metricsPort": 19091, "tls": {"secretName": "hooks-tls"}, "maxBodyBytes": 65536,
            "rate": 5, "burst": 10, "failureRate": 0.5, "failureBurst": 5, "trustedProxies": ["10.0.0.0/8"],
            "service": {"type": "LoadBalancer", "port": 8443},
            "resources": {"requests": {"cpu": "100m", "memory": "128Mi"}, "limits": {"memory": "512Mi"}},
        },
        "extraObjects": [
            {"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "{{ .Release.Name }}-extra"},
             "stringData": {"note": "made with {{ .Chart.Name }}"}},
            "apiVersion: policy/v1\nkind: PodDisruptionBudget\nmetadata:\n  name: {{ .Release.Name }}-pdb\n"
            "spec:\n  maxUnavailable: 1\n  selector:\n    matchLabels:\n"
            "      app.kubernetes.io/instance: {{ .Release.Name }}\n",
        ],
    }
