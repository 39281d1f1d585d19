"""The fault suite: the operator tests' fixtures, a pod recorder, and a tally of trials and failures.

``FAULT_TRIALS`` scales the suite (CI runs the default, ``make faults`` the long
version); ``FAULT_SEED`` replays a run of random timings.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from durablerun_testbed.s3 import S3Server
from tests.conftest import SESSION_ID
from tests.faults.helpers import PodRecorder, Store
from tests.operator import conftest as operator_fixtures
from tests.operator.conftest import RunEnv

# The operator tests' fixtures, shared: an operator per test, a namespace with a bucket, a Secret, a ledger.
start_operator = operator_fixtures.start_operator
operator = operator_fixtures.operator
runs = operator_fixtures.runs


@dataclass
class Tally:
    """Trials and failures per fault, printed at the end of the session."""

    rows: dict[str, list[int]] = field(default_factory=dict)

    def add(self, fault: str, trials: int, failures: int) -> None:
        row = self.rows.setdefault(fault, [0, 0])
        row[0] += trials
        row[1] += failures


TALLY = Tally()


@pytest.fixture
def tally() -> Tally:
    return TALLY


@pytest.fixture
def pods(runs: RunEnv) -> Iterator[PodRecorder]:
    recorder = PodRecorder(runs.testbed, runs.namespace)
    yield recorder
    recorder.stop()


StartStore = Callable[..., Store]


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


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    if not TALLY.rows:
        return
    terminalreporter.section("fault trials")
    for fault, (trials, failures) in sorted(TALLY.rows.items()):
        terminalreporter.write_line(f"{fault:<48} trials {trials:>5}   failures {failures:>3}")
