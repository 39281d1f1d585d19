"""A test session ended short stops its beds; one ended by SIGKILL leaves them to the next session (issue 30).

Each test runs a session of its own whose test holds a process-node bed and a pod (tests/testbed/interruptible.py),
then ends it mid-test:
- SIGTERM to the controller of an xdist session (what a CI cancel or a `timeout` wrapper sends; the controller
  interrupts its worker as xdist does): the session's own teardown stops everything, so its leak check finds
  nothing to remove;
- SIGKILL, which no process can answer: its beds are left running, and what the next session does first
  (``reaper.reap_orphans``) removes them, and nothing of a session still alive (this one).
The real node's variants are in tests/realnode/test_interrupted_session.py (`make faults`: its bed takes long).
"""

from __future__ import annotations

import signal

import pytest

from durablerun_testbed import procs, reaper
from durablerun_testbed.s3 import S3Server
from tests.helpers import interrupted_sessions as sessions
from tests.helpers.interrupted_sessions import assert_nothing_left
from tests.helpers.session import SESSION_ID

pytestmark = pytest.mark.testbed

TEST = "tests/testbed/interruptible.py::test_hold_a_pod_on_the_process_node"


def test_sigterm_to_an_xdist_session_stops_its_beds() -> None:
    with sessions.started(TEST, "-n", "1") as held:
        try:
            assert held.pid != held.popen.pid, "the bed's owner is the xdist worker"
            assert procs.processes_with_marker(held.owner, id_prefix=True), "the bed was not running"
            assert all(procs.pid_alive(pid) for pid in held.containers)
        finally:
            code = held.signal(signal.SIGTERM)
        output = held.output()
        assert code == pytest.ExitCode.INTERRUPTED, output[-3000:]
        assert "SIGTERM: stopping every test bed" in output
        assert "left behind" not in output, "the leak check had to remove what the beds' own teardown left"
        assert_nothing_left(held)


def test_after_sigkill_the_next_session_removes_what_is_left(s3_server: S3Server) -> None:
    assert s3_server.process
    ours = s3_server.process.pid  # a bed of this session, which the reaper must leave alone
    assert ours in [pid for pid, _ in procs.processes_with_marker(SESSION_ID)]
    with sessions.started(TEST) as held:
        try:
            assert held.pid == held.popen.pid
        finally:
            held.signal(signal.SIGKILL)
        left = reaper.remains(held.owner, held.root)
        assert [thing for thing in left if thing.startswith("process")], "SIGKILL left nothing running?"
        reaped = reaper.reap_orphans()
        assert reaped.get(held.owner), f"the reaper did not take the killed session for gone: {reaped}"
        assert_nothing_left(held)
        assert procs.pid_alive(ours), "the reaper ended a live session's MinIO"
        assert SESSION_ID in [owner.id for owner in reaper.owners()], "the reaper removed a live session's record"
