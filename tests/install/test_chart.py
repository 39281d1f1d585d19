"""The Helm chart renders, lints and validates: defaults, every value set, and typos refused."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest
import yaml

from durablerun import api
from durablerun_testbed import binaries
from durablerun_testbed.testbed import TestBed
from tests.helpers.clis import CHART, Helm, Kubectl, dump

from .helpers import at, full_values, of_kind, one, schema_leaves

pytestmark = pytest.mark.testbed

# Kinds served only where the Prometheus Operator is installed: checked below by what they mean.
PROMETHEUS_OPERATOR_KINDS = {"ServiceMonitor", "PrometheusRule"}


def test_chart_lints(helm: Helm, namespace: str) -> None:
    for values in (None, full_values([namespace])):
        args = helm._values_args(values)
        result = helm("lint", "--strict", str(CHART), *args)
        assert "0 chart(s) failed" in result.stdout, result.stdout


def test_every_value_is_documented_and_exercised() -> None:
    """values.yaml comments every value it declares; full_values() sets every one of them."""
    text = (CHART / "values.yaml").read_text()
    defaults, full = yaml.safe_load(text), full_values(["x"])
    schema = json.loads((CHART / "values.schema.json").read_text())
    for path in schema_leaves(schema):
        if path == ("global",):
            continue
        default, value = at(defaults, path), at(full, path)
        assert default is not None, f"values.yaml does not declare {'.'.join(path)}"
        # Switches stay on where "on" renders more; every other value differs from its default.
        assert value is not None, f"full_values() does not set {'.'.join(path)}"
        assert isinstance(default, bool) or value != default, f"full_values() leaves {'.'.join(path)} at its default"
    # Each value is documented by a comment right above it, or belongs to a run of sibling
    # values (the fields of a probe, say) whose first one is.
    documented = set(schema_leaves(schema))
    stack: list[tuple[int, str]] = []
    previous, previous_ok = "", False
    for line in text.splitlines():
        body = line.lstrip()
        indent = len(line) - len(body)
        if not body or body.startswith(("#", "-")) or ":" not in body:
            previous, previous_ok = line, False
            continue
        while stack and stack[-1][0] >= indent:
            stack.pop()
        key = body.split(":", 1)[0].strip('"')
        path = (*(k for _, k in stack), key)
        stack.append((indent, key))
        if path in documented:
            above = previous.lstrip()
            sibling = previous_ok and len(previous) - len(above) == indent
            assert above.startswith("#") or sibling, f"values.yaml: {'.'.join(path)} has no comment"
            previous_ok = True
        else:
            previous_ok = False
        previous = line


def test_default_render_is_accepted_by_the_api_server(helm: Helm, admin: Kubectl, namespace: str) -> None:
    objects = helm.template("durable-run", namespace)
    kinds = sorted(obj["kind"] for obj in objects)
    assert kinds == ["ClusterRole", "ClusterRole", "ClusterRole", "ClusterRole", "ClusterRoleBinding",
                     "CustomResourceDefinition", "CustomResourceDefinition", "CustomResourceDefinition", "Deployment",
                     "FlowSchema", "FlowSchema", "FlowSchema", "PriorityLevelConfiguration",
                     "PriorityLevelConfiguration", "PriorityLevelConfiguration", "Service", "ServiceAccount",
                     "ValidatingAdmissionPolicy", "ValidatingAdmissionPolicy", "ValidatingAdmissionPolicyBinding",
                     "ValidatingAdmissionPolicyBinding"]
    result = admin("apply", "--dry-run=server", "-f", "-", input=dump(objects))
    assert result.stdout.count("(server dry run)") == len(objects), result.stdout


def test_full_values_render_is_accepted_by_the_api_server(
    helm: Helm, admin: Kubectl, testbed: TestBed, namespace: str, tmp_path: Path
) -> None:
    objects = helm.template("full", namespace, full_values([namespace]))
    kinds = {obj["kind"] for obj in objects}
    assert kinds == {"CustomResourceDefinition", "ServiceAccount", "Role", "RoleBinding", "ClusterRole",
                     "ClusterRoleBinding", "Deployment", "Service",
                     "ServiceMonitor", "PrometheusRule", "ConfigMap", "NetworkPolicy", "Secret",
                     "PodDisruptionBudget", "ValidatingAdmissionPolicy", "ValidatingAdmissionPolicyBinding",
                     "FlowSchema", "PriorityLevelConfiguration"}, kinds
    served = [obj for obj in objects if obj["kind"] not in PROMETHEUS_OPERATOR_KINDS]
    result = admin("apply", "--dry-run=server", "-f", "-", input=dump(served))
    assert result.stdout.count("(server dry run)") == len(served), result.stdout

    # The webhook ingress's objects (webhooks.enabled): its own Deployment, Service, account and, in each of
    # its namespaces, a Role, a RoleBinding and the signing keys; the rest of this test is the operator's.
    webhooks = [o for o in objects if (o["metadata"].get("labels") or {}).get(api.LABEL_COMPONENT) == "webhooks"]
    objects = [o for o in objects if o not in webhooks]
    # More than one replica (replicas 2): a Role on the shard Leases in the release namespace alone.
    sharding = [o for o in objects if o["metadata"]["name"].endswith("-shards")]
    objects = [o for o in objects if o not in sharding]
    assert one(sharding, "Role")["metadata"]["namespace"] == namespace
    assert one(sharding, "Role")["rules"] == [{"apiGroups": ["coordination.k8s.io"], "resources": ["leases"],
                                               "verbs": ["get", "list", "create", "update", "delete"]}]
    assert one(sharding, "RoleBinding")["subjects"][0]["name"] == "durable-run-operator"
    # Model quotas (quotas.enabled) with your own Redis: the cluster-wide reads of ModelQuotas and their CRD
    # (test_quotas_deploy_a_redis_... below renders the Redis the chart deploys).
    quota_objects = [o for o in objects if "quota" in o["metadata"]["name"]]
    objects = [o for o in objects if o not in quota_objects]
    assert sorted(o["kind"] for o in quota_objects) == ["ClusterRole", "ClusterRoleBinding", "CustomResourceDefinition"]
    ingress = one(webhooks, "Deployment")["spec"]
    assert ingress["replicas"] == 2
    assert f"--namespace={namespace}" in ingress["template"]["spec"]["containers"][0]["args"]
    assert {"--failure-rate=0.5", "--failure-burst=5", "--trusted-proxy=10.0.0.0/8", "--stream-max-per-run=4",
            "--stream-max-total=40", "--stream-write-timeout=5"} <= set(
        ingress["template"]["spec"]["containers"][0]["args"])
    assert one(webhooks, "Role")["metadata"]["namespace"] == namespace
    secrets_rule = next(r for r in one(webhooks, "Role")["rules"] if r["resources"] == ["secrets"])
    assert secrets_rule == {"apiGroups": [""], "resources": ["secrets"], "verbs": ["get"], "resourceNames": [
        api.WEBHOOK_KEYS_SECRET, api.WEBHOOK_SOURCES_SECRET, "ci-hooks", "s3-credentials"]}
    # webhooks.sourceSecrets and webhooks.streams.storeSecrets (the runs' store credentials), by name only, once each
    assert one(webhooks, "Secret")["metadata"]["name"] == api.WEBHOOK_KEYS_SECRET
    # Runner pods trade their pod's ServiceAccount token for their run's key: the ingress reviews tokens, no more.
    assert one(webhooks, "ClusterRole")["rules"] == [{"apiGroups": ["authentication.k8s.io"],
                                                       "resources": ["tokenreviews"], "verbs": ["create"]}]
    assert one(webhooks, "ValidatingAdmissionPolicy")["spec"]["matchConditions"][0]["expression"].endswith(
        f':{one(webhooks, "ServiceAccount")["metadata"]["name"]}"')
    # Its own ServiceMonitor scrapes the ingress's metrics port (the dashboard's "Webhook ingress" row).
    hooks_service, hooks_monitor = one(webhooks, "Service"), one(webhooks, "ServiceMonitor")
    assert hooks_monitor["spec"]["selector"]["matchLabels"].items() <= hooks_service["metadata"]["labels"].items()
    assert hooks_service["spec"]["selector"].items() <= ingress["template"]["metadata"]["labels"].items()
    assert hooks_monitor["spec"]["namespaceSelector"] == {"matchNames": [namespace]}
    assert hooks_monitor["spec"]["endpoints"][0]["port"] == "metrics"
    metrics_port = {"name": "metrics", "port": 19091, "targetPort": "metrics", "protocol": "TCP"}
    assert metrics_port in hooks_service["spec"]["ports"]
    assert hooks_monitor["metadata"]["labels"]["release"] == "kube-prometheus-stack"
    deployment = one(objects, "Deployment")
    pod = deployment["spec"]["template"]["spec"]
    container = one([{"kind": "c", **c} for c in pod["containers"]], "c")
    assert container["image"] == "registry.example/durable-run/operator@sha256:" + "a" * 64
    assert container["args"] == [f"--namespace={namespace}"]
    env = {e["name"]: e for e in container["env"]}
    assert env[api.OperatorEnv.RUNNER_IMAGE]["value"] == "registry.example/durable-run/runner@sha256:" + "b" * 64
    assert env[api.OperatorEnv.METRICS_PORT]["value"] == "19090"
    assert env[api.OperatorEnv.HEALTH_PORT]["value"] == "18080"
    assert env[api.OperatorEnv.RESYNC_SECONDS]["value"] == "2.5"
    assert env[api.OperatorEnv.START_TIMEOUT_SECONDS]["value"] == "900"
    assert env[api.OperatorEnv.RUNNER_ACCESS]["value"] == api.RUNNER_ACCESS_RUN
    assert env[api.OperatorEnv.CLUSTER]["value"] == "prod-eu"
    assert env[api.OperatorEnv.LOG_LEVEL]["value"] == "DEBUG"
    assert env[api.OperatorEnv.KUBE_QPS]["value"] == "80"
    assert env[api.OperatorEnv.KUBE_BURST]["value"] == "160"
    assert env[api.OperatorEnv.MASS_EXPIRY_FRACTION]["value"] == "0.6"
    assert env[api.OperatorEnv.MASS_EXPIRY_MIN_RUNS]["value"] == "25"
    assert deployment["spec"]["replicas"] == 2
    assert deployment["spec"]["strategy"] == {"type": "RollingUpdate"}
    assert env[api.OperatorEnv.SHARDS]["value"] == "8"
    assert env[api.OperatorEnv.SHARD_LEASE_SECONDS]["value"] == "20"
    assert env[api.OperatorEnv.POD_NAME]["valueFrom"] == {"fieldRef": {"fieldPath": "metadata.name"}}
    assert env[api.OperatorEnv.NAMESPACE]["valueFrom"] == {"fieldRef": {"fieldPath": "metadata.namespace"}}
    assert env["NODE_NAME"]["valueFrom"] == {"fieldRef": {"fieldPath": "spec.nodeName"}}
    # tracing.*: the operator's own OTEL_* settings, which it hands on to runner pods.
    assert env["OTEL_EXPORTER_OTLP_ENDPOINT"]["value"] == "http://otel-collector.tracing:4318"
    assert (env["OTEL_TRACES_SAMPLER"]["value"], env["OTEL_TRACES_SAMPLER_ARG"]["value"]) == (
        "parentbased_traceidratio", "0.25")
    assert "readinessProbe" not in container
    assert container["livenessProbe"]["httpGet"] == {"path": "/healthz", "port": "health"}
    assert pod["priorityClassName"] == "system-cluster-critical"
    assert pod["serviceAccountName"] == "durable-run-operator"

    assert env[api.OperatorEnv.MODEL_QUOTAS]["value"] == "true"
    assert env[api.Env.LLM_QUOTA_REDIS]["value"] == "rediss://redis.example.com:6380/1"
    assert env[api.Env.LLM_QUOTA_REDIS_PASSWORD]["valueFrom"]["secretKeyRef"]["name"] == "team-redis"
    assert env[api.Env.LLM_QUOTA_UNAVAILABLE]["value"] == "proceed"

    # Kueue on: the operator is told so, may manage Workloads, and reads (only) flavors and priority classes
    # cluster-wide.
    assert env[api.OperatorEnv.KUEUE]["value"] == "true"
    assert {"apiGroups": ["kueue.x-k8s.io"], "resources": ["workloads"],
            "verbs": ["get", "list", "watch", "create", "delete"]} in one(objects, "Role")["rules"]
    assert one(objects, "ClusterRole")["rules"] == [{"apiGroups": ["kueue.x-k8s.io"],
                                                     "resources": ["resourceflavors", "workloadpriorityclasses"],
                                                     "verbs": ["get"]}]

    # Namespaced mode: a Role and RoleBinding in the watched namespace; cluster-wide only Kueue's reads.
    assert one(objects, "RoleBinding")["metadata"]["namespace"] == namespace
    assert one(objects, "RoleBinding")["subjects"][0]["name"] == "durable-run-operator"
    assert all("helm.sh/resource-policy" not in (crd["metadata"].get("annotations") or {})
               for crd in of_kind(objects, "CustomResourceDefinition"))

    # The ServiceMonitor scrapes the metrics Service: its selector and port name match.
    service, monitor = one(objects, "Service"), one(objects, "ServiceMonitor")
    assert monitor["spec"]["selector"]["matchLabels"].items() <= service["metadata"]["labels"].items()
    assert monitor["spec"]["namespaceSelector"] == {"matchNames": [namespace]}
    assert monitor["spec"]["endpoints"][0]["port"] == service["spec"]["ports"][0]["name"] == "metrics"
    assert monitor["metadata"]["labels"]["release"] == "kube-prometheus-stack"
    endpoint = monitor["spec"]["endpoints"][0]
    assert endpoint["honorLabels"] is True
    assert endpoint["relabelings"][0]["targetLabel"] == "cluster"
    assert endpoint["metricRelabelings"][0]["action"] == "drop"
    assert monitor["metadata"]["annotations"] == {"example.com/owner": "platform"}
    assert all(obj["metadata"]["labels"]["example.com/cost-center"] == "agents"
               for obj in objects if obj["kind"] not in ("Secret", "PodDisruptionBudget"))

    # The NetworkPolicy selects the operator's pod and lets scrapers reach only the metrics port.
    policy = one(objects, "NetworkPolicy")
    assert policy["spec"]["podSelector"]["matchLabels"].items() <= pod_labels(deployment).items()
    assert policy["spec"]["ingress"] == [{"ports": [{"port": "metrics", "protocol": "TCP"}],
                                          "from": full_values([namespace])["networkPolicy"]["metricsFrom"]}]
    assert policy["spec"]["egress"] == [{"ports": [{"port": 6443, "protocol": "TCP"}]}]
    # extraObjects go through tpl, maps and strings alike.
    assert one(objects, "Secret")["metadata"]["name"] == "full-extra"
    assert one(objects, "Secret")["stringData"] == {"note": "made with durable-run"}
    assert one(objects, "PodDisruptionBudget")["metadata"]["name"] == "full-pdb"
    assert service["spec"]["selector"].items() <= deployment["spec"]["template"]["metadata"]["labels"].items()

    # The PrometheusRule's spec is a valid Prometheus rule file (the real promtool says so).
    rules = tmp_path / "rules.yaml"
    rules.write_text(yaml.safe_dump(one(objects, "PrometheusRule")["spec"]))
    check = subprocess.run([str(binaries.find("promtool")), "check", "rules", str(rules)],
                           capture_output=True, text=True, check=False)
    assert check.returncode == 0, check.stdout + check.stderr

    dashboard = one(objects, "ConfigMap")
    assert dashboard["metadata"]["labels"]["grafana_dashboard"] == "1"
    assert json.loads(dashboard["data"]["durablerun-dashboard.json"]) == json.loads(
        (CHART / "files" / "durablerun-dashboard.json").read_text())


def pod_labels(deployment: dict[str, object]) -> dict[str, str]:
    labels: dict[str, str] = deployment["spec"]["template"]["metadata"]["labels"]  # type: ignore[index]
    return labels


@pytest.mark.parametrize(
    ("setting", "complaint"),
    [
        (["--set", "image.tga=latest"], "at '/image': additional properties 'tga' not allowed"),
        (["--set", "metrics.serviceMonitor.enabeld=true"],
         "at '/metrics/serviceMonitor': additional properties 'enabeld' not allowed"),
        (["--set", "replica=2"], "additional properties 'replica' not allowed"),  # replicas, misspelt
        (["--set", "logLevel=VERBOSE"], "at '/logLevel': value must be one of"),
        (["--set", "metrics.port=http"], "at '/metrics/port': got string, want integer"),
        (["--set", "metrics.serviceMonitor.relabelings[0].targetLable=x"],
         "at '/metrics/serviceMonitor/relabelings/0': additional properties 'targetLable' not allowed"),
        (["--set", "tracing.endpoint=otel-collector:4318"], "at '/tracing/endpoint': 'otel-collector:4318' does not "
                                                            "match pattern"),
        (["--set", "tracing.env.OTEL_EXPORTER_OTLP_HEADERS=x-key=secret"],
         "invalid propertyName 'OTEL_EXPORTER_OTLP_HEADERS'"),
    ],
    ids=["typo-in-image", "typo-in-servicemonitor", "unknown-top-level", "bad-enum", "bad-type",
         "typo-in-relabeling", "tracing-endpoint-not-a-url", "tracing-headers-in-values"],
)
def test_schema_refuses_bad_values(helm: Helm, setting: list[str], complaint: str) -> None:
    result = helm("template", "x", str(CHART), *setting, check=False)
    assert result.returncode != 0, f"{setting} was accepted"
    assert "values don't meet the specifications of the schema" in result.stderr, result.stderr
    assert complaint in result.stderr, result.stderr


def test_service_monitor_needs_the_metrics_service(helm: Helm) -> None:
    result = helm("template", "x", str(CHART), "--set", "metrics.serviceMonitor.enabled=true",
                  "--set", "metrics.service.enabled=false", check=False)
    assert result.returncode != 0
    assert "metrics.serviceMonitor.enabled needs metrics.service.enabled" in result.stderr


def test_webhook_service_monitor_only_with_the_ingress(helm: Helm) -> None:
    """The ingress's ServiceMonitor comes with the ingress: none without it, none without ServiceMonitors."""
    monitors = {"metrics": {"serviceMonitor": {"enabled": True}}}
    hooks = {"webhooks": {"enabled": True, "url": "https://hooks.example.com", "namespaces": ["ns"]}}
    names = sorted(m["metadata"]["name"] for m in of_kind(helm.template("x", "ns", {**monitors, **hooks}),
                                                          "ServiceMonitor"))
    assert names == ["x-durable-run", "x-durable-run-webhooks"]
    assert [m["metadata"]["name"] for m in of_kind(helm.template("x", "ns", monitors), "ServiceMonitor")] == [
        "x-durable-run"]
    assert of_kind(helm.template("x", "ns", hooks), "ServiceMonitor") == []


