"""Fixtures for the real test bed: MinIO, kube-apiserver + etcd + controller-manager, process node.

Session-scoped parts start once and only when a test asks for them; each test
gets its own namespace or bucket. Every process the test bed starts carries one
session marker; when the session ends, no process with it may be left.
"""

from __future__ import annotations

import contextlib
import os
import tempfile
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from durablerun_testbed import procs
from durablerun_testbed.jaeger import Jaeger
from durablerun_testbed.prometheus import Prometheus
from durablerun_testbed.realnode import cgroup_processes
from durablerun_testbed.s3 import S3Server
from durablerun_testbed.testbed import TestBed
from tests.helpers import CRD_PATH, SESSION_ID, StartPrometheus


@pytest.fixture(scope="session")
def testbed_root() -> Iterator[Path]:
    """One directory for the session's servers, logs and state; kept when KEEP_TESTBED=1."""
    root = Path(tempfile.mkdtemp(prefix="durablerun-testbed-"))
    yield root
    if not os.environ.get("KEEP_TESTBED"):
        import shutil

        shutil.rmtree(root, ignore_errors=True)


@pytest.fixture(scope="session", autouse=True)
def no_stray_processes() -> Iterator[None]:
    """Fails the session if any process the test bed started outlives it: its own (they carry the session's
    marker) and the containers of a real node's pods (in the cgroups of the session's beds; they carry none)."""
    yield
    leftovers = procs.processes_with_marker(SESSION_ID) + cgroup_processes(SESSION_ID, id_prefix=True)
    for pid, _ in leftovers:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, 9)
    assert not leftovers, f"test bed processes survived the session: {leftovers}"


@pytest.fixture(scope="session")
def s3_server(testbed_root: Path) -> Iterator[S3Server]:
    """A real MinIO on loopback for the whole session."""
    server = S3Server(testbed_root / "s3", SESSION_ID).start()
    yield server
    server.stop()


@pytest.fixture(scope="session")
def jaeger(testbed_root: Path) -> Iterator[Jaeger]:
    """A real Jaeger (OTLP collector and query API) on loopback for the whole session."""
    server = Jaeger(testbed_root / "jaeger", SESSION_ID).start()
    yield server
    server.stop()


@pytest.fixture
def s3_bucket(s3_server: S3Server) -> str:
    """A fresh, empty bucket on the session's MinIO."""
    return s3_server.create_bucket("t-" + uuid.uuid4().hex[:16])


@pytest.fixture(scope="session")
def testbed(testbed_root: Path, s3_server: S3Server) -> Iterator[TestBed]:
    """Control plane and process node (sharing the session's MinIO), with the CRD installed."""
    bed = TestBed(testbed_root / "k8s", id=SESSION_ID).start(s3=s3_server)
    try:
        bed.kubectl("apply", "--server-side", "-f", str(CRD_PATH))
        bed.wait_established()
        yield bed
    finally:
        bed.stop()


@pytest.fixture
def namespace(testbed: TestBed) -> Iterator[str]:
    """A fresh namespace with its default ServiceAccount in place; deleted after the test."""
    name = "t-" + uuid.uuid4().hex[:10]
    testbed.kubectl("create", "namespace", name)
    procs.wait_for(
        lambda: testbed.kubectl("get", "serviceaccount", "default", "-n", name, check=False).returncode == 0,
        timeout=30, what=f"the default ServiceAccount in {name}",
    )
    yield name
    testbed.kubectl("delete", "namespace", name, "--wait=false", check=False)


@pytest.fixture
def start_prometheus(testbed_root: Path) -> Iterator[StartPrometheus]:
    """``start_prometheus(["127.0.0.1:port"], rule_files=[...])``: a real Prometheus, stopped after the test."""
    started: list[Prometheus] = []

    def start(targets: list[str], **options: object) -> Prometheus:
        server = Prometheus(testbed_root / f"prometheus-{uuid.uuid4().hex[:6]}", SESSION_ID)
        started.append(server)
        return server.start(targets, **options)  # type: ignore[arg-type]

    yield start
    for server in started:
        server.stop()


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    """The "fault trials" table of the session's fault tests (tests/faults, tests/realnode/test_faults.py)."""
    from tests.faults.fixtures import print_tally

    print_tally(terminalreporter)
