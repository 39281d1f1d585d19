"""`durablerun run` runs a supervisor's child runs in-process, as the operator would on Kubernetes.

Each child is a run of its own (``<run id>-<child>``, its own journal in the same store); the requests
are kept next to the parent's journal, so a family left waiting by one command goes on in the next; a
signal reaches its target; a failed child raises in the parent; ``inspect`` shows the children.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from durablerun.api import Outcome
from durablerun.stores import RunRef, open_store
from tests.helpers.local_runs import wait_until

from .helpers import cli, sub_env


def _family(tmp_path: Path, **input: object) -> tuple[list[str], Path, str]:
    ledger = tmp_path / "ledger"
    store = f"file://{tmp_path / 'store'}"
    return ["--run-id", "p", "--store", store], ledger, json.dumps({"ledger": str(ledger), **input})


def test_a_supervisor_runs_its_three_children_to_the_end_each_step_once(tmp_path: Path) -> None:
    base, ledger, input = _family(tmp_path)
    done = cli(["run", "local_family:supervisor", *base, "--input", input])
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout) == {"squares": [4, 9, 16], "got": [{"from": "supervisor"}, None, None]}
    assert "waiting for child run p-w0" in done.stderr
    for child in ("p-w0", "p-w1", "p-w2"):
        assert f"child run _local/{child}: Completed" in done.stderr
    # The parent ran once, was woken by its children's outcomes and replayed: nothing ran twice.
    assert sorted(ledger.read_text().split()) == ["p-w0:work", "p-w1:work", "p-w2:work", "p:combine", "p:plan"]

    shown = cli(["inspect", *base])
    assert shown.returncode == 0, shown.stderr
    assert "child     w1: run _local/p-w1 (local_family:worker), Completed" in shown.stdout
    as_json = json.loads(cli(["inspect", *base, "--json"]).stdout)
    assert [(c["name"], c["run"], c["outcome"]) for c in as_json["children"]] == [
        ("w0", "_local/p-w0", "Completed"), ("w1", "_local/p-w1", "Completed"), ("w2", "_local/p-w2", "Completed")]
    listed = json.loads(cli(["list", "--store", base[3], "--json"]).stdout)
    assert sorted(r["run"] for r in listed) == ["_local/p", "_local/p-w0", "_local/p-w1", "_local/p-w2"]


def test_a_child_that_fails_raises_in_the_parent(tmp_path: Path) -> None:
    base, ledger, input = _family(tmp_path, fail=True)
    failed = cli(["run", "local_family:supervisor", *base, "--input", input])
    assert failed.returncode == Outcome.FAILED.exit_code, failed.stderr
    assert "child run _local/p-w1: Failed" in failed.stderr
    assert "durablerun: Failed: the workflow raised ChildRunFailed: child run p-w1 Failed: " in failed.stderr
    assert "NonRetryableError: cannot work on 3" in failed.stderr
    assert "p:combine" not in ledger.read_text().split()


def test_children_left_waiting_go_on_in_a_later_command(tmp_path: Path) -> None:
    base, ledger, input = _family(tmp_path, outside=True)
    first = cli(["run", "local_family:supervisor", *base, "--input", input])
    assert first.returncode == Outcome.WAITING.exit_code, first.stderr
    assert "child run _local/p-w2: Waiting: waiting for event 'approve'" in first.stderr
    # The child is a run like any other: sent its event and resumed on its own, it finishes...
    child = ["--run-id", "p-w2", base[2], base[3]]
    assert cli(["send-event", *child, "approve", '{"by": "dana"}']).returncode == 0
    alone = cli(["resume", *child])
    assert alone.returncode == 0, alone.stderr
    # ...and the next command of the parent finds the requests it kept and its child's outcome.
    done = cli(["resume", *base])
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["got"] == [{"from": "supervisor"}, None, {"by": "dana"}]
    assert sorted(ledger.read_text().split()) == ["p-w0:work", "p-w1:work", "p-w2:work", "p:combine", "p:plan"]


def test_run_follow_moves_a_waiting_child_when_its_event_comes(tmp_path: Path) -> None:
    base, ledger, input = _family(tmp_path, outside=True)
    following = subprocess.Popen(
        [sys.executable, "-m", "durablerun", "run", "local_family:supervisor", *base, "--input", input, "--follow"],
        env=sub_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        store = open_store(base[3])
        wait_until(lambda: (store.run_store(RunRef.local("p-w2")).read_status() or {}).get("outcome")
                   == Outcome.WAITING, timeout=60, what="child p-w2 waiting for its event", interval=0.1)
        assert cli(["send-event", "--run-id", "p-w2", base[2], base[3], "approve", '"yes"']).returncode == 0
        out, err = following.communicate(timeout=60)
    finally:
        if following.poll() is None:
            following.kill()
            following.wait()
    assert following.returncode == 0, err
    assert json.loads(out)["got"][2] == "yes"
    assert sorted(ledger.read_text().split()) == ["p-w0:work", "p-w1:work", "p-w2:work", "p:combine", "p:plan"]
