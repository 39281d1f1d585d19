"""The operator running against the test bed, and helpers to drive DurableRuns with kubectl."""

from __future__ import annotations

import json
import sys
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from durablerun import api
from durablerun_testbed import procs
from durablerun_testbed.testbed import TestBed
from tests.conftest import SESSION_ID

WORKFLOWS = Path(__file__).resolve().parent / "workflows"


@dataclass
class Operator:
    process: procs.ManagedProcess
    metrics_port: int
    health_port: int

    def stop(self) -> None:
        self.process.stop()


StartOperator = Callable[..., Operator]


@pytest.fixture
def start_operator(testbed: TestBed, testbed_root: Path, namespace: str) -> Iterator[StartOperator]:
    """``start_operator()`` runs `python -m durablerun_operator --namespace <the test's>` on the test bed.

    Each test gets operators of its own, watching only its namespace, so a test
    may kill, restart or double them without touching any other test.
    """
    started: list[Operator] = []

    def start(name: str = "operator", **env: str) -> Operator:
        metrics_port, health_port = procs.free_port(), procs.free_port()
        process = procs.ManagedProcess(
            name, [sys.executable, "-m", "durablerun_operator", "--namespace", namespace],
            log_path=testbed_root / "logs" / f"{name}-{uuid.uuid4().hex[:6]}.log",
            env={**testbed.env(), api.OperatorEnv.RESYNC_SECONDS: "0.5",
                 api.OperatorEnv.METRICS_PORT: str(metrics_port), api.OperatorEnv.HEALTH_PORT: str(health_port),
                 api.OperatorEnv.STUCK_TERMINATING_SECONDS: "10", **env},
            testbed_id=SESSION_ID,
        )
        operator = Operator(process, metrics_port, health_port)
        started.append(operator)
        procs.wait_for(lambda: _healthy(operator), timeout=30, what="the operator's /healthz")
        return operator

    yield start
    for operator in started:
        operator.stop()


def _healthy(operator: Operator) -> bool:
    import urllib.request

    operator.process.check_alive()
    with urllib.request.urlopen(f"http://127.0.0.1:{operator.health_port}/healthz", timeout=2) as reply:
        return bool(reply.status == 200)


@pytest.fixture
def operator(start_operator: StartOperator) -> Operator:
    """The test's operator, for tests that do not restart it."""
    return start_operator()


@dataclass
class RunEnv:
    """A namespace ready for DurableRuns: a bucket, its credentials Secret, a ledger directory."""

    testbed: TestBed
    namespace: str
    bucket: str
    ledger_dir: Path

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
        return dict(json.loads(self.testbed.kubectl("get", "dr", name, "-n", self.namespace, "-o", "json").stdout))

    def wait_phase(self, name: str, *phases: str, timeout: float = 60) -> dict[str, Any]:
        return procs.wait_for(
            lambda: (run := self.get(name)).get("status", {}).get("phase") in phases and run,
            timeout=timeout, what=f"DurableRun {self.namespace}/{name} to reach {'/'.join(phases)}",
        )

    def ledger(self) -> list[str]:
        path = self.ledger_dir / "ledger.txt"
        return path.read_text().splitlines() if path.exists() else []

    def executions(self, step: str) -> int:
        return self.ledger().count(f"start {step}")

    def store_objects(self) -> dict[str, str]:
        """Every object in the run's bucket, key -> ETag."""
        assert self.testbed.s3
        s3 = self.testbed.s3.client()
        pages = s3.get_paginator("list_objects_v2").paginate(Bucket=self.bucket)
        return {o["Key"]: o["ETag"] for page in pages for o in page.get("Contents", [])}

    def pods(self, name: str) -> list[dict[str, Any]]:
        out = self.testbed.kubectl("get", "pods", "-n", self.namespace, "-l", f"{api.LABEL_RUN}={name}",
                                   "-o", "json").stdout
        return list(json.loads(out)["items"])

    def events(self, name: str) -> list[dict[str, Any]]:
        out = self.testbed.kubectl("get", "events", "-n", self.namespace,
                                   "--field-selector", f"involvedObject.name={name}", "-o", "json").stdout
        return list(json.loads(out)["items"])


@pytest.fixture
def runs(testbed: TestBed, namespace: str, s3_bucket: str, tmp_path: Path) -> RunEnv:
    assert testbed.s3
    ledger = tmp_path / "ledger"
    ledger.mkdir()
    ledger.chmod(0o777)
    testbed.kubectl("create", "secret", "generic", "s3-credentials", "-n", namespace,
                    f"--from-literal=AWS_ACCESS_KEY_ID={testbed.s3.access_key}",
                    f"--from-literal=AWS_SECRET_ACCESS_KEY={testbed.s3.secret_key}")
    return RunEnv(testbed, namespace, s3_bucket, ledger)
