"""A pytest session of its own, ended by a signal while one of its tests holds a bed and a pod.

The child session runs one test of an ``interruptible.py`` module (named on its command line: the suite never
collects it); that test starts its bed and a pod, reports where they are (:func:`hold`) and waits to be
interrupted. The parent signals it, then checks with the leak check's own functions (``reaper.remains``) that
nothing of its beds is left (:func:`assert_nothing_left`), or, after SIGKILL, that what is left is what the next
session removes. Used by tests/testbed (the process node) and tests/realnode (the real node).
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from durablerun_testbed import procs, reaper
from tests.helpers.session import REPO, SESSION_ID

#: Where the child's test writes its report (a JSON file).
REPORT_ENV = "HELD_SESSION_REPORT"


def hold(testbed_root: Path, container_pids: list[int]) -> None:
    """The child's side: say which session owns the beds, where they live and which pids are the pod's
    containers, then wait to be interrupted."""
    report = Path(os.environ[REPORT_ENV])
    partial = report.with_suffix(".partial")
    partial.write_text(json.dumps({"owner": SESSION_ID, "root": str(testbed_root), "pid": os.getpid(),
                                   "containers": container_pids}))
    partial.rename(report)
    threading.Event().wait(600)
    raise AssertionError("the session was not interrupted")


@dataclass
class Held:
    popen: subprocess.Popen[bytes]
    log: Path
    owner: str
    root: Path
    #: The pid of the process whose session owns the beds (the only one, or the xdist worker).
    pid: int
    containers: list[int]

    def output(self) -> str:
        return self.log.read_text(errors="replace")

    def signal(self, sig: signal.Signals) -> int:
        """Send ``sig`` to the session's main process (the xdist controller, if any) and wait for its end."""
        self.popen.send_signal(sig)
        try:
            return self.popen.wait(timeout=300)
        except subprocess.TimeoutExpired:
            self.popen.kill()
            self.popen.wait(timeout=60)
            tail = self.output()[-3000:]
            raise AssertionError(f"the session did not end within 300 s of {sig.name}:\n{tail}") from None


@contextmanager
def started(test: str, *pytest_args: str) -> Iterator[Held]:
    """Run ``test`` (a node id) in a pytest session of its own; yield once it holds its bed and pod. Its TMPDIR
    is a short directory of its own (containerd's sockets under a bed take no long path), removed afterwards."""
    workdir = Path(tempfile.mkdtemp(prefix="held-"))
    try:
        yield _start(test, workdir, *pytest_args)
    finally:
        shutil.rmtree(workdir, ignore_errors=True)


def _start(test: str, workdir: Path, *pytest_args: str) -> Held:
    report, log = workdir / "held.json", workdir / "session.log"
    env = {key: value for key, value in os.environ.items() if key != procs.MARKER_ENV}
    env.update({REPORT_ENV: str(report), "TMPDIR": str(workdir)})
    with log.open("wb") as out:
        # Not a new session: whatever signals the group this session is in reaches the child as well.
        popen = subprocess.Popen(
            [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-q", "--timeout=900", *pytest_args, test],
            cwd=REPO, env=env, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)

    try:
        # A real node's bed took longer than 300 s to come up at load 20 (session 12); the test allows 900.
        procs.wait_for(lambda: report.exists() or popen.poll() is not None, timeout=480, interval=0.2,
                       what=f"{test} to hold its bed and pod")
    except BaseException:
        popen.terminate()  # an orderly end, for what it may have started
        try:
            popen.wait(timeout=300)
        finally:
            popen.kill()
        raise
    if not report.exists():
        raise AssertionError(f"the session ended ({popen.returncode}) before it held its bed:\n"
                             f"{log.read_text(errors='replace')[-3000:]}")
    facts = json.loads(report.read_text())
    return Held(popen, log, facts["owner"], Path(facts["root"]), facts["pid"], facts["containers"])


def assert_nothing_left(held: Held) -> None:
    assert reaper.remains(held.owner, held.root) == []
    assert not [pid for pid in held.containers if procs.pid_alive(pid)], "the pod's process survived"
    assert held.owner not in [owner.id for owner in reaper.owners()], "the session's record is left"
    assert not held.root.exists(), "the session's directory is left"
