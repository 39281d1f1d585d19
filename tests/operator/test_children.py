"""Child runs and signals on the test bed: a supervisor fans out to workers through the operator.

The runner asks through its own status; the operator creates the children, reports their outcomes
back as the parent's events, passes suspension, aborts and deletion down, and delivers signals.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from durablerun import api, relations
from durablerun_testbed import procs
from tests.helpers.runs import Operator, RunEnv, StartOperator

pytestmark = pytest.mark.testbed
OPERATOR_PER_MODULE = True  # the tests asking for `operator` share one, each in its own namespace (conftest.py)

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


def children(runs: RunEnv, parent: str) -> dict[str, dict[str, Any]]:
    out = runs.testbed.kubectl("get", "dr", "-n", runs.namespace, "-l", f"{api.LABEL_PARENT}={parent}",
                               "-o", "json").stdout
    return {r["metadata"]["name"]: r for r in json.loads(out)["items"]}


def reasons(runs: RunEnv, name: str) -> list[str]:
    return [e["reason"] for e in runs.events(name)]


def test_a_supervisor_fans_out_waits_without_a_pod_and_combines_results_and_failures(
        operator: Operator, runs: RunEnv) -> None:
    runs.apply(runs.manifest("sup", "optest_children:supervisor",
                             {"children": 3, "sleep": 1.5, "fail": 2, "big": 1}))
    # While its children run, the parent waits with no pod.
    waiting = runs.wait_phase("sup", "Waiting", timeout=90)
    assert waiting["status"]["waitingFor"]["event"].startswith(relations.CHILD_EVENT_PREFIX)
    assert "waiting for child run sup-w" in waiting["status"]["message"]
    procs.wait_for(lambda: not [p for p in runs.pods("sup") if p["status"].get("phase") == "Running"],
                   timeout=30, what="the waiting parent's pod to be gone")
    done = runs.wait_phase("sup", "Succeeded", "Failed", timeout=120)
    assert done["status"]["phase"] == "Succeeded", done["status"].get("message")
    result = json.loads(done["status"]["result"]["inline"])
    assert result == {"squares": [0, 1], "sum": 1, "failed": ["w2"]}

    kids = children(runs, "sup")
    assert sorted(kids) == ["sup-w0", "sup-w1", "sup-w2"]
    for kid in kids.values():
        owner = kid["metadata"]["ownerReferences"][0]
        assert (owner["kind"], owner["name"], owner["uid"]) == ("DurableRun", "sup", done["metadata"]["uid"])
        assert kid["spec"]["template"] == done["spec"]["template"]
        assert kid["spec"]["checkpoint"] == done["spec"]["checkpoint"]
    # Each child's state is its own DurableRun: the parent keeps no per-child status, and once every outcome
    # is in its events, not even the names it created.
    assert "children" not in done["status"]
    assert "childrenCreated" not in done["status"]
    assert sorted(done["spec"]["events"]) == [relations.child_event(f"w{i}") for i in range(3)]
    assert kids["sup-w2"]["status"]["phase"] == "Failed"
    # w1's result is too big for its status: the parent read it from w1's journal (and got it right).
    assert "inline" not in kids["sup-w1"]["status"]["result"]
    # Every child started once, every step ran once; the parent's cost roll-up counts the two that paid.
    for step in ("w0-a", "w0-b", "w1-a", "w1-b", "w2-a", "w2-boom", "prep-0", "prep-1", "prep-2", "combine"):
        assert runs.executions(step) == 1, (step, runs.ledger())
    assert done["status"]["childrenTotal"] == {"runs": 3, "finished": 3, "summary": "3/3", "usd": "0.50",
                                               "tokens": 20}
    events = reasons(runs, "sup")
    assert events.count("ChildStarted") == 3
    assert events.count("ChildSucceeded") == 2
    assert events.count("ChildFailed") == 1
    wide = runs.testbed.kubectl("get", "dr", "sup", "-n", runs.namespace, "-o", "wide").stdout.splitlines()
    assert wide[1].split()[-3:-1] == ["3/3", "0.50"]  # then the trace id


def test_a_child_that_would_widen_a_budget_is_refused_and_the_parent_hears_why(
        operator: Operator, runs: RunEnv) -> None:
    manifest = runs.manifest("greedy", "optest_children:greedy", policy={"costCeilingUSD": "1"})
    runs.apply(manifest)
    done = runs.wait_phase("greedy", "Succeeded", "Failed", timeout=90)
    assert done["status"]["phase"] == "Succeeded", done["status"].get("message")
    message = json.loads(done["status"]["result"]["inline"])["error"]
    assert "policy.costCeilingUSD: 5 is above the parent's 1" in message
    assert children(runs, "greedy") == {}
    assert "ChildRefused" in reasons(runs, "greedy")


def test_kill_parent_and_child_restart_operator_every_child_once_deletion_cascades_signal_once(
        start_operator: StartOperator, runs: RunEnv) -> None:
    """The proof: 5 children; the parent's pod SIGKILLed while it starts children and while it works
    with them running, a child's pod SIGKILLed, the operator restarted in between."""
    node = runs.testbed.node
    assert node
    operator = start_operator("operator-1")
    runs.apply(runs.manifest("listener", "optest_flows:approval"))
    runs.apply(runs.manifest("boss", "optest_children:supervisor",
                             {"children": 5, "sleep": 1.0, "prep": 0.6, "hold": 3, "hold_between": True,
                              "signal": "listener"}))

    # 1. SIGKILL the parent while it starts its children (two started, a prep step running).
    procs.wait_for(lambda: "start prep-2" in runs.ledger(), timeout=60, what="the parent to start child 3")
    node.kill(runs.namespace, runs.get("boss")["status"]["pod"])
    # The prep step the kill caught (prep-2, or a later one on a slow machine): the process is dead, so its
    # ledger is whole; a later prep starts only once the one before it is journaled.
    killed_in = [line.split()[1] for line in runs.ledger() if line.startswith("start prep-")][-1]
    # 2. The operator restarts in between.
    operator.stop()
    operator = start_operator("operator-2")
    # 3. SIGKILL a child's pod in the middle of its work (its second step, held until released).
    procs.wait_for(lambda: "start w3-b" in runs.ledger(), timeout=90, what="child w3's second step")
    node.kill(runs.namespace, runs.get("boss-w3")["status"]["pod"])
    (runs.ledger_dir / "release-w3-b").touch()
    # 4. SIGKILL the parent while it works with its children running (its 'between' step, held).
    procs.wait_for(lambda: "start between" in runs.ledger(), timeout=90, what="the parent's between step")
    boss = runs.get("boss")
    assert any(k["status"].get("phase") not in ("Succeeded", "Failed") for k in children(runs, "boss").values())
    node.kill(runs.namespace, boss["status"]["pod"])
    (runs.ledger_dir / "release-between").touch()

    done = runs.wait_phase("boss", "Succeeded", "Failed", "Aborted", timeout=180)
    assert done["status"]["phase"] == "Succeeded", done["status"].get("message")
    assert json.loads(done["status"]["result"]["inline"]) == {
        "squares": [0, 1, 4, 9, 16], "sum": 30, "failed": []}
    assert done["status"]["restarts"] == 2

    # Every child was created once and every completed step ran once; only in-flight ones ran twice.
    kids = children(runs, "boss")
    assert sorted(kids) == [f"boss-w{i}" for i in range(5)]
    assert reasons(runs, "boss").count("ChildStarted") <= 5
    for i in range(5):
        assert runs.executions(f"w{i}-a") == 1, runs.ledger()
        assert runs.executions(f"w{i}-b") == (1 if i != 3 else 2), runs.ledger()  # w3-b: killed in it once
    assert kids["boss-w3"]["status"]["restarts"] == 1
    for step in [f"prep-{i}" for i in range(5)] + ["combine"]:
        assert runs.executions(step) in ((1, 2) if step == killed_in else (1,)), (step, killed_in, runs.ledger())
    assert runs.executions("between") == 2, runs.ledger()  # killed in it once

    # The signal reached the listener once, through the operator.
    listener = runs.wait_phase("listener", "Succeeded", timeout=90)
    assert json.loads(listener["status"]["result"]["inline"])["decision"] == {"approved": True, "by": "boss"}
    assert runs.get("listener")["spec"]["events"]["review"] == {"approved": True, "by": "boss"}
    assert [s["state"] for s in done["status"]["signals"].values()] == ["Delivered"]
    assert sum(line.startswith("decision ") for line in runs.ledger()) == 1

    # Deleting the parent deletes its children (owner references, garbage collection).
    runs.testbed.kubectl("delete", "dr", "boss", "-n", runs.namespace, "--wait=false")
    procs.wait_for(lambda: not children(runs, "boss"), timeout=90, what="the children to be deleted with boss")