def test_crds_keep_and_enabled(helm: Helm) -> None:
    kept = of_kind(helm.template("x", "ns"), "CustomResourceDefinition")
    assert sorted(c["metadata"]["name"] for c in kept) == sorted([api.CRD_NAME, api.QUOTA_CRD_NAME,
                                                                  api.SCHEDULE_CRD_NAME])
    for crd in kept:
        assert crd["metadata"]["annotations"] == {"helm.sh/resource-policy": "keep"}
    assert of_kind(helm.template("x", "ns", {"crds": {"enabled": False}}), "CustomResourceDefinition") == []


def test_quotas_deploy_a_redis_whose_password_the_operator_and_each_namespaces_runners_get_from_secrets(
        helm: Helm) -> None:
    """quotas.enabled: a password-protected Redis with no disk, its password generated into one Secret for the
    operator and one per namespace for its runners (the same password), never on a command line; the operator's
    settings point at it; only the operator and those namespaces' runner pods may reach it."""
    objects = helm.template("x", "ns", {"quotas": {"enabled": True, "namespaces": ["team-a", "team-b"]}})
    secrets = {(s["metadata"]["namespace"], s["metadata"]["name"]): s["data"]["password"]
               for s in of_kind(objects, "Secret")}
    assert set(secrets) == {("ns", "x-durable-run-quota-redis"), ("team-a", api.QUOTA_REDIS_SECRET),
                            ("team-b", api.QUOTA_REDIS_SECRET)}
    assert len(set(secrets.values())) == 1  # one password
    redis = next(d for d in of_kind(objects, "Deployment") if d["metadata"]["name"] == "x-durable-run-quota-redis")
    container = redis["spec"]["template"]["spec"]["containers"][0]
    assert container["image"] == "redis:7.4-alpine"
    assert "--requirepass \"$REDIS_PASSWORD\"" in container["command"][-1]
    assert container["securityContext"]["readOnlyRootFilesystem"] is True
    operator = next(d for d in of_kind(objects, "Deployment") if d["metadata"]["name"] == "x-durable-run")
    env = {e["name"]: e.get("value", e.get("valueFrom"))
           for e in operator["spec"]["template"]["spec"]["containers"][0]["env"]}
    assert env[api.OperatorEnv.MODEL_QUOTAS] == "true"
    assert env[api.Env.LLM_QUOTA_REDIS] == "redis://x-durable-run-quota-redis.ns.svc:6379/0"
    assert env[api.Env.LLM_QUOTA_REDIS_PASSWORD] == {"secretKeyRef": {"name": "x-durable-run-quota-redis",
                                                                        "key": api.QUOTA_REDIS_SECRET_KEY}}
    policy = next(p for p in of_kind(objects, "NetworkPolicy") if p["metadata"]["name"] == "x-durable-run-quota-redis")
    peers = policy["spec"]["ingress"][0]["from"]
    assert [p.get("namespaceSelector", {}).get("matchLabels") for p in peers] == [
        None, {"kubernetes.io/metadata.name": "team-a"}, {"kubernetes.io/metadata.name": "team-b"}]
    rules = one([r for r in of_kind(objects, "ClusterRole") if r["metadata"]["name"] == "x-durable-run-quotas"],
                "ClusterRole")["rules"]
    assert {"resources": ["modelquotas/status"], "verbs": ["patch"], "apiGroups": [api.GROUP]} in rules
    # Your own Redis: no Redis, no generated Secret, the operator's settings name yours.
    own = helm.template("x", "ns", {"quotas": {"enabled": True, "redis": {
        "deploy": False, "url": "rediss://redis.example.com:6380/0", "existingSecret": "mine"}}})
    assert [d["metadata"]["name"] for d in of_kind(own, "Deployment")] == ["x-durable-run"]
    assert of_kind(own, "Secret") == []
    refused = helm("template", "x", str(CHART), "--set", "quotas.enabled=true", "--set", "quotas.redis.deploy=false",
                   check=False)
    assert "quotas.redis.url must name your Redis" in refused.stderr
    both = helm("template", "x", str(CHART), "--set", "quotas.enabled=true", "--set", "quotas.redis.url=redis://r:6379",
                check=False)
    assert "set quotas.redis.deploy=false as well" in both.stderr


