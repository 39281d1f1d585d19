"""The install tests' own helpers: finding objects in rendered manifests, walking the values schema, a value for
every key. Helm and kubectl-as-someone-else are in ``tests.helpers.clis`` (the Kueue, operator and real-node tests
use them too)."""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

from tests.helpers.clis import Manifest

REPO = Path(__file__).resolve().parents[2]
DEPLOY = REPO / "deploy"


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
        "startTimeoutSeconds": 900,
        "runnerAccess": "run",
        "apiPriority": {"enabled": True, "renewalShares": 45, "operatorShares": 25, "startShares": 5,
                        "matchingPrecedence": 1500},
        "kubeClient": {"qps": 80, "burst": 160},
        "replicas": 2,
        "sharding": {"shards": 8, "leaseSeconds": 20},
        "massLeaseExpiry": {"fraction": 0.6, "minRuns": 25},
        "kueue": {"enabled": True},
        "quotas": {"enabled": True, "namespaces": watch_namespaces, "whenUnavailable": "proceed",
                   "redis": {"deploy": False, "url": "rediss://redis.example.com:6380/1",
                             "existingSecret": "team-redis",
                             "image": {"repository": "valkey/valkey", "tag": "8.1", "pullPolicy": "Always",
                                       "digest": "sha256:" + "b" * 64},
                             "resources": {"requests": {"cpu": "100m"}}}},
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
            "streams": {"storeSecrets": ["s3-credentials", "ci-hooks"], "maxPerRun": 4, "maxTotal": 40,
                        "writeTimeoutSeconds": 5},
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