def test_suspend_and_abort_of_the_parent_reach_its_running_children(operator: Operator, runs: RunEnv) -> None:
    # The workers' steps outlast the suspension's way to them: a worker never finishes before it can stop.
    runs.apply(runs.manifest("pa", "optest_children:supervisor", {"children": 2, "sleep": 1, "more": 20,
                                                                  "between": 0.05}))
    procs.wait_for(lambda: "start w1-a" in runs.ledger(), timeout=90, what="both children to run")
    runs.testbed.kubectl("patch", "dr", "pa", "-n", runs.namespace, "--type=merge", "-p",
                         '{"spec": {"suspend": true}}')
    for kid in ("pa-w0", "pa-w1"):
        suspended = runs.wait_phase(kid, "Suspended", timeout=60)
        assert suspended["metadata"]["annotations"][api.ANNOTATION_SUSPENDED_BY_PARENT] == "true"
    runs.testbed.kubectl("patch", "dr", "pa", "-n", runs.namespace, "--type=merge", "-p",
                         '{"spec": {"suspend": false}}')
    procs.wait_for(lambda: all(not runs.get(k)["spec"]["suspend"] for k in ("pa-w0", "pa-w1")), timeout=60,
                   what="the children to resume with their parent")
    runs.testbed.kubectl("annotate", "dr", "pa", "-n", runs.namespace, f"{api.ANNOTATION_ABORT}=enough")
    runs.wait_phase("pa", "Aborted", timeout=60)
    for kid in ("pa-w0", "pa-w1"):
        aborted = runs.wait_phase(kid, "Aborted", "Succeeded", timeout=60)
        if aborted["status"]["phase"] == "Aborted":
            assert aborted["metadata"]["annotations"][api.ANNOTATION_ABORTED_BY_PARENT] == "pa"


