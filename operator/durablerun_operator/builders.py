"""Pure builders of the objects the operator creates for a run: the runner pod and its RBAC.

No API calls here: every function maps a run (and an epoch) to a manifest dict.
"""

from __future__ import annotations

import copy
import hashlib
from typing import Any

from durablerun import api, relations, resource, schedules
from durablerun_operator.config import Settings

DEFAULT_COMMAND = ["durablerun", "pod"]


def pod_name(run_name: str, epoch: int) -> str:
    """Deterministic, so a repeated create of one attempt is a no-op (AlreadyExists)."""
    return f"{run_name}-a{epoch}"


def purge_pod_name(run_name: str) -> str:
    return f"{run_name}-purge"


def check_pod_name(run_name: str, request: str) -> str:
    """One name per upgrade request: creating it again is a no-op, and a new request gets a new pod."""
    return f"{check_pod_prefix(run_name)}{hashlib.sha256(request.encode()).hexdigest()[:10]}"


def check_pod_prefix(run_name: str) -> str:
    return f"{run_name}-check-"


def runner_account(run_name: str) -> str:
    return api.runner_account(run_name)


def owner_reference(run: dict[str, Any]) -> dict[str, Any]:
    meta = run["metadata"]
    return {
        "apiVersion": api.API_VERSION,
        "kind": api.KIND,
        "name": meta["name"],
        "uid": meta["uid"],
        "controller": True,
        "blockOwnerDeletion": True,
    }


def _labels(run_name: str) -> dict[str, str]:
    return {
        api.LABEL_RUN: run_name,
        api.LABEL_MANAGED_BY: api.APP_NAME,
        api.LABEL_NAME: api.RUNNER_APP_NAME,
    }


def service_account_name(run: dict[str, Any], settings: Settings) -> str:
    """The pod's ServiceAccount: the template's own (e.g. for workload identity), else the namespace's runner
    account, or in per-run access the run's own."""
    template_spec = (run["spec"].get("template") or {}).get("spec") or {}
    if template_spec.get("serviceAccountName"):
        return str(template_spec["serviceAccountName"])
    if settings.runner_access == api.RUNNER_ACCESS_RUN:
        return runner_account(run["metadata"]["name"])
    return api.RUNNER_ACCOUNT


def runner_rbac(run: dict[str, Any], settings: Settings) -> list[dict[str, Any]]:
    """What the pod's ServiceAccount needs to work, made before the run's first attempt (``kube.ensure``: each
    one is created unless it exists): the ServiceAccount (unless the template names one), a Role, and the
    RoleBinding, last.

    A runner reads runs and patches their status, and nothing else: not pods, not Secrets. By default the Role
    is the namespace's (api.RUNNER_ROLE, on every run of it), made once and kept, and the runner-status
    admission policy holds each write to the run whose current attempt is the writer's pod. In per-run access
    the Role names the run itself and the objects are the run's, deleted with it.
    """
    name, namespace = run["metadata"]["name"], run["metadata"]["namespace"]
    account = service_account_name(run, settings)
    per_run = settings.runner_access == api.RUNNER_ACCESS_RUN
    meta: dict[str, Any] = {"namespace": namespace, "labels": {
        api.LABEL_MANAGED_BY: api.APP_NAME, api.LABEL_NAME: api.RUNNER_APP_NAME}}
    if per_run:
        meta = {"namespace": namespace, "labels": _labels(name), "ownerReferences": [owner_reference(run)]}
    role = runner_account(name) if per_run else api.RUNNER_ROLE
    only = {"resourceNames": [name]} if per_run else {}
    objects: list[dict[str, Any]] = []
    if account == (runner_account(name) if per_run else api.RUNNER_ACCOUNT):
        objects.append({
            "apiVersion": "v1", "kind": "ServiceAccount",
            "metadata": {"name": account, **copy.deepcopy(meta)},
        })
    objects.append({
        "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "Role",
        "metadata": {"name": role, **copy.deepcopy(meta)},
        "rules": [
            {"apiGroups": [api.GROUP], "resources": [api.PLURAL], **only, "verbs": ["get", "watch"]},
            {"apiGroups": [api.GROUP], "resources": [f"{api.PLURAL}/status"], **only, "verbs": ["get", "patch"]},
        ],
    })
    objects.append({
        "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding",
        "metadata": {"name": runner_account(name) if per_run else api.runner_binding(account), **copy.deepcopy(meta)},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": role},
        "subjects": [{"kind": "ServiceAccount", "name": account, "namespace": namespace}],
    })
    return objects


