"""The process node reports through the real API what a kubelet would."""

from __future__ import annotations

import json
import signal
from pathlib import Path
from typing import Any

import pytest

from durablerun_testbed import procs
from durablerun_testbed.processnode.node import ending_reason
from durablerun_testbed.testbed import TestBed
from tests.testbed.node_pods import pod_json, run_pod, wait_phase

pytestmark = pytest.mark.testbed


def terminated(pod: dict[str, Any]) -> dict[str, Any]:
    result: dict[str, Any] = pod["status"]["containerStatuses"][0]["state"]["terminated"]
    return result


def test_exit_code_and_termination_message(testbed: TestBed, namespace: str) -> None:
    testbed.kubectl("create", "secret", "generic", "creds", "-n", namespace, "--from-literal=token=s3cret")
    script = 'printf "%s|%s|%s|%s" "$POD" "$TOKEN" "$TEAM" "$(pwd)" > /dev/termination-log; exit 3'
    run_pod(testbed, namespace, "exit3", script, workingDir="/tmp", env=[
        {"name": "POD", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}},
        {"name": "TOKEN", "valueFrom": {"secretKeyRef": {"name": "creds", "key": "token"}}},
        {"name": "TEAM", "valueFrom": {"fieldRef": {"fieldPath": "metadata.labels['team']"}}},
    ])
    state = terminated(wait_phase(testbed, namespace, "exit3", "Failed"))
    assert state["exitCode"] == 3
    assert state["reason"] == "Error"
    assert state["message"] == "exit3|s3cret|agents|/tmp"


def test_custom_termination_message_path_and_success(testbed: TestBed, namespace: str) -> None:
    run_pod(testbed, namespace, "ok", "echo done > /tmp/outcome/message",
            terminationMessagePath="/tmp/outcome/message")
    state = terminated(wait_phase(testbed, namespace, "ok", "Succeeded"))
    assert (state["exitCode"], state["reason"], state["message"]) == (0, "Completed", "done\n")


def test_service_account_token_reaches_the_api_server(testbed: TestBed, namespace: str) -> None:
    # The projected token is a real bound token: the pod can ask who it is.
    script = (
        'python3 -c "'
        "from kubernetes import client, config; config.load_incluster_config(); "
        "review = {'apiVersion': 'authentication.k8s.io/v1', 'kind': 'SelfSubjectReview'}; "
        "r = client.AuthenticationV1Api().create_self_subject_review(review); "
        "open('/dev/termination-log', 'w').write(r.status.user_info.username)"
        '"'
    )
    run_pod(testbed, namespace, "whoami", script)
    state = terminated(wait_phase(testbed, namespace, "whoami", "Succeeded"))
    assert state["message"] == f"system:serviceaccount:{namespace}:default"


def test_missing_secret_keeps_the_pod_pending(testbed: TestBed, namespace: str) -> None:
    run_pod(testbed, namespace, "nosecret", "exit 0", env=[
        {"name": "X", "valueFrom": {"secretKeyRef": {"name": "absent", "key": "k"}}}])
    waiting = procs.wait_for(
        lambda: pod_json(testbed, namespace, "nosecret")["status"]["containerStatuses"][0]["state"].get(
            "waiting"
        ),
        timeout=30, what="a waiting container status",
    )
    assert waiting["reason"] == "CreateContainerConfigError"
    assert 'secret "absent" not found' in waiting["message"]
    assert pod_json(testbed, namespace, "nosecret")["status"]["phase"] == "Pending"


@pytest.mark.parametrize(("fault", "reason"), [("kill", "Error"), ("oom", "OOMKilled")])
def test_a_killed_container_reports_137_and_why(testbed: TestBed, namespace: str, fault: str, reason: str) -> None:
    run_pod(testbed, namespace, fault, "sleep 300")
    wait_phase(testbed, namespace, fault, "Running")
    assert testbed.node
    getattr(testbed.node, fault)(namespace, fault)  # SIGKILL as a crash would, or as the OOM killer would
    state = terminated(wait_phase(testbed, namespace, fault, "Failed"))
    assert (state["exitCode"], state["reason"]) == (137, reason)


def test_an_oom_kill_that_lands_after_the_exit_is_not_reported() -> None:
    # The race behind fault trial p36-3: the runner exited on its own (here with 3) between the fault's
    # lookup of a running container and its SIGKILL; the kernel would not have OOM-killed a dead process.
    assert ending_reason(-signal.SIGKILL, oom_marked=True) == "OOMKilled"
    assert ending_reason(3, oom_marked=True) == "Error"
    assert ending_reason(0, oom_marked=True) == "Completed"
    assert ending_reason(-signal.SIGKILL, oom_marked=False) == "Error"


def test_pause_and_continue(testbed: TestBed, namespace: str) -> None:
    run_pod(testbed, namespace, "sleepy", "sleep 300")
    wait_phase(testbed, namespace, "sleepy", "Running")
    assert testbed.node
    pid = testbed.node.pause(namespace, "sleepy")["pid"]
    procs.wait_for(lambda: "\nState:\tT" in Path(f"/proc/{pid}/status").read_text(),
                   timeout=10, what="the process to be stopped")
    testbed.node.cont(namespace, "sleepy")
    procs.wait_for(lambda: "\nState:\tT" not in Path(f"/proc/{pid}/status").read_text(),
                   timeout=10, what="the process to run again")
    assert pod_json(testbed, namespace, "sleepy")["status"]["phase"] == "Running"


