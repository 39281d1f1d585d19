"""Driving the operator and DurableRuns on the test bed: what the operator tests (and the fault, bad-input,
security, Kueue and browser tiers) share. Their fixtures are in ``tests.helpers.bed``; the workflows every run
can name are in workflows/ here."""

from __future__ import annotations

import json
import uuid
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from durablerun import api
from durablerun._private.records import layout
from durablerun_testbed import procs
from durablerun_testbed.testbed import TestBed

WORKFLOWS = Path(__file__).resolve().parent / "workflows"


def create_namespaces(testbed: TestBed, count: int) -> list[str]:
    """``count`` fresh namespaces, each with its default ServiceAccount in place."""
    names = ["t-" + uuid.uuid4().hex[:10] for _ in range(count)]
    for name in names:
        testbed.kubectl("create", "namespace", name)
    for name in names:
        _wait_for_service_account(testbed, name)
    return names


def _wait_for_service_account(testbed: TestBed, namespace: str) -> None:
    procs.wait_for(
        lambda: testbed.kubectl("get", "serviceaccount", "default", "-n", namespace, check=False).returncode == 0,
        timeout=30, what=f"the default ServiceAccount in {namespace}",
    )


@dataclass
class Operator:
    process: procs.ManagedProcess
    metrics_port: int
    health_port: int

    def stop(self) -> None:
        self.process.stop()


#: The ``start_operator`` fixture: ``start(name="operator", **env)``.
StartOperator = Callable[..., Operator]


def healthy(operator: Operator) -> bool:
    import urllib.request

    operator.process.check_alive()
    with urllib.request.urlopen(f"http://127.0.0.1:{operator.health_port}/healthz", timeout=2) as reply:
        return bool(reply.status == 200)


@dataclass
class RunEnv:
    """A namespace ready for DurableRuns: a bucket, its credentials Secret, a ledger directory."""

    testbed: TestBed
    namespace: str
    bucket: str
    ledger_dir: Path
    #: The API client of the reads below, which waits poll every 50 ms: a `kubectl get` took 89 ms of CPU, this
    #: 4.4 ms (measured here; four operator test files fell from 297 to 245 CPU-seconds, 180 to 168 s). What
    #: users type (apply, patch) stays kubectl.
    _client: Any = field(default=None, init=False, repr=False, compare=False)

    def _api(self) -> Any:
        if self._client is None:
            self._client = self.testbed.api_client()
        return self._client

    def manifest(self, name: str, workflow: str, input: dict[str, Any] | None = None,
                 policy: dict[str, Any] | None = None, **spec: Any) -> dict[str, Any]:
        return {
            "apiVersion": api.API_VERSION, "kind": "DurableRun",
            "metadata": {"name": name, "namespace": self.namespace},
            "spec": {
                "workflow": workflow,
                "input": input or {},
                "checkpoint": {"uri": f"s3://{self.bucket}/runs", "endpoint": self.testbed.s3.endpoint_url
                               if self.testbed.s3 else None, "credentialsSecret": "s3-credentials",
                               "region": "us-east-1"},
                "policy": {"leaseDuration": "6s", "backoff": {"initial": "1s", "max": "2s"}, **(policy or {})},
                "template": {"spec": {"containers": [{
                    "name": "runner",
                    "env": [{"name": "PYTHONPATH", "value": str(WORKFLOWS)}],
                    "volumeMounts": [{"name": "ledger", "mountPath": "/tmp/ledger"}],
                }], "volumes": [{"name": "ledger", "hostPath": {"path": str(self.ledger_dir)}}],
                    "terminationGracePeriodSeconds": 10}},
                **spec,
            },
        }

    def apply(self, manifest: dict[str, Any]) -> None:
        self.testbed.kubectl("apply", "-f", "-", input=json.dumps(manifest))

    def get(self, name: str) -> dict[str, Any]:
        """The DurableRun as JSON (raises ApiException if it is absent, as kubectl would fail)."""
        from kubernetes import client

        return dict(client.CustomObjectsApi(self._api()).get_namespaced_custom_object(
            api.GROUP, api.VERSION, self.namespace, api.PLURAL, name))

    def patch_status(self, name: str, status: dict[str, Any], check: bool = True) -> Any:
        """A merge patch of the run's status subresource, as a runner or another operator would write it."""
        return self.testbed.kubectl("patch", "dr", name, "-n", self.namespace, "--subresource=status",
                                    "--type=merge", "-p", json.dumps({"status": status}), check=check)

    def wait_phase(self, name: str, *phases: str, timeout: float = 60) -> dict[str, Any]:
        return procs.wait_for(
            lambda: (run := self.get(name)).get("status", {}).get("phase") in phases and run,
            timeout=timeout, what=f"DurableRun {self.namespace}/{name} to reach {'/'.join(phases)}",
            interval=0.2,  # a GET each: the API server is the suite's busiest part, and phases take seconds
        )

    def ledger(self) -> list[str]:
        path = self.ledger_dir / "ledger.txt"
        return path.read_text().splitlines() if path.exists() else []

    def executions(self, step: str) -> int:
        return self.ledger().count(f"start {step}")

    def runner_log(self, pod: str) -> str:
        """The runner's own log in ``pod``, as its node keeps it ("" until there is one)."""
        logs = (self.testbed.root / "node").rglob(f"{self.namespace}_{pod}_*/runner.log")
        return "".join(log.read_text(errors="replace") for log in logs)

    def wait_stop_requested(self, pod: str, timeout: float = 60) -> str:
        """Waits until the runner in ``pod`` logs that it took its SIGTERM (a pod deletion's, sent by the node some
        time after the deletion itself), and returns its log."""
        def told() -> str | None:
            text = self.runner_log(pod)
            return text if "stop requested" in text else None
        return procs.wait_for(told, timeout=timeout, what=f"the runner in {pod} to log the stop request", interval=0.2)

    def store_objects(self) -> dict[str, str]:
        """Every object in the run's bucket, key -> ETag."""
        assert self.testbed.s3
        s3 = self.testbed.s3.client()
        pages = s3.get_paginator("list_objects_v2").paginate(Bucket=self.bucket)
        return {o["Key"]: o["ETag"] for page in pages for o in page.get("Contents", [])}

    def pods(self, name: str) -> list[dict[str, Any]]:
        """The run's pods as kubectl's JSON shows them (not the client's models)."""
        from kubernetes import client

        return list(json.loads(client.CoreV1Api(self._api()).list_namespaced_pod(
            self.namespace, label_selector=f"{api.LABEL_RUN}={name}", _preload_content=False).data)["items"])

    def events(self, name: str) -> list[dict[str, Any]]:
        from kubernetes import client

        return list(json.loads(client.CoreV1Api(self._api()).list_namespaced_event(
            self.namespace, field_selector=f"involvedObject.name={name}", _preload_content=False).data)["items"])


def without_logs(objects: dict[str, str]) -> dict[str, str]:
    """Store objects (RunEnv.store_objects) but the attempts' logs: a fenced attempt writes nothing else, but
    still its own logs (a folder no other attempt writes, layout.py)."""
    return {k: v for k, v in objects.items() if f"/{layout.LOGS_DIR}" not in k}


def events(runs: RunEnv, name: str) -> Counter[str]:
    return Counter(e["reason"] for e in runs.events(name))


def send_event(runs: RunEnv, name: str, event: str, payload: Any) -> None:
    runs.testbed.kubectl("patch", "dr", name, "-n", runs.namespace, "--type=merge",
                         "-p", json.dumps({"spec": {"events": {event: payload}}}))