def purge_pod(run: dict[str, Any], settings: Settings) -> dict[str, Any]:
    """The pod that deletes a run's journal (retention Delete), with the runner's image and credentials.

    The operator itself never holds store credentials: the runner, which has
    them from the run's Secret or workload identity, deletes its own journal.
    """
    # The template's image, not the pin: deleting a journal needs only the SDK, and a pinned image that is gone
    # from the node must not keep a deleted run from going.
    pod = runner_pod({**run, "status": {}}, 0, settings)
    pod["metadata"]["name"] = purge_pod_name(run["metadata"]["name"])
    pod["metadata"]["labels"].pop(api.LABEL_EPOCH, None)
    pod["metadata"]["labels"][api.LABEL_PURGE] = "true"
    runner = next(c for c in pod["spec"]["containers"] if any(e["name"] == api.Env.EPOCH for e in c["env"]))
    runner["env"].append({"name": api.Env.MODE, "value": api.Env.MODE_PURGE})
    return pod


def check_pod(run: dict[str, Any], settings: Settings) -> dict[str, Any]:
    """The one-off pod that checks an upgrade (status.upgradeCheck): the image asked for runs ``durablerun replay``
    against the run's journal, executing nothing, with what the run's attempts get (its ServiceAccount, its store
    credentials from its Secret, the template's env, resources and placement, restricted security). Only the
    runner container: a sidecar has nothing to check. Its exit code and termination message are the verdict."""
    meta, check = run["metadata"], run["status"]["upgradeCheck"]
    pod = runner_pod({**run, "status": {}}, 0, settings)
    pod["metadata"]["name"] = check_pod_name(meta["name"], check["request"])
    pod["metadata"]["labels"].pop(api.LABEL_EPOCH, None)
    pod["metadata"]["labels"][api.LABEL_UPGRADE_CHECK] = "true"
    pod["metadata"].pop("finalizers", None)  # it holds no lease and writes nothing: nothing to wait for
    runner = runner_container(pod["spec"])
    pod["spec"]["containers"] = [runner]
    runner.update(image=check["image"], command=["durablerun", "replay", run["spec"]["workflow"], "--kubernetes",
                                                 f"{meta['namespace']}/{meta['name']}"])
    runner.pop("args", None)
    runner["env"] = [e for e in runner["env"] if e["name"] != api.Env.EPOCH]  # it is no attempt
    return pod


