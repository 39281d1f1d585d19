"""Pods on the process node for its own tests: a shell script in a pod, its body, waiting for its phase."""

from __future__ import annotations

import json
from typing import Any

from durablerun_testbed import procs
from durablerun_testbed.testbed import TestBed


def run_pod(testbed: TestBed, namespace: str, name: str, script: str, **container: Any) -> None:
    pod = {
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name, "namespace": namespace, "labels": {"team": "agents"}},
        "spec": {
            "restartPolicy": "Never",
            "terminationGracePeriodSeconds": 5,
            "containers": [{"name": "main", "image": "unused", "command": ["sh", "-c", script], **container}],
        },
    }
    testbed.kubectl("apply", "-f", "-", input=json.dumps(pod))


def pod_json(testbed: TestBed, namespace: str, name: str) -> dict[str, Any]:
    return dict(json.loads(testbed.kubectl("get", "pod", name, "-n", namespace, "-o", "json").stdout))


def wait_phase(testbed: TestBed, namespace: str, name: str, phase: str) -> dict[str, Any]:
    return procs.wait_for(
        lambda: (p := pod_json(testbed, namespace, name))["status"].get("phase") == phase and p,
        timeout=30, what=f"pod {namespace}/{name} to be {phase}",
    )
