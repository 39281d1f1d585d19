"""What one status write of a DurableRun costs the API server, against a ConfigMap patch, and what in it costs.

On the test bed's kube-apiserver and etcd (nothing else writing): N writes of
each kind in a row from one client, the API server's and etcd's CPU seconds
read from /proc/<pid>/stat before and after, divided by N. Rounds interleave
the kinds, so the shared machine's drift hits every kind alike; the median
round is reported.

The writes:

* ``configmap``: a ConfigMap JSON patch (test a holder, set renewTime): the floor.
* ``lease``: a coordination.k8s.io Lease JSON patch of spec.renewTime (what a
  kubelet's node heartbeat is, and what a Lease per run would cost).
* ``dr-*``: the runner's renewal (test status.epoch and the holder, set
  status.lease.renewTime) on a DurableRun of a scratch copy of the CRD, one
  copy per variant, each in its own API group so they do not share anything:

  - ``shipped``: the generated CRD as it is (with its admission policy);
  - ``vap-on-status``: the same plus an admission policy matching status writes;
  - ``no-cel``: every x-kubernetes-validations rule removed;
  - ``template-schemaless``: spec.template as x-kubernetes-preserve-unknown-fields;
  - ``spec-schemaless``, ``status-schemaless``: one of the two schemaless;
  - ``schemaless``: spec and status both schemaless (what any CRD write costs).

* ``dr-runner``: the ``shipped`` renewal written as a runner writes it: by the namespace's runner ServiceAccount
  through a token bound to the run's current pod, so the runner-status admission policy (its authorizer check
  and its rules) is evaluated on every write.
* ``dr-get``: a GET of the DurableRun (from etcd), what reading it costs.
"""

from __future__ import annotations

import copy
import statistics
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import yaml

from durablerun import api
from durablerun_bench.scale import proc_cpu_seconds
from durablerun_testbed import procs
from durablerun_testbed.testbed import TestBed

JSON_PATCH = "application/json-patch+json"
REPO = Path(__file__).resolve().parents[2]
CRD = REPO / "deploy" / "crd" / "durableruns.durablerun.dev.yaml"


def _walk(node: Any, fn: Callable[[dict[str, Any]], None]) -> None:
    if isinstance(node, dict):
        fn(node)
        for value in node.values():
            _walk(value, fn)
    elif isinstance(node, list):
        for value in node:
            _walk(value, fn)


def _no_cel(schema: dict[str, Any]) -> dict[str, Any]:
    out = copy.deepcopy(schema)
    _walk(out, lambda node: node.pop("x-kubernetes-validations", None))
    return out


def _schemaless_template(schema: dict[str, Any]) -> dict[str, Any]:
    out = copy.deepcopy(schema)
    template = out["properties"]["spec"]["properties"]["template"]
    out["properties"]["spec"]["properties"]["template"] = {
        "type": "object", "x-kubernetes-preserve-unknown-fields": True, "description": template.get("description")}
    return out


def _schemaless(schema: dict[str, Any], parts: tuple[str, ...] = ("spec", "status")) -> dict[str, Any]:
    out = copy.deepcopy(schema)
    for part in parts:
        out["properties"][part] = {"type": "object", "x-kubernetes-preserve-unknown-fields": True}
    return out


#: variant -> (schema transform, whether its admission policy also matches status writes)
VARIANTS: dict[str, tuple[Callable[[dict[str, Any]], dict[str, Any]], bool]] = {
    "shipped": (lambda s: s, False),
    "vap-on-status": (lambda s: s, True),
    "no-cel": (_no_cel, False),
    "template-schemaless": (_schemaless_template, False),
    "spec-schemaless": (lambda s: _schemaless(s, ("spec",)), False),
    "status-schemaless": (lambda s: _schemaless(s, ("status",)), False),
    "schemaless": (_schemaless, False),
}


def _deployed() -> dict[tuple[str, str], dict[str, Any]]:
    """deploy/crd's documents (the CRD, its policies and their bindings), by kind and name."""
    return {(d["kind"], d["metadata"]["name"]): d for d in yaml.safe_load_all(CRD.read_text()) if d}


def shipped_documents() -> tuple[dict[str, Any], dict[str, Any]]:
    """The generated CRD and its ValidatingAdmissionPolicy, from deploy/crd."""
    docs = _deployed()
    # The spec's policy; the one on runners' status writes matches only dr-runner's writes (runner_documents).
    return docs["CustomResourceDefinition", api.CRD_NAME], docs["ValidatingAdmissionPolicy", api.CRD_NAME]


