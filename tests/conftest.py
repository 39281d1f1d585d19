"""Fixtures for the real test bed: MinIO, kube-apiserver + etcd + controller-manager, process node.

Session-scoped parts start once and only when a test asks for them; each test
gets its own namespace or bucket. Every process the test bed starts carries one
session marker; when the session ends, nothing its beds started may be left.

However the session ends, short of SIGKILL, it stops its beds: SIGTERM and
SIGINT end it as Ctrl-C does (every finalizer runs, then the leak check removes
what is left). A session ended by SIGKILL leaves its beds to the next session,
which begins by removing what every dead session left (durablerun_testbed.reaper).
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import sys
import tempfile
import threading
import uuid
from collections.abc import Iterator
from pathlib import Path
from types import FrameType
from typing import Any

import pytest

from durablerun_testbed import reaper
from durablerun_testbed.jaeger import Jaeger
from durablerun_testbed.prometheus import Prometheus
from durablerun_testbed.s3 import S3Server
from durablerun_testbed.testbed import TestBed
from tests.helpers.runs import create_namespaces
from tests.helpers.session import SESSION_ID, StartPrometheus

# The fixtures more than one folder uses (an operator per test, a namespace ready for DurableRuns, a pod
# recorder, a MinIO of the test's own, the fault tally): defined in tests/helpers/bed.py, provided to every folder.
pytest_plugins = ["tests.helpers.bed"]

_REAPED = pytest.StashKey[dict[str, list[str]]]()


def pytest_configure(config: pytest.Config) -> None:
    # Every session process (the xdist controller and each worker) ends by an orderly teardown when signalled.
    if threading.current_thread() is threading.main_thread():
        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, _interrupted)
    if hasattr(config, "workerinput"):
        return
    # Once per run (not in every xdist worker): what sessions killed by SIGKILL left.
    config.stash[_REAPED] = reaper.reap_orphans()
    with contextlib.suppress(ImportError):
        from xdist.workermanage import NodeManager  # type: ignore[import-untyped]

        # An interrupted controller gives its workers EXIT_TIMEOUT seconds (10) to end, then kills them: too
        # short for a real node's teardown (draining its pods alone may take a minute).
        NodeManager.EXIT_TIMEOUT = 180


# The tests that share the real node (tests/realnode/conftest.py's session fixtures): under xdist they are one
# work unit, run first on one worker, so that only one worker starts a real node, builds the workflow image and
# installs the chart (about 100 s each), and the longest unit does not start last.
REAL_NODE_TESTS = "tests/realnode/"
#: Then the longest of the other files (CI's durations: 80-250 s each), so that the session does not end with one
#: worker on a long file while the other has nothing left. The rest keep their collection order.
LONG_FILES = ("tests/testbed/test_sandbox.py", "tests/operator/test_schedules.py",
              "tests/testbed/test_interrupted_session.py")


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    def unit_order(item: pytest.Item) -> int:
        if item.nodeid.startswith(REAL_NODE_TESTS):
            return 0
        path = item.nodeid.split("::")[0]
        return 1 + LONG_FILES.index(path) if path in LONG_FILES else 1 + len(LONG_FILES)

    items.sort(key=unit_order)  # stable: within a rank, the collection order


def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> Any:
    """``--dist loadfile``, but the real node's files are one unit, and the units go out in collection order."""
    if config.getoption("dist") != "loadfile":
        return None
    from xdist.scheduler import LoadFileScheduling  # type: ignore[import-untyped]

    class RealNodeTogether(LoadFileScheduling):  # type: ignore[misc]
        def _split_scope(self, nodeid: str) -> str:
            return REAL_NODE_TESTS if nodeid.startswith(REAL_NODE_TESTS) else str(super()._split_scope(nodeid))

    config.option.loadscopereorder = False  # xdist's default orders the files by their number of tests
    return RealNodeTogether(config, log)


def _interrupted(signum: int, frame: FrameType | None) -> None:
    """The first SIGTERM or SIGINT ends the session as Ctrl-C does: pytest runs every finalizer (each bed
    stops what it started) and the leak check removes what is left. Later ones are ignored, so that they do
    not cut the teardown short (SIGKILL still does; the next session then removes what is left). Ignored by a
    Python handler, not SIG_IGN, which the processes the teardown starts would inherit."""
    name = signal.Signals(signum).name
    sys.stderr.write(f"\n{name}: stopping every test bed of this session (pid {os.getpid()})\n")
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, _already_stopping)
    raise KeyboardInterrupt(name)


def _already_stopping(signum: int, frame: FrameType | None) -> None:
    sys.stderr.write(f"\n{signal.Signals(signum).name} ignored: the test beds are being stopped\n")


def pytest_report_header(config: pytest.Config) -> list[str]:
    lines = []
    for owner, found in config.stash.get(_REAPED, {}).items():
        left = "; ".join(found[:5]) + (f" and {len(found) - 5} more" if len(found) > 5 else "")
        lines.append(f"test session {owner} was killed before it stopped its beds; they left: {left or 'nothing'}")
    return lines


@pytest.fixture(scope="session")
def testbed_root() -> Iterator[Path]:
    """One directory for the session's servers, logs and state; kept when KEEP_TESTBED=1. The session is
    recorded as its beds' owner while it lasts, so that a later session can tell whether it is gone."""
    root = Path(tempfile.mkdtemp(prefix="durablerun-testbed-"))
    keep = bool(os.environ.get("KEEP_TESTBED"))
    reaper.register(SESSION_ID, root, keep=keep)
    yield root
    if not keep:
        shutil.rmtree(root, ignore_errors=True)
    reaper.unregister(SESSION_ID)


@pytest.fixture(scope="session", autouse=True)
def nothing_outlives_the_session(testbed_root: Path) -> Iterator[None]:
    """Fails the session if anything its beds started outlives them, and removes it: their processes (they
    carry the session's marker), a real node's containers (in its cgroups; they carry none), the cgroups,
    mounts under the session's directory, pod bridges (``reaper.remains``)."""
    yield
    leftovers = reaper.sweep(SESSION_ID, testbed_root)
    assert not leftovers, f"the session's test beds left behind: {leftovers}"


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
        bed.install_crds()
        yield bed
    finally:
        bed.stop()


@pytest.fixture
def namespace(testbed: TestBed) -> Iterator[str]:
    """A fresh namespace with its default ServiceAccount in place; deleted after the test."""
    (name,) = create_namespaces(testbed, 1)
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
    from tests.helpers.tally import print_tally

    print_tally(terminalreporter)