def test_the_supervisor_example_runs_as_a_tree_of_durable_runs(operator: Operator, runs: RunEnv) -> None:
    manifest = runs.manifest("supervisor", "supervisor:supervisor", {"question": "q", "agents": 2})
    manifest["spec"]["template"]["spec"]["containers"][0]["env"] = [{"name": "PYTHONPATH", "value": str(EXAMPLES)}]
    runs.apply(manifest)
    done = runs.wait_phase("supervisor", "Succeeded", "Failed", timeout=120)
    assert done["status"]["phase"] == "Succeeded", done["status"].get("message")
    assert json.loads(done["status"]["result"]["inline"]) == {
        "report": "q: q (angle 1): 3 sources; q (angle 2): 3 sources", "failed": []}
    assert sorted(children(runs, "supervisor")) == ["supervisor-agent-0", "supervisor-agent-1"]
    assert done["status"]["childrenTotal"]["usd"] == "0.06"


def test_a_retried_parent_does_not_start_its_children_again(operator: Operator, runs: RunEnv) -> None:
    runs.apply(runs.manifest("fr", "optest_children:fragile_supervisor"))
    failed = runs.wait_phase("fr", "Failed", timeout=120)
    assert "fragile" in failed["status"]["message"]
    created = {name: kid["metadata"]["uid"] for name, kid in children(runs, "fr").items()}
    assert sorted(created) == ["fr-w0", "fr-w1"]
    (runs.ledger_dir / "fixed").touch()
    runs.testbed.kubectl("annotate", "dr", "fr", "-n", runs.namespace, f"{api.ANNOTATION_RETRY}=1")
    done = runs.wait_phase("fr", "Succeeded", timeout=120)
    assert json.loads(done["status"]["result"]["inline"]) == {"squares": [0, 1]}
    assert {name: kid["metadata"]["uid"] for name, kid in children(runs, "fr").items()} == created
    assert reasons(runs, "fr").count("ChildStarted") == 2
    for step in ("w0-a", "w0-b", "w1-a", "w1-b"):
        assert runs.executions(step) == 1, (step, runs.ledger())
    assert runs.executions("fragile") == 2


def test_a_parent_as_an_older_operator_left_it_is_understood_after_the_upgrade(
        operator: Operator, runs: RunEnv) -> None:
    # A suspended parent (no pod) whose status an operator before childrenCreated wrote: a state per child in
    # status.children. w0 was created and then deleted before it finished; w1 was asked for, not created yet.
    runs.apply(runs.manifest("old", "optest_children:supervisor", suspend=True))
    runs.wait_phase("old", "Suspended", timeout=60)
    request = {"workflow": "optest_children:worker", "input": {"n": 1}, "policy": {}}
    legacy = {"childRequests": {"w0": request, "w1": request},
              "children": {"w0": {"run": "old-w0", "uid": "5d0c6a5e-0000-4000-8000-000000000000", "phase": "Running"}}}
    runs.patch_status("old", legacy)

    # The new operator reads the old names: w0 is reported failed and not created again; w1 is created (suspended
    # with its parent); status.children is gone, and only the child in flight is kept by name.
    def moved() -> dict[str, Any] | None:
        run = runs.get("old")
        return run if "children" not in run["status"] and run["status"].get("childrenCreated") == ["w1"] else None

    run = procs.wait_for(moved, timeout=60, what="the old status.children to be moved to childrenCreated")
    assert run["spec"]["events"][relations.child_event("w0")] == {
        "phase": "Failed", "uid": "", "message": "child run old-w0 was deleted before it finished"}
    assert sorted(children(runs, "old")) == ["old-w1"]
    assert runs.get("old-w1")["spec"]["suspend"] is True
    assert reasons(runs, "old").count("ChildStarted") == 1