def test_notes_ask_only_for_what_the_cluster_lacks(helm: Helm, admin: Kubectl, namespace: str) -> None:
    """The NOTES' next steps, as `helm install` prints them: a namespace without the runs' Secret is told to
    create it and to name an image holding the workflow; one with the Secret (the sandbox creates it before
    installing, with its store's endpoint) and a release whose runner.image is the examples image (the sandbox's)
    is not asked for either."""

    def notes(values: dict[str, object]) -> str:
        # --dry-run=server: helm's lookup reads the cluster, as a real install's NOTES do; nothing is created.
        out = helm.install("notes", namespace, {"watchNamespaces": [namespace], "crds": {"enabled": False},
                                                **values}, "--dry-run=server")
        return out[out.index("NOTES:"):]

    bare = notes({})
    assert "kubectl -n $NS create secret generic durablerun-s3" in bare, bare
    assert "Set spec.template's image to a runner image that contains the workflow's module" in bare, bare
    assert "Set spec.checkpoint.uri to a bucket you own." in bare, bare

    admin("create", "secret", "generic", "durablerun-s3", "-n", namespace, "--from-literal=AWS_ACCESS_KEY_ID=k",
          "--from-literal=AWS_SECRET_ACCESS_KEY=s", "--from-literal=AWS_ENDPOINT_URL_S3=http://127.0.0.1:9000")
    sandbox = notes({"runner": {"image": {"repository": "localhost/durable-run/examples", "tag": "abc"}}})
    assert "create secret" not in sandbox, sandbox
    assert "Secret durablerun-s3 is there already" in sandbox, sandbox
    assert "Set spec.template's image" not in sandbox, sandbox
    assert "runs this release's runner.image, localhost/durable-run/examples:abc" in sandbox, sandbox
    assert f"NS={namespace}" in sandbox, sandbox
    assert "kubectl -n $NS apply -f deploy/samples/review-agent.yaml" in sandbox, sandbox
