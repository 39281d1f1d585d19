"""The session's leak check sees a real node's container processes, which carry no marker, and stopping a
node ends them.

A container whose shim died with containerd lives on, orphaned, in its pod's cgroup under the bed's
``kubepods`` (issue 30: after `make sandbox-down` the operator pod's processes were still running). Here a
process stands in for such a container: put into a pod cgroup of a bed of this session, without the bed's
marker, it must be among what ``tests/conftest.py``'s leak check reads (``cgroup_processes`` of the
session's beds), and ``end_cgroups`` (what stopping a real node runs) must kill it and remove the cgroups.
"""

from __future__ import annotations

import subprocess
import uuid

import pytest

from durablerun_testbed import procs, realnode
from tests.helpers.session import SESSION_ID, skip_real_node_if_asked

pytestmark = pytest.mark.testbed


def test_a_process_left_in_a_beds_pod_cgroup_is_a_leak_and_stopping_the_node_ends_it() -> None:
    skip_real_node_if_asked()
    bed = f"{SESSION_ID}-leak{uuid.uuid4().hex[:6]}"  # a bed of this session: its id starts with the session's
    realnode.create_cgroups(bed)
    leaked = subprocess.Popen(["sleep", "600"])
    try:
        placed = []
        # The cpuset hierarchy needs CPUs set on every new level; the others take a task as they are.
        for top in realnode.cgroups(bed):
            pod = top / "kubepods" / "besteffort" / f"pod{uuid.uuid4()}"
            pod.mkdir(parents=True)
            try:
                (pod / "cgroup.procs").write_text(str(leaked.pid))
                placed.append(pod)
            except OSError:
                continue
        assert placed, "the process went into no cgroup of the bed"
        assert not procs.processes_with_marker(bed), "it carries no marker: only its cgroup shows it"
        # What the session's leak check reads.
        assert leaked.pid in [pid for pid, _ in realnode.cgroup_processes(SESSION_ID, id_prefix=True)]
        realnode.end_cgroups(bed)
        assert leaked.wait(timeout=30) == -9, "end_cgroups did not kill the process"
        assert realnode.cgroup_processes(bed) == []
        assert realnode.cgroups(bed) == [], "end_cgroups left cgroups"
    finally:
        leaked.kill()
        leaked.wait(timeout=30)
        realnode.end_cgroups(bed)