def test_a_pod_force_deleted_while_paused_lives_until_continued_then_gets_sigterm(
        testbed: TestBed, namespace: str, tmp_path: Path) -> None:
    # A partitioned kubelet does not hear that its pod was force-deleted (the operator does it to a pod stuck
    # terminating): the container lives on, and is stopped as the pod's deletion says once the node is back.
    marker, trapping = tmp_path / "got-term", tmp_path / "trapping"
    run_pod(testbed, namespace, "cutoff",
            f"trap 'touch {marker}; exit 7' TERM; touch {trapping}; while true; do sleep 0.1; done")
    wait_phase(testbed, namespace, "cutoff", "Running")
    # Paused before its shell set the trap (a loaded machine), the container would die of the SIGTERM (143).
    procs.wait_for(trapping.exists, timeout=30, what="the container's shell to set its trap")
    assert testbed.node
    pid = testbed.node.pause(namespace, "cutoff")["pid"]
    testbed.kubectl("delete", "pod", "cutoff", "-n", namespace, "--grace-period=0", "--force", "--wait=true")
    assert procs.pid_alive(pid), "the paused container was killed although its node was cut off"
    assert not marker.exists()
    testbed.node.cont(namespace, "cutoff")
    ended = procs.wait_for(lambda: next((p for p in testbed.node.processes()  # type: ignore[union-attr]
                                         if p["pid"] == pid and p["exitCode"] is not None), None),
                           timeout=30, what="the continued container to stop")
    assert ended["exitCode"] == 7, ended
    assert marker.exists(), "the continued container got no SIGTERM"


def test_graceful_deletion_sends_sigterm(testbed: TestBed, namespace: str, tmp_path: Path) -> None:
    marker = tmp_path / "got-term"
    script = f"trap 'touch {marker}; exit 0' TERM; while true; do sleep 0.1; done"
    run_pod(testbed, namespace, "graceful", script)
    wait_phase(testbed, namespace, "graceful", "Running")
    testbed.kubectl("delete", "pod", "graceful", "-n", namespace, "--wait=true", "--timeout=30s")
    assert marker.exists(), "the container did not get SIGTERM before its pod was deleted"


def test_lost_node_kills_unreported_and_deletes_the_pod(testbed: TestBed, namespace: str) -> None:
    run_pod(testbed, namespace, "stranded", "sleep 300")
    pod = wait_phase(testbed, namespace, "stranded", "Running")
    # A finalizer keeps the pod visible so its last status can be read, as the operator does.
    testbed.kubectl("patch", "pod", "stranded", "-n", namespace, "--type=merge",
                    "-p", '{"metadata": {"finalizers": ["durablerun.dev/test"]}}')
    assert testbed.node
    pid = testbed.node.lose(namespace, "stranded")["pid"]
    gone = procs.wait_for(
        lambda: (p := pod_json(testbed, namespace, "stranded"))["metadata"].get("deletionTimestamp") and p,
        timeout=30, what="the pod to be deleted",
    )
    procs.wait_for(lambda: not procs.pid_alive(pid), timeout=10, what="the process to die")
    conditions = {c["type"]: c for c in gone["status"]["conditions"]}
    assert conditions["DisruptionTarget"]["reason"] == "DeletionByTaintManager"
    assert "terminated" not in gone["status"]["containerStatuses"][0]["state"]
    assert gone["metadata"]["uid"] == pod["metadata"]["uid"]
    testbed.kubectl("patch", "pod", "stranded", "-n", namespace, "--type=json",
                    "-p", '[{"op": "remove", "path": "/metadata/finalizers"}]')


def test_deployment_pods_are_restarted(testbed: TestBed, namespace: str) -> None:
    deployment = {
        "apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": "web", "namespace": namespace},
        "spec": {"replicas": 1, "selector": {"matchLabels": {"app": "web"}},
                 "template": {"metadata": {"labels": {"app": "web"}},
                              "spec": {"containers": [{"name": "main", "image": "unused",
                                                       "command": ["sleep", "300"]}]}}},
    }
    testbed.kubectl("apply", "-f", "-", input=json.dumps(deployment))
    testbed.kubectl("rollout", "status", "deployment/web", "-n", namespace, "--timeout=60s", timeout=90)
    name = testbed.kubectl(
        "get", "pods", "-n", namespace, "-l", "app=web", "-o", "jsonpath={.items[0].metadata.name}"
    ).stdout
    assert testbed.node
    testbed.node.kill(namespace, name)
    restarted = procs.wait_for(
        lambda: (s := pod_json(testbed, namespace, name)["status"]["containerStatuses"][0])["restartCount"] == 1
        and "running" in s["state"] and s,
        timeout=30, what="the container to be restarted",
    )
    last = restarted["lastState"]["terminated"]
    assert last["exitCode"] == 128 + signal.SIGKILL
