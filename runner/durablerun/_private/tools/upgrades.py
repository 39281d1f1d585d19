"""``kubectl durablerun upgrade``: move a run to new code deliberately, and only to code that replays its journal.

The check runs where the code will run: a one-off pod of the new image, with the run's own ServiceAccount, store
credentials (its Secret, injected by the kubelet) and the restricted security its attempts get, runs
``durablerun replay`` against the run's journal. Only a clean replay moves the run: the plugin sets the
``durablerun.dev/upgrade`` annotation to the digest the check pod ran (from its container status), and the operator
moves ``status.pin`` (who, when, from what), posts an Event and counts it. A divergence, a workflow that raises, an
image that cannot start: printed, and nothing changes. docs/operator.md, "Upgrading code under running runs".
"""

from __future__ import annotations

import copy
import json
import os
import time
import uuid
from dataclasses import dataclass
from typing import Any

from durablerun import api
from durablerun._private.tools.kubeapi import KIND_REF, RESOURCE, Kubectl, PluginError

#: An attempt is writing the journal: the check would not cover what it adds.
_HOLDING = (api.Phase.RUNNING,)
_CANNOT_START = ("ErrImagePull", "ImagePullBackOff", "ErrImageNeverPull", "InvalidImageName",
                 "CreateContainerConfigError", "CreateContainerError")


@dataclass(frozen=True)
class Check:
    """How the new image replayed the run's journal."""

    run: str
    image: str
    clean: bool
    digest: str | None  # what the check pod ran, by digest (None: the node reported none)
    report: str  # the replayer's output (or why the pod could not run it)
    started: bool = True  # False: the image could not start (not pullable, a bad name)


def check_pod(run: dict[str, Any], image: str) -> dict[str, Any]:
    """The one-off pod that replays ``run``'s journal with ``image``: the run's template (env, resources, node
    placement), only its runner container, the run's ServiceAccount, restricted security, no lease, no label the
    operator reads (it is no attempt of the run)."""
    meta, spec = run["metadata"], run["spec"]
    template = copy.deepcopy(spec.get("template") or {})
    pod_spec: dict[str, Any] = template.get("spec") or {}
    containers = pod_spec.get("containers") or []
    runner = next((c for c in containers if c.get("name") == api.RUNNER_CONTAINER), None) or \
        (containers[0] if containers else {"name": api.RUNNER_CONTAINER})
    env = list(runner.get("env") or [])
    secret = (spec.get("checkpoint") or {}).get("credentialsSecret")
    if secret:  # the run's own store credentials, as its attempts get them; never read by the plugin
        env += [{"name": key, "valueFrom": {"secretKeyRef": {"name": secret, "key": key}}}
                for key in api.STORE_SECRET_KEYS]
        env += [{"name": key, "valueFrom": {"secretKeyRef": {"name": secret, "key": key, "optional": True}}}
                for key in api.STORE_SECRET_OPTIONAL_KEYS]
    container = {
        "name": api.RUNNER_CONTAINER, "image": image,
        "command": ["durablerun", "replay", spec["workflow"], "--kubernetes", f"{meta['namespace']}/{meta['name']}"],
        "env": env, "resources": runner.get("resources") or {},
        "securityContext": {"allowPrivilegeEscalation": False, "readOnlyRootFilesystem": True, "runAsNonRoot": True,
                            "capabilities": {"drop": ["ALL"]}},
        "volumeMounts": [{"name": "tmp", "mountPath": "/tmp"}],
        "terminationMessagePolicy": "FallbackToLogsOnError",
    }
    if runner.get("workingDir"):
        container["workingDir"] = runner["workingDir"]
    keep = ("nodeSelector", "tolerations", "affinity", "imagePullSecrets", "priorityClassName")
    return {
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": f"{meta['name'][:40]}-upgrade-{uuid.uuid4().hex[:8]}", "namespace": meta["namespace"],
                     "labels": {api.LABEL_MANAGED_BY: api.APP_NAME}},
        "spec": {
            **{k: pod_spec[k] for k in keep if k in pod_spec},
            "serviceAccountName": pod_spec.get("serviceAccountName") or api.runner_account(meta["name"]),
            "automountServiceAccountToken": True,
            "restartPolicy": "Never",
            "securityContext": {"runAsNonRoot": True, "seccompProfile": {"type": "RuntimeDefault"},
                                **(pod_spec.get("securityContext") or {})},
            "containers": [container],
            "volumes": [{"name": "tmp", "emptyDir": {}}],
        },
    }


