"""Deleting a DurableRun stops its pod and applies the retention policy; finished runs expire after their TTL."""

from __future__ import annotations

import pytest

from durablerun_testbed import procs
from tests.helpers.runs import Operator, RunEnv

pytestmark = pytest.mark.testbed
OPERATOR_PER_MODULE = True  # the tests asking for `operator` share one, each in its own namespace (conftest.py)


def journal_keys(runs: RunEnv, name: str) -> list[str]:
    return [k for k in runs.store_objects() if f"/{runs.namespace}/{name}/" in k]


def gone(runs: RunEnv, name: str) -> bool:
    result = runs.testbed.kubectl("get", "dr", name, "-n", runs.namespace, check=False)
    return result.returncode != 0 and "NotFound" in result.stderr


@pytest.mark.parametrize("retention", ["Retain", "Delete"])
def test_deleting_a_running_run(operator: Operator, runs: RunEnv, retention: str) -> None:
    manifest = runs.manifest("doomed", "optest_flows:steps", {"steps": 50, "sleep": 0.3})
    manifest["spec"]["checkpoint"]["retention"] = retention
    runs.apply(manifest)
    procs.wait_for(lambda: "done s1" in runs.ledger(), timeout=60, what="step s1")
    assert journal_keys(runs, "doomed")
    runs.testbed.kubectl("delete", "dr", "doomed", "-n", runs.namespace, "--wait=true", "--timeout=90s", timeout=120)
    # Its pods go with it (the purge pod, if any, by garbage collection of what the run owned).
    procs.wait_for(lambda: not runs.pods("doomed"), timeout=60, what="every pod of the run to be gone")
    if retention == "Retain":
        assert journal_keys(runs, "doomed"), "retention Retain lost the journal"
    else:
        assert journal_keys(runs, "doomed") == []
        # The operator posts a transition's Events after it: wait for this one.
        procs.wait_for(lambda: "JournalDeleted" in [e["reason"] for e in runs.events("doomed")], timeout=30,
                       what="the JournalDeleted Event")


def test_finished_run_is_deleted_after_its_ttl(operator: Operator, runs: RunEnv) -> None:
    runs.apply(runs.manifest("brief", "optest_flows:steps", {"steps": 1, "sleep": 0.05},
                             ttlSecondsAfterFinished=2))
    runs.wait_phase("brief", "Succeeded", timeout=60)
    procs.wait_for(lambda: gone(runs, "brief"), timeout=30, what="the run to be deleted after its TTL")
    assert journal_keys(runs, "brief"), "the default retention (Retain) keeps the journal"
