"""The operator tests' fixtures: an operator per test, a namespace with a bucket, a Secret and a ledger.

Shared by tests/operator, tests/faults, tests/badinput and tests/security: their conftest.py imports them.
"""

from __future__ import annotations

import sys
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from durablerun import api
from durablerun_testbed import procs
from durablerun_testbed.testbed import TestBed
from tests.helpers import SESSION_ID
from tests.operator.helpers import Operator, RunEnv, StartOperator, healthy


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
        procs.wait_for(lambda: healthy(operator), timeout=30, what="the operator's /healthz")
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