def replay_in_pod(kube: Kubectl, run: dict[str, Any], image: str, timeout: float) -> Check:
    """Run the check pod to its end; it is deleted whatever happens."""
    name = run["metadata"]["name"]
    pod = check_pod(run, image)
    pod_name = pod["metadata"]["name"]
    kube("create", "-f", "-", input=json.dumps(pod))
    try:
        deadline = time.monotonic() + timeout
        while True:
            status = kube.json("get", "pod", pod_name).get("status") or {}
            runner: dict[str, Any] = next(iter(status.get("containerStatuses") or []), {})
            state = runner.get("state") or {}
            waiting = (state.get("waiting") or {}).get("reason")
            if waiting in _CANNOT_START:
                message = (state.get("waiting") or {}).get("message") or ""
                return Check(name, image, False, None, f"{waiting}: {message}".strip(), started=False)
            if state.get("terminated"):
                code = int(state["terminated"].get("exitCode", -1))
                logs = kube("logs", pod_name, check=False).stdout.strip() or state["terminated"].get("message", "")
                return Check(name, image, code == 0, api.image_digest(str(runner.get("imageID") or "")),
                             logs if code in (0, 1, 3) else f"the replayer exited {code}: {logs}")
            if time.monotonic() > deadline:
                return Check(name, image, False, None, f"the check pod {pod_name} did not finish in {timeout:.0f}s")
            time.sleep(1)
    finally:
        kube("delete", "pod", pod_name, "--wait=false", "--ignore-not-found", check=False)


def who(kube: Kubectl) -> str:
    """The user as the API server knows them (kubectl auth whoami), else $USER."""
    found = kube("auth", "whoami", "-o", "jsonpath={.status.userInfo.username}", check=False)
    return found.stdout.strip() if found.returncode == 0 and found.stdout.strip() else os.environ.get("USER", "?")


def upgrade(kube: Kubectl, run_name: str, image: str, *, check_only: bool, timeout: float) -> str:
    """Check ``image`` against the run's journal and, unless ``check_only``, move the run to its digest."""
    run = kube.run(run_name)
    status = run.get("status") or {}
    pinned = (status.get("pin") or {}).get("image")
    if not pinned:
        raise PluginError(f"{run_name} is not pinned to an image yet (no attempt has reported one): its next attempt "
                          "runs spec.template's image; there is nothing to move")
    if status.get("phase") in _HOLDING:
        raise PluginError(f"{run_name} is {status['phase']}: an attempt is adding to its journal, which the check "
                          f"would not cover. Upgrade it while it waits, or suspend it first (kubectl durablerun "
                          f"suspend {run_name})")
    check = replay_in_pod(kube, run, image, timeout)
    if not check.started:
        raise PluginError(f"{run_name}: {image} cannot start ({check.report}): name an image the nodes can pull; "
                          "nothing changed")
    if not check.clean:
        raise PluginError(f"{run_name}: {image} does not replay the run's journal; nothing changed.\n{check.report}")
    if check.digest is None:
        raise PluginError(f"{run_name}: {image} replays the journal cleanly, but the node reported no digest for it "
                          "(a node that runs no images): the run cannot be pinned to it; nothing changed")
    if check_only:
        return f"{KIND_REF}/{run_name}: {image} ({check.digest}) replays the journal cleanly (--check: nothing changed)"
    if check.digest == pinned:
        return f"{KIND_REF}/{run_name} already runs {check.digest}"
    value = json.dumps({"image": check.digest, "by": who(kube), "checkedIn": image}, separators=(",", ":"))
    kube("annotate", RESOURCE, run_name, f"{api.ANNOTATION_UPGRADE}={value}", "--overwrite")
    return (f"{KIND_REF}/{run_name} upgraded: {image} ({check.digest}) replays the journal cleanly; the next attempt "
            f"runs it instead of {pinned}")


def upgrade_selected(kube: Kubectl, selector: str, image: str, *, check_only: bool, timeout: float) -> tuple[int, str]:
    """The bulk form: each run the label selector names, checked and moved on its own; (runs refused, report)."""
    names = [r["metadata"]["name"] for r in kube.json("get", RESOURCE, "-l", selector).get("items") or []]
    if not names:
        raise PluginError(f"no DurableRun matches -l {selector}")
    lines, refused = [], 0
    for name in names:
        try:
            lines.append(upgrade(kube, name, image, check_only=check_only, timeout=timeout))
        except PluginError as e:
            refused += 1
            lines.append(f"{KIND_REF}/{name} refused: {e}")
    return refused, "\n".join(lines)
