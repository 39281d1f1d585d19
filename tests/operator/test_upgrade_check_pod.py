"""The pod the operator checks an upgrade's image in (`builders.check_pod`), as a manifest.

It must act as the run's own attempts do (its ServiceAccount, its store credentials from its Secret, restricted
security) and must not look like an attempt (no epoch, no finalizer: it holds no lease and writes nothing). The
real node runs it end to end: tests/realnode/test_pinning.py.
"""

from __future__ import annotations

from typing import Any

from durablerun import api
from durablerun_operator import builders
from durablerun_operator.config import Settings


def check_pod(run: dict[str, Any], image: str) -> dict[str, Any]:
    run["status"] = {"upgradeCheck": {"request": "{}", "image": image, "by": "dana", "state": "Checking"}}
    return builders.check_pod(run, Settings())


def run(template: dict[str, Any] | None = None) -> dict[str, Any]:
    spec: dict[str, Any] = {"workflow": "agents.review:run",
                            "checkpoint": {"uri": "s3://b/runs", "credentialsSecret": "s3-creds"}}
    if template is not None:
        spec["template"] = template
    return {"metadata": {"name": "review", "namespace": "team-a", "uid": "u1"}, "spec": spec}


def test_the_check_pod_replays_the_runs_journal_with_the_new_image_as_the_runs_own_attempts_would() -> None:
    template = {"spec": {"nodeSelector": {"pool": "agents"}, "containers": [
        {"name": "sidecar", "image": "proxy:1"},
        {"name": api.RUNNER_CONTAINER, "image": "agents:v1", "env": [{"name": "MODE", "value": "x"}],
         "resources": {"limits": {"memory": "1Gi"}}, "workingDir": "/app"}]}}
    pod = check_pod(run(template), "agents:v2")
    [container] = pod["spec"]["containers"]  # only the runner: no sidecar
    assert container["image"] == "agents:v2"
    assert container["command"] == ["durablerun", "replay", "agents.review:run", "--kubernetes", "team-a/review"]
    env = {e["name"]: e for e in container["env"]}
    assert env["MODE"]["value"] == "x"
    assert env["AWS_ACCESS_KEY_ID"]["valueFrom"]["secretKeyRef"] == {"name": "s3-creds", "key": "AWS_ACCESS_KEY_ID"}
    assert container["resources"] == {"limits": {"memory": "1Gi"}}
    assert container["workingDir"] == "/app"
    assert container["securityContext"] == {"allowPrivilegeEscalation": False, "readOnlyRootFilesystem": True,
                                            "runAsNonRoot": True, "capabilities": {"drop": ["ALL"]}}
    spec = pod["spec"]
    assert spec["serviceAccountName"] == api.RUNNER_ACCOUNT
    assert spec["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
    assert spec["nodeSelector"] == {"pool": "agents"}
    assert spec["restartPolicy"] == "Never"
    labels = pod["metadata"]["labels"]
    assert labels[api.LABEL_RUN] == "review"  # its changes wake the run
    assert api.LABEL_EPOCH not in labels  # but it is no attempt
    assert labels[api.LABEL_UPGRADE_CHECK] == "true"
    assert "finalizers" not in pod["metadata"]
    assert pod["metadata"]["ownerReferences"][0]["uid"] == "u1"  # deleted with the run


def test_the_check_pod_uses_the_templates_own_service_account() -> None:
    pod = check_pod(run({"spec": {"serviceAccountName": "workload-identity"}}), "agents:v2")
    assert pod["spec"]["serviceAccountName"] == "workload-identity"
    assert pod["spec"]["containers"][0]["name"] == api.RUNNER_CONTAINER