def runner_pod(run: dict[str, Any], epoch: int, settings: Settings) -> dict[str, Any]:
    """Attempt ``epoch``'s pod: the user's template plus what the runner needs.

    The operator adds its env, labels, owner reference, finalizer, restartPolicy
    Never and secure defaults (restricted Pod Security Standard) where the
    template says nothing.
    """
    meta, spec = run["metadata"], run["spec"]
    name = pod_name(meta["name"], epoch)
    template = copy.deepcopy(spec.get("template") or {})
    template_meta = template.get("metadata") or {}
    pod_spec: dict[str, Any] = template.get("spec") or {}

    runner = runner_container(pod_spec)
    runner.setdefault("image", settings.runner_image)
    pin = (run.get("status") or {}).get("pin") or {}
    if pin.get("image"):
        # Pinned at its first attempt (or moved by kubectl durablerun upgrade): the code that wrote the journal,
        # whatever the template's tag names now. A digest never changes, so there is nothing to pull again.
        runner["image"] = pin["image"]
        runner["imagePullPolicy"] = "IfNotPresent"
    if not runner.get("command") and not runner.get("args"):
        runner["command"] = list(DEFAULT_COMMAND)
    runner["terminationMessagePath"] = api.TERMINATION_MESSAGE_PATH
    runner["terminationMessagePolicy"] = "FallbackToLogsOnError"
    own = [*(runner.get("env") or [])]
    named = {e.get("name") for e in own}
    # The chart's tracing settings, unless the template sets the variable itself (a run traced elsewhere).
    otel = [{"name": k, "value": v} for k, v in settings.otel_env if k not in named]
    runner["env"] = [*own, *otel, *_runner_env(run, epoch, settings)]
    security = runner.setdefault("securityContext", {})
    security.setdefault("allowPrivilegeEscalation", False)
    security.setdefault("readOnlyRootFilesystem", True)
    security.setdefault("runAsNonRoot", True)
    security.setdefault("capabilities", {"drop": ["ALL"]})
    mounts = runner.setdefault("volumeMounts", [])
    if not any(m.get("mountPath") == "/tmp" for m in mounts):
        mounts.append({"name": "durablerun-tmp", "mountPath": "/tmp"})
        pod_spec.setdefault("volumes", []).append({"name": "durablerun-tmp", "emptyDir": {}})

    if settings.webhook_url:
        # For ctx.webhook_url: a ServiceAccount token only the webhook ingress accepts, bound to this pod, which
        # the runner trades there for its run's own signing key. Never the namespace's keys: with them a
        # workflow could sign URLs for every run of its namespace (docs/security.md, "Webhook keys").
        directory, file = api.WEBHOOK_TOKEN_PATH.rsplit("/", 1)
        mounts.append({"name": "durablerun-webhook-token", "mountPath": directory, "readOnly": True})
        pod_spec.setdefault("volumes", []).append({"name": "durablerun-webhook-token", "projected": {"sources": [
            {"serviceAccountToken": {"audience": api.WEBHOOK_TOKEN_AUDIENCE, "expirationSeconds": 3600,
                                     "path": file}}]}})

    pod_security = pod_spec.setdefault("securityContext", {})
    pod_security.setdefault("runAsNonRoot", True)
    pod_security.setdefault("seccompProfile", {"type": "RuntimeDefault"})
    pod_spec["restartPolicy"] = "Never"
    pod_spec["serviceAccountName"] = service_account_name(run, settings)
    pod_spec["automountServiceAccountToken"] = True
    policy = resource.Policy.model_validate(spec.get("policy") or {})
    grace = policy.pod_grace_seconds(pod_spec.get("terminationGracePeriodSeconds"))
    pod_spec["terminationGracePeriodSeconds"] = grace
    runner["env"].append({"name": api.Env.STOP_GRACE_SECONDS, "value": f"{policy.stop_grace(grace).total_seconds():g}"})
    if policy.quotaPriority:
        runner["env"].append({"name": api.Env.LLM_QUOTA_PRIORITY, "value": str(policy.quotaPriority)})

    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": name,
            "namespace": meta["namespace"],
            "labels": {**(template_meta.get("labels") or {}), **_labels(meta["name"]),
                       api.LABEL_EPOCH: str(epoch)},
            "annotations": dict(template_meta.get("annotations") or {}),
            "ownerReferences": [owner_reference(run)],
            "finalizers": [api.POD_FINALIZER],
        },
        "spec": pod_spec,
    }


def runner_container(pod_spec: dict[str, Any]) -> dict[str, Any]:
    """The container that runs `durablerun pod`: the one named ``runner``, else the first; added if none."""
    containers: list[dict[str, Any]] = pod_spec.setdefault("containers", [])
    runner = next((c for c in containers if c.get("name") == api.RUNNER_CONTAINER), None)
    if runner is None and containers:
        runner = containers[0]
    if runner is None:
        runner = {"name": api.RUNNER_CONTAINER}
        containers.append(runner)
    return runner


def runner_image(pod: dict[str, Any]) -> str | None:
    """The image a pod's runner container names."""
    containers = (pod.get("spec") or {}).get("containers") or []
    runner = next((c for c in containers if c.get("name") == api.RUNNER_CONTAINER), None) or \
        (containers[0] if containers else {})
    return str(runner["image"]) if runner.get("image") else None


