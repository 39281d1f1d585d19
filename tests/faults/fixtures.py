"""The fault suite's fixtures: a tally of trials and failures, a pod recorder, a MinIO of the test's own,
a control plane of the test's own.

Shared by tests/faults, tests/badinput, tests/security and tests/realnode: their conftest.py imports them.
The tally is printed at the end of the session (``print_tally``, called by tests/conftest.py): every fault
kind of the session's tests, the real node's too, in one table.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from durablerun_testbed.s3 import S3Server
from durablerun_testbed.testbed import TestBed
from tests.faults.helpers import TALLY, PodRecorder, StartStore, Store, Tally
from tests.helpers import CRD_PATH, SESSION_ID
from tests.operator.helpers import RunEnv


@pytest.fixture
def tally() -> Tally:
    return TALLY


@contextmanager
def trials(tally: Tally, fault: str, count: int) -> Iterator[list[str]]:
    """Count ``count`` trials of ``fault``: the block appends one line per failed trial to the list it is
    given, and the test then fails listing them. A block that raises (a fault that could not be done or
    undone, a check no trial passed) has every trial counted as failed."""
    failed: list[str] = []
    try:
        yield failed
    except BaseException:
        tally.add(fault, count, count)
        raise
    tally.add(fault, count, len(failed))
    assert not failed, "\n".join(failed)


def print_tally(terminalreporter: pytest.TerminalReporter) -> None:
    """The session's "fault trials" table (on one pytest worker: the workers' tallies stay theirs)."""
    if not TALLY.rows:
        return
    terminalreporter.section("fault trials")
    for fault, (count, failures) in sorted(TALLY.rows.items()):
        terminalreporter.write_line(f"{fault:<64} trials {count:>5}   failures {failures:>3}")
    total = [sum(row[i] for row in TALLY.rows.values()) for i in (0, 1)]
    terminalreporter.write_line(f"{'in all':<64} trials {total[0]:>5}   failures {total[1]:>3}")


@pytest.fixture
def own_bed(request: pytest.FixtureRequest, testbed_root: Path, s3_server: S3Server) -> Iterator[TestBed]:
    """A test bed of the test's own, with the CRD (so restarting its API server disturbs no other test).

    It has the process node unless the test asks for none, with
    ``@pytest.mark.parametrize("own_bed", [{"node": False}], indirect=True, ids=["no-node"])``.
    """
    options = getattr(request, "param", {})
    bed = TestBed(testbed_root / f"k8s-{uuid.uuid4().hex[:6]}", id=SESSION_ID).start(
        s3=s3_server, node=options.get("node", True))
    try:
        bed.kubectl("apply", "--server-side", "-f", str(CRD_PATH))
        bed.wait_established(timeout=30)
        yield bed
    finally:
        bed.stop()


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