def runner_documents(group: str, plural: str, namespace: str) -> list[dict[str, Any]]:
    """For ``group``'s scratch copy: the runner-status admission policy (and binding) as shipped, and the
    namespace's runner ServiceAccount, Role and RoleBinding as the operator makes them."""
    docs = _deployed()
    status_policy = f"{api.PLURAL}-status.{api.GROUP}"
    policy = yaml.safe_load(yaml.safe_dump(docs["ValidatingAdmissionPolicy", status_policy]).replace(
        f"'{api.GROUP}'", f"'{group}'"))
    name = f"{plural}-status.{group}"
    policy["metadata"] = {"name": name}
    policy["spec"]["matchConstraints"]["resourceRules"][0]["apiGroups"] = [group]
    binding = {"apiVersion": "admissionregistration.k8s.io/v1", "kind": "ValidatingAdmissionPolicyBinding",
               "metadata": {"name": name}, "spec": {"policyName": name, "validationActions": ["Deny"]}}
    meta = {"name": api.RUNNER_ACCOUNT, "namespace": namespace}
    role = {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "Role", "metadata": meta, "rules": [
        {"apiGroups": [group], "resources": [plural], "verbs": ["get", "watch"]},
        {"apiGroups": [group], "resources": [f"{plural}/status"], "verbs": ["get", "patch"]}]}
    role_binding = {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding", "metadata": meta,
                    "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": api.RUNNER_ACCOUNT},
                    "subjects": [{"kind": "ServiceAccount", **meta}]}
    account = {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": meta}
    return [policy, binding, account, role, role_binding]


def scratch_documents(variant: str) -> list[dict[str, Any]]:
    """A copy of the CRD (and its admission policy) in an API group of its own, changed as ``variant`` says."""
    transform, vap_on_status = VARIANTS[variant]
    crd, vap = copy.deepcopy(shipped_documents())
    group = f"{variant}.writecost.bench"
    plural = crd["spec"]["names"]["plural"]
    crd["metadata"] = {"name": f"{plural}.{group}"}
    crd["spec"]["group"] = group
    version = crd["spec"]["versions"][0]
    version["schema"]["openAPIV3Schema"] = transform(version["schema"]["openAPIV3Schema"])
    name = f"{plural}.{group}"
    rule = vap["spec"]["matchConstraints"]["resourceRules"][0]
    rule["apiGroups"] = [group]
    if vap_on_status:
        rule["resources"] = [plural, f"{plural}/status"]
    vap["metadata"] = {"name": name}
    binding = {"apiVersion": "admissionregistration.k8s.io/v1", "kind": "ValidatingAdmissionPolicyBinding",
               "metadata": {"name": name}, "spec": {"policyName": name, "validationActions": ["Deny"]}}
    return [crd, vap, binding]


def running_status(name: str) -> dict[str, Any]:
    """The status of a run in the middle of an attempt, as the operator and the runner leave it."""
    now = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    pod = f"{name}-a1"
    return {
        "phase": api.Phase.RUNNING.value, "attempt": 1, "epoch": 1, "pod": pod, "restarts": 0, "disruptions": 0,
        "lease": {"holder": pod, "epoch": 1, "acquireTime": now, "renewTime": now, "durationSeconds": 60},
        "progress": {"step": 41, "stepName": "search", "completedSteps": 40, "summary": "40 steps",
                     "lastProgressTime": now},
        "cost": {"usd": "0.42", "tokens": 12000},
        "checkpoint": {"position": 41, "key": "runs/ns/name/uid/journal/00000041", "time": now},
        "inputHash": "0" * 64, "startTime": now, "attemptStartTime": now, "observedGeneration": 1,
        "conditions": [{"type": "Progressing", "status": "True", "reason": api.Phase.RUNNING.value,
                        "message": "attempt 1", "lastTransitionTime": now, "observedGeneration": 1}],
    }


def run_manifest(group: str, name: str) -> dict[str, Any]:
    return {
        "apiVersion": f"{group}/v1alpha1", "kind": "DurableRun", "metadata": {"name": name},
        "spec": {
            "workflow": "agents.research:run", "input": {"topic": "what one status write costs"},
            "events": {"approved": {"by": "someone"}},
            "checkpoint": {"uri": "s3://bench/writecost", "credentialsSecret": "s3-credentials"},
            "template": {"spec": {"containers": [{
                "name": "runner", "image": "registry.example/agents:1.4",
                "resources": {"requests": {"cpu": "500m", "memory": "512Mi"}, "limits": {"memory": "1Gi"}},
                "env": [{"name": "MODEL", "value": "large"}]}]}},
        },
    }


class Writer:
    """One kind of write, against one object, on the test bed."""

    def __init__(self, label: str, write: Callable[[int], None]) -> None:
        self.label, self.write = label, write


def _setup(bed: TestBed, namespace: str, variants: list[str]) -> tuple[list[Writer], dict[str, int]]:
    from kubernetes import client

    api_client = bed.api_client()
    core, custom = client.CoreV1Api(api_client), client.CustomObjectsApi(api_client)
    coordination = client.CoordinationV1Api(api_client)
    writers: list[Writer] = []
    sizes: dict[str, int] = {}
    core.create_namespaced_config_map(namespace, {"metadata": {"name": "renewal"},
                                                  "data": {"holder": "run-a1", "renewTime": "0"}})
    writers.append(Writer("configmap", lambda i: core.patch_namespaced_config_map(
        "renewal", namespace, [{"op": "test", "path": "/data/holder", "value": "run-a1"},
                               {"op": "add", "path": "/data/renewTime", "value": str(i)}])))
    coordination.create_namespaced_lease(namespace, {"metadata": {"name": "run"}, "spec": {
        "holderIdentity": "run-a1", "leaseDurationSeconds": 60}})
    writers.append(Writer("lease", lambda i: coordination.patch_namespaced_lease(
        "run", namespace, [{"op": "test", "path": "/spec/holderIdentity", "value": "run-a1"},
                           {"op": "add", "path": "/spec/renewTime",
                            "value": f"2026-01-01T00:00:00.{i % 1000000:06d}Z"}])))
    for variant in variants:
        docs = scratch_documents(variant)
        crd = docs[0]
        sizes[variant] = len(yaml.safe_dump(crd["spec"]["versions"][0]["schema"]))
        bed.kubectl("apply", "--server-side", "-f", "-", input=yaml.safe_dump_all(docs))
        bed.wait_established(crd["metadata"]["name"])
        group, plural = crd["spec"]["group"], crd["spec"]["names"]["plural"]
        _create_when_served(custom, group, namespace, plural, run_manifest(group, "run"))
        custom.patch_namespaced_custom_object_status(group, api.VERSION, namespace, plural, "run",
                                                     {"status": running_status("run")})
        _wait_policy_active(custom, group, namespace, plural)

        writers.append(Writer(f"dr-{variant}", _renewal(custom, group, namespace, plural)))
        if variant == "shipped":
            runner = _runner_client(bed, namespace, group, plural)
            writers.append(Writer("dr-runner", _renewal(client.CustomObjectsApi(runner), group, namespace, plural)))

            def get(_i: int, group: str = group, plural: str = plural) -> None:
                custom.get_namespaced_custom_object(group, api.VERSION, namespace, plural, "run")

            writers.append(Writer("dr-get", get))
    return writers, sizes


def _renewal(custom: Any, group: str, namespace: str, plural: str) -> Callable[[int], None]:
    """The runner's renewal of the run ``run``: test the epoch and the holder, set the renew time."""
    def renew(i: int) -> None:
        custom.patch_namespaced_custom_object_status(
            group, api.VERSION, namespace, plural, "run",
            [{"op": "test", "path": "/status/epoch", "value": 1},
             {"op": "test", "path": "/status/lease/holder", "value": "run-a1"},
             {"op": "add", "path": "/status/lease/renewTime", "value": f"2026-01-01T00:{i // 60 % 60:02d}:"
                                                                       f"{i % 60:02d}Z"}],
            _content_type=JSON_PATCH)

    return renew


def _runner_client(bed: TestBed, namespace: str, group: str, plural: str) -> Any:
    """An API client as the run's runner: the namespace's runner account, with a token bound to the run's current
    pod (status.pod, run-a1: a pod held unscheduled by a scheduling gate, never run)."""
    import tempfile

    from kubernetes import client, config

    bed.kubectl("apply", "-f", "-", input=yaml.safe_dump_all(runner_documents(group, plural, namespace)))
    core = client.CoreV1Api(bed.api_client())
    pod = core.create_namespaced_pod(namespace, {
        "metadata": {"name": "run-a1"},
        "spec": {"serviceAccountName": api.RUNNER_ACCOUNT, "schedulingGates": [{"name": f"{group}/never"}],
                 "containers": [{"name": "runner", "image": "registry.example/none:1"}]}})
    token = core.create_namespaced_service_account_token(api.RUNNER_ACCOUNT, namespace, {"spec": {
        "audiences": [], "expirationSeconds": 3600,
        "boundObjectRef": {"apiVersion": "v1", "kind": "Pod", "name": "run-a1", "uid": pod.metadata.uid}}})
    assert bed.controlplane
    user = f"system:serviceaccount:{namespace}:{api.RUNNER_ACCOUNT}"
    with tempfile.NamedTemporaryFile("w", suffix=".kubeconfig") as kubeconfig:
        kubeconfig.write(yaml.safe_dump(bed.controlplane.kubeconfig_dict(user, token.status.token)))
        kubeconfig.flush()
        runner = config.new_client_from_config(config_file=kubeconfig.name)
    # The policy takes effect asynchronously: wait until it refuses a runner's write of an operator's field.
    from kubernetes.client.rest import ApiException

    def refused() -> bool:
        try:
            client.CustomObjectsApi(runner).patch_namespaced_custom_object_status(
                group, api.VERSION, namespace, plural, "run", {"status": {"restarts": 7}})
        except ApiException as error:
            return bool(error.status == 422)
        raise AssertionError(f"{group}: a runner's write of status.restarts was accepted")

    procs.wait_for(refused, timeout=60, what=f"{group}: the runner-status policy to be active")
    return runner


def _create_when_served(custom: Any, group: str, namespace: str, plural: str, body: dict[str, Any]) -> None:
    def create() -> bool:
        custom.create_namespaced_custom_object(group, api.VERSION, namespace, plural, body)
        return True

    procs.wait_for(create, timeout=60, what=f"a DurableRun of {group} created")


def _wait_policy_active(custom: Any, group: str, namespace: str, plural: str) -> None:
    """Wait until the admission policy refuses a change of a set event (it takes effect asynchronously; no CRD
    rule guards spec.events)."""
    from kubernetes.client.rest import ApiException

    def refused() -> bool:
        try:
            custom.patch_namespaced_custom_object(group, api.VERSION, namespace, plural, "run",
                                                  {"spec": {"events": {"approved": {"by": "someone else"}}}})
        except ApiException as error:
            return bool(error.status == 422)
        raise AssertionError(f"{group}: a change of a set event was accepted")

    procs.wait_for(refused, timeout=60, what=f"{group}: the admission policy to be active")


def bench(bed: TestBed, *, writes: int, rounds: int, variants: list[str] | None = None,
          log: Any = print) -> dict[str, Any]:
    assert bed.controlplane
    assert bed.controlplane.apiserver
    assert bed.controlplane.etcd
    apiserver, etcd = bed.controlplane.apiserver.pid, bed.controlplane.etcd.pid
    namespace = f"bench-writecost-{uuid.uuid4().hex[:4]}"
    bed.kubectl("create", "namespace", namespace)
    writers, schema_sizes = _setup(bed, namespace, list(variants or VARIANTS))
    samples: dict[str, list[dict[str, float]]] = {w.label: [] for w in writers}
    for round_ in range(rounds):
        for writer in writers:
            writer.write(0)  # warm the client's connection and the server's caches for this object
            a0, e0, t0 = proc_cpu_seconds(apiserver), proc_cpu_seconds(etcd), time.perf_counter()
            for i in range(1, writes + 1):
                writer.write(round_ * writes + i)
            t1, a1, e1 = time.perf_counter(), proc_cpu_seconds(apiserver), proc_cpu_seconds(etcd)
            samples[writer.label].append({"apiserver_ms": (a1 - a0) / writes * 1e3,
                                          "etcd_ms": (e1 - e0) / writes * 1e3,
                                          "wall_ms": (t1 - t0) / writes * 1e3})
        log(f"  write cost round {round_ + 1}/{rounds}: " + ", ".join(
            f"{label} {s[-1]['apiserver_ms']:.2f}" for label, s in samples.items()) + " ms API server CPU/write")
    rows: dict[str, dict[str, Any]] = {}
    for label, runs in samples.items():
        rows[label] = {key: statistics.median(r[key] for r in runs) for key in ("apiserver_ms", "etcd_ms", "wall_ms")}
        rows[label]["rounds_apiserver_ms"] = [r["apiserver_ms"] for r in runs]
    floor = rows["configmap"]["apiserver_ms"]
    for row in rows.values():
        row["x_configmap"] = row["apiserver_ms"] / floor if floor else float("nan")
    bed.kubectl("delete", "namespace", namespace, "--wait=false")
    return {"writes": writes, "rounds": rounds, "rows": rows, "schema_bytes": schema_sizes}
