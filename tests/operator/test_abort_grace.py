"""An abort from outside (here the user's annotation) on the test bed: the running attempt gets
policy.abortGracePeriod to end Aborted by itself, so a Saga undoes the bookings before the run ends; an
attempt that does not end in time is fenced and its pod deleted."""

from __future__ import annotations

from typing import Any

import pytest

from durablerun import api
from durablerun_testbed import procs
from tests.helpers.runs import Operator, RunEnv

pytestmark = pytest.mark.testbed
OPERATOR_PER_MODULE = True  # the tests asking for `operator` share one, each in its own namespace (conftest.py)


def abort(runs: RunEnv, name: str, reason: str) -> None:
    runs.testbed.kubectl("annotate", "dr", name, "-n", runs.namespace, f"{api.ANNOTATION_ABORT}={reason}")


def aborting(runs: RunEnv, name: str) -> dict[str, Any]:
    return procs.wait_for(lambda: (run := runs.get(name))["status"].get("aborting") and run, timeout=30,
                          what=f"the operator to ask {name}'s runner to abort")


def runner_has_read(runs: RunEnv, name: str, written: dict[str, Any]) -> None:
    """Wait until the runner has acted on the run as ``written``: a renewal after it carried it back to the
    runner, and the runner renews again only after it has acted on that reply."""
    renewals = {written["status"]["lease"]["renewTime"]}
    procs.wait_for(lambda: renewals.add(runs.get(name)["status"]["lease"]["renewTime"]) or len(renewals) >= 3,
                   timeout=30, what=f"{name}'s runner to renew its lease twice")


def test_an_abort_lets_the_runner_undo_its_work_and_fences_one_that_does_not_end(
        operator: Operator, runs: RunEnv) -> None:
    runs.apply(runs.manifest("trip", "optest_flows:booking", {"tag": "t"}))
    runs.apply(runs.manifest("stuck", "optest_flows:booking", {"tag": "s"}, policy={"abortGracePeriod": "3s"}))
    procs.wait_for(lambda: {"start t-pay", "start s-pay"} <= set(runs.ledger()), timeout=90,
                   what="both runs to be paying")
    abort(runs, "trip", "customer cancelled")
    abort(runs, "stuck", "customer cancelled")

    # The payment in flight goes on: the run stays Running while its runner is asked to abort.
    asked = aborting(runs, "trip")
    assert asked["status"]["phase"] == "Running"
    assert asked["status"]["aborting"]["reason"] == "UserRequested"
    assert "policy.abortGracePeriod" in asked["status"]["message"]
    procs.wait_for(lambda: "Aborting" in [e["reason"] for e in runs.events("trip")], timeout=30,
                   what="the Aborting Event")
    runner_has_read(runs, "trip", asked)
    (runs.ledger_dir / "release-t-pay").write_text("go\n")

    done = runs.wait_phase("trip", "Aborted", timeout=60)["status"]
    assert done["abortReason"] == "UserRequested", done
    assert done["outcome"] == "Aborted", done  # the runner ended it, not the fence
    assert "customer cancelled" in done["message"]
    assert "aborting" not in done
    ledger = [line for line in runs.ledger() if " t-" in line]
    # The payment finished and was journaled; the confirmation never started; the bookings were undone,
    # last first, each once.
    assert ledger == ["start t-book-flight", "done t-book-flight", "start t-book-hotel", "done t-book-hotel",
                      "start t-pay", "done t-pay", "start t-cancel-hotel", "done t-cancel-hotel",
                      "start t-cancel-flight", "done t-cancel-flight"], ledger

    # The other runner stays in its payment past the grace: fenced, its pod deleted, nothing undone.
    stuck = runs.wait_phase("stuck", "Aborted", timeout=60)["status"]
    assert stuck["abortReason"] == "UserRequested"
    assert "did not end within policy.abortGracePeriod=3s, so it was stopped" in stuck["message"], stuck
    assert stuck.get("outcome") != "Aborted"
    procs.wait_for(lambda: not [p for p in runs.pods("stuck") if not p["metadata"].get("deletionTimestamp")],
                   timeout=60, what="the stuck run's pod to be deleted")
    assert not [line for line in runs.ledger() if "s-cancel" in line]


def test_an_abort_while_waiting_inside_a_saga_starts_a_pod_to_undo_the_work(operator: Operator, runs: RunEnv) -> None:
    runs.apply(runs.manifest("held", "optest_flows:booking", {"tag": "h", "approval": True}))
    waiting = runs.wait_phase("held", "Waiting", timeout=90)["status"]
    assert waiting["waitingFor"] == {"event": "approval", "since": waiting["waitingFor"]["since"], "compensations": 2}
    abort(runs, "held", "trip cancelled")

    done = runs.wait_phase("held", "Aborted", timeout=90)["status"]
    assert (done["abortReason"], done["outcome"], done["attempt"]) == ("UserRequested", "Aborted", 2), done
    assert "trip cancelled" in done["message"]
    events = [e["reason"] for e in runs.events("held")]
    assert "Aborting" in events
    assert [line for line in runs.ledger() if " h-" in line] == [
        "start h-book-flight", "done h-book-flight", "start h-book-hotel", "done h-book-hotel",
        "start h-cancel-hotel", "done h-cancel-hotel", "start h-cancel-flight", "done h-cancel-flight"]
