"""The test bed's shared fixtures, provided to every folder by tests/conftest.py: an operator per test, a
namespace ready for DurableRuns (a bucket, its credentials Secret, a ledger directory), a recorder of its pods,
a MinIO of the test's own, and the session's tally of fault trials."""

from __future__ import annotations

import sys
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from durablerun import api
from durablerun_testbed import procs
from durablerun_testbed.s3 import S3Server
from durablerun_testbed.testbed import TestBed
from tests.helpers.pods import PodRecorder
from tests.helpers.runs import Operator, RunEnv, StartOperator, healthy
from tests.helpers.session import SESSION_ID
from tests.helpers.tally import TALLY, Tally


@dataclass
class Store:
    """A MinIO of a test's own, a bucket on it and the Secret holding its credentials."""

    server: S3Server
    bucket: str
    secret: str

    def use(self, body: dict[str, Any]) -> dict[str, Any]:
        """Point a DurableRun manifest at this store."""
        body["spec"]["checkpoint"].update(uri=f"s3://{self.bucket}/runs", endpoint=self.server.endpoint_url,
                                          credentialsSecret=self.secret)
        return body


#: The ``dedicated_store`` fixture: ``start(**minio_env)``.
StartStore = Callable[..., Store]


def launch_operator(testbed: TestBed, testbed_root: Path, namespaces: list[str], name: str = "operator",
                    **env: str) -> Operator:
    """`python -m durablerun_operator --namespace <each of namespaces>` on the test bed, once its /healthz
    answers; the test's settings (a resync every half second, stuck Terminating after 10 s) unless ``env``
    says otherwise."""
    metrics_port, health_port = procs.free_port(), procs.free_port()
    process = procs.ManagedProcess(
        name, [sys.executable, "-m", "durablerun_operator", *(arg for ns in namespaces for arg in ("--namespace", ns))],
        log_path=testbed_root / "logs" / f"{name}-{uuid.uuid4().hex[:6]}.log",
        env={**testbed.env(), api.OperatorEnv.RESYNC_SECONDS: "0.5",
             api.OperatorEnv.METRICS_PORT: str(metrics_port), api.OperatorEnv.HEALTH_PORT: str(health_port),
             api.OperatorEnv.STUCK_TERMINATING_SECONDS: "10", **env},
        testbed_id=SESSION_ID,
    )
    operator = Operator(process, metrics_port, health_port)
    try:
        procs.wait_for(lambda: healthy(operator), timeout=30, what="the operator's /healthz")
    except BaseException:
        operator.stop()
        raise
    return operator


@pytest.fixture
def start_operator(testbed: TestBed, testbed_root: Path, namespace: str) -> Iterator[StartOperator]:
    """``start_operator()`` runs `python -m durablerun_operator --namespace <the test's>` on the test bed.

    Each test gets operators of its own, watching only its namespace, so a test
    may kill, restart or double them without touching any other test.
    """
    started: list[Operator] = []

    def start(name: str = "operator", **env: str) -> Operator:
        operator = launch_operator(testbed, testbed_root, [namespace], name, **env)
        started.append(operator)
        return operator

    yield start
    for operator in started:
        operator.stop()


@pytest.fixture
def operator(start_operator: StartOperator) -> Operator:
    """The test's operator, for tests that do not restart it."""
    return start_operator()


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


@pytest.fixture
def tally() -> Tally:
    return TALLY


@pytest.fixture
def pods(runs: RunEnv) -> Iterator[PodRecorder]:
    recorder = PodRecorder(runs.testbed, runs.namespace)
    yield recorder
    recorder.stop()


@pytest.fixture
def dedicated_store(runs: RunEnv, testbed_root: Path) -> Iterator[StartStore]:
    """``dedicated_store(**minio_env)``: a MinIO of the test's own (so stopping it disturbs no other test),
    with a bucket and a credentials Secret in the test's namespace."""
    servers: list[S3Server] = []

    def start(**extra_env: str) -> Store:
        server = S3Server(testbed_root / f"s3-{uuid.uuid4().hex[:8]}", SESSION_ID, extra_env=extra_env).start()
        servers.append(server)
        secret = f"s3-{server.port}"
        runs.testbed.kubectl("create", "secret", "generic", secret, "-n", runs.namespace,
                             f"--from-literal=AWS_ACCESS_KEY_ID={server.access_key}",
                             f"--from-literal=AWS_SECRET_ACCESS_KEY={server.secret_key}")
        return Store(server, server.create_bucket("runs-" + uuid.uuid4().hex[:8]), secret)

    yield start
    for server in servers:
        server.stop()
