"""The test a session of its own runs until a signal ends it (tests/testbed/test_interrupted_session.py); not
collected by the suite (its name is not ``test_*.py``)."""

from __future__ import annotations

from pathlib import Path

from durablerun_testbed import procs
from durablerun_testbed.testbed import TestBed
from tests.helpers.interrupted_sessions import hold
from tests.testbed.node_pods import run_pod, wait_phase


def test_hold_a_pod_on_the_process_node(testbed: TestBed, namespace: str, testbed_root: Path) -> None:
    run_pod(testbed, namespace, "held", "sleep 600")
    wait_phase(testbed, namespace, "held", "Running")
    assert testbed.node
    node = testbed.node
    pids = procs.wait_for(lambda: [p["pid"] for p in node.processes() if p["running"] and p["pod"].endswith("/held")],
                          timeout=30, what="the held pod's process")
    hold(testbed_root, pids)
