"""The real node's variants of tests/testbed/test_interrupted_session.py (`make faults`: a real node's bed takes
too long to start for `make test`'s budget): a session holding a real node and a pod (its containerd, kubelet,
shims, the pod's containers in the bed's cgroups, mounts under its directory, its pod bridge) ended by SIGTERM
stops all of it itself; one ended by SIGKILL leaves it, and what the next session does first removes it.
"""

from __future__ import annotations

import signal

import pytest

from durablerun_testbed import procs, realnode, reaper
from tests.helpers import interrupted_sessions as sessions
from tests.helpers.interrupted_sessions import assert_nothing_left
from tests.helpers.session import skip_real_node_if_asked

pytestmark = [pytest.mark.testbed, pytest.mark.timeout(900)]

TEST = "tests/realnode/interruptible.py::test_hold_a_pod_on_the_real_node"


def held_a_real_node(held: sessions.Held) -> None:
    """What the session held is there: the node's processes, the pod's container in its cgroups, mounts."""
    left = reaper.remains(held.owner, held.root)
    assert procs.processes_with_marker(held.owner, id_prefix=True)
    assert set(held.containers) <= {pid for pid, _ in realnode.cgroup_processes(held.owner, id_prefix=True)}
    for kind in ("cgroup", "mount", "bridge"):
        assert [thing for thing in left if thing.startswith(kind)], f"no {kind} of the real node: {left}"


def test_sigterm_stops_a_real_node_and_its_pods() -> None:
    skip_real_node_if_asked()
    with sessions.started(TEST) as held:
        try:
            held_a_real_node(held)
        finally:
            code = held.signal(signal.SIGTERM)
        output = held.output()
        assert code == pytest.ExitCode.INTERRUPTED, output[-3000:]
        assert "left behind" not in output, "the leak check had to remove what the beds' own teardown left"
        assert_nothing_left(held)


def test_after_sigkill_the_next_session_removes_a_real_node() -> None:
    skip_real_node_if_asked()
    with sessions.started(TEST) as held:
        try:
            held_a_real_node(held)
        finally:
            held.signal(signal.SIGKILL)
        assert reaper.reap_orphans().get(held.owner), "the reaper did not take the killed session for gone"
        assert_nothing_left(held)