def _runner_env(run: dict[str, Any], epoch: int, settings: Settings) -> list[dict[str, Any]]:
    meta, checkpoint = run["metadata"], run["spec"]["checkpoint"]
    env: list[dict[str, Any]] = [
        {"name": api.Env.NAMESPACE, "value": meta["namespace"]},
        {"name": api.Env.NAME, "value": meta["name"]},
        {"name": api.Env.UID, "value": meta["uid"]},
        {"name": api.Env.EPOCH, "value": str(epoch)},
        {"name": api.Env.POD_NAME, "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}},
        {"name": api.Env.NODE_NAME, "valueFrom": {"fieldRef": {"fieldPath": "spec.nodeName"}}},
        {"name": api.Env.TERMINATION_MESSAGE_PATH, "value": api.TERMINATION_MESSAGE_PATH},
    ]
    if settings.cluster_name:
        env.append({"name": api.Env.CLUSTER, "value": settings.cluster_name})
    if settings.webhook_url:
        env.append({"name": api.Env.WEBHOOK_URL, "value": settings.webhook_url})
    secret = checkpoint.get("credentialsSecret")
    if secret:
        # The operator never reads the Secret: the kubelet injects it into the runner.
        for key in api.STORE_SECRET_KEYS:
            env.append({"name": key, "valueFrom": {"secretKeyRef": {"name": secret, "key": key}}})
        # Optional keys: temporary credentials, and the endpoint of an S3-compatible server
        # (so one manifest works against different stores, as in the local sandbox).
        for key in api.STORE_SECRET_OPTIONAL_KEYS:
            env.append({"name": key, "valueFrom": {"secretKeyRef": {"name": secret, "key": key, "optional": True}}})
    return env


def memory_limit(pod: dict[str, Any]) -> str | None:
    """The runner container's memory limit, for an OOMKilled message."""
    for container in (pod.get("spec") or {}).get("containers") or []:
        if container.get("name") == api.RUNNER_CONTAINER or len(pod["spec"]["containers"]) == 1:
            limit = ((container.get("resources") or {}).get("limits") or {}).get("memory")
            return str(limit) if limit else None
    return None


def child_run(parent: dict[str, Any], child: str, request: relations.ChildRequest) -> dict[str, Any]:
    """The DurableRun ``<parent>-<child>`` a parent's runner asked for; ValueError naming what is wrong.

    Owned by the parent (controller, so deleting the parent deletes it: garbage collection) and
    labelled with its name (``kubectl get dr -l durablerun.dev/parent=<parent>``). Its spec is
    ``resource.child_spec``: the parent's template and store, its policy narrowed by the request.
    """
    meta = parent["metadata"]
    parent_spec = resource.DurableRunSpec.model_validate(parent["spec"])
    spec = resource.child_spec(parent_spec, request)
    annotations = {api.ANNOTATION_PARENT_TRACE: api.trace_id(
        api.run_key(meta["namespace"], meta["name"], meta["uid"], parent_spec.checkpoint.runId))}
    if spec.suspend:  # born suspended with a suspended parent, and resumed with it
        annotations[api.ANNOTATION_SUSPENDED_BY_PARENT] = "true"
    body = spec.model_dump(mode="json", exclude_none=True)
    pin = ((parent.get("status") or {}).get("pin") or {}).get("image")
    if pin:  # the code that asked for the child runs it: a child starts on its parent's pinned image
        template = body.setdefault("template", {})
        runner_container(template.setdefault("spec", {}))["image"] = pin
    return {
        "apiVersion": api.API_VERSION, "kind": api.KIND,
        "metadata": {
            "name": relations.child_run_name(meta["name"], child),
            "namespace": meta["namespace"],
            "labels": {api.LABEL_PARENT: meta["name"], api.LABEL_MANAGED_BY: "durable-run"},
            "annotations": annotations,
            "ownerReferences": [owner_reference(parent)],
        },
        "spec": body,
    }


def scheduled_run(schedule: dict[str, Any], tick: Any) -> dict[str, Any]:
    """The DurableRun a DurableRunSchedule creates for ``tick`` (an aware datetime): named after the tick
    (``schedules.run_name``), labelled with the schedule's name, annotated with the tick, and owned by the
    schedule (controller, so deleting the schedule deletes its runs). Its spec is the template's, as the API
    server stored it."""
    meta = schedule["metadata"]
    template = schedule["spec"]["runTemplate"]
    template_meta = template.get("metadata") or {}
    return {
        "apiVersion": api.API_VERSION, "kind": api.KIND,
        "metadata": {
            "name": schedules.run_name(meta["name"], tick),
            "namespace": meta["namespace"],
            "labels": {**(template_meta.get("labels") or {}), api.LABEL_SCHEDULE: meta["name"],
                       api.LABEL_MANAGED_BY: api.APP_NAME},
            "annotations": {**(template_meta.get("annotations") or {}),
                            api.ANNOTATION_SCHEDULED_TIME: api.format_time(tick)},
            "ownerReferences": [{"apiVersion": api.API_VERSION, "kind": api.SCHEDULE_KIND, "name": meta["name"],
                                 "uid": meta["uid"], "controller": True, "blockOwnerDeletion": True}],
        },
        "spec": copy.deepcopy(template["spec"]),
    }
