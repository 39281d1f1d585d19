"""`durablerun rerun` and `durablerun fork` through the CLI, with a ledger of the steps that ran."""

from __future__ import annotations

import json
from pathlib import Path

from durablerun._private.records import layout
from durablerun._private.storage.owner import Holder, OwnerLease
from durablerun.api import Outcome
from durablerun.stores import RunRef, open_store

from .helpers import cli


def _completed_run(tmp_path: Path) -> tuple[list[str], Path]:
    """Run upgrading:v1 to completion; returns the CLI's store arguments and the ledger (emptied)."""
    ledger = tmp_path / "ledger"
    base = ["--store", f"file://{tmp_path / 'store'}", "--quiet"]
    first = cli(["run", "upgrading:v1", "--run-id", "r1", *base, "--input", json.dumps({"ledger": str(ledger)})])
    assert first.returncode == Outcome.WAITING.exit_code, first.stderr
    assert cli(["send-event", "--run-id", "r1", *base[:2], "review", '{"ok": true}']).returncode == 0
    done = cli(["resume", "--run-id", "r1", *base])
    assert done.returncode == 0, done.stderr
    assert ledger.read_text().split() == ["plan", "draft", "publish"]
    ledger.write_text("")
    return base, ledger


def _files(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


def _history(base: list[str], run_id: str) -> tuple[list[dict[str, object]], list[dict[str, object]], str]:
    """What `durablerun inspect` shows of the run's recorded facts and archives: JSON, and the text."""
    shown = cli(["inspect", "--run-id", run_id, *base[:2], "--json"])
    assert shown.returncode == 0, shown.stderr
    doc = json.loads(shown.stdout)
    text = cli(["inspect", "--run-id", run_id, *base[:2]])
    assert text.returncode == 0, text.stderr
    return doc["history"], doc["archives"], text.stdout


def test_rerun_from_a_step_executes_it_and_what_follows_once_and_archives_the_rest(tmp_path: Path) -> None:
    base, ledger = _completed_run(tmp_path)
    rerun = cli(["rerun", "--run-id", "r1", "--from", "draft", *base])
    assert rerun.returncode == 0, rerun.stderr
    assert ledger.read_text().split() == ["draft", "publish"], "plan ran again, or draft/publish not once"
    assert "dropped 5 journal records from step 'draft' (position 2) on, kept 2" in rerun.stderr
    assert json.loads(rerun.stdout)["plan"] == "PLAN"
    [fact], [archive], text = _history(base, "r1")
    assert (fact["action"], fact["fromStep"], fact["fromSeq"], fact["dropped"]) == ("rerun", "draft", 2, 5)
    assert fact["by"]
    assert "durablerun CLI on host" in str(fact["via"])
    assert archive["path"] == fact["archive"]
    archived = tmp_path / "store" / "_local" / "r1" / str(fact["archive"])
    assert archive["objects"] == sum(1 for p in archived.rglob("*") if p.is_file())
    assert (archived / layout.MANIFEST).exists()
    assert any((archived / "journal").iterdir()), "the dropped records were not archived"
    assert (f"history   rerun from step 'draft' (position 2, record 2) by {fact['by']} ({fact['via']}) at "
            f"{fact['time']}: 5 record(s) dropped, the run as it was archived under {fact['archive']}") in text
    assert f"archive   {fact['archive']} ({archive['objects']} objects, under the run's root _local/r1/)" in text
    # Its timeline draws the rerun's attempt as a rerun (no crash), naming the step and who cut it back.
    drawn = json.loads(cli(["timeline", "--run-id", "r1", *base[:2], "--output", "json"]).stdout)
    [cut] = [e for e in drawn["entries"] if e["kind"] == "rerun"]
    assert cut["reason"].endswith(f"reran the run from step 'draft', cut back by {fact['by']} at {fact['time']}")
    assert "restart" not in [e["kind"] for e in drawn["entries"]], drawn["entries"]
    # The archive keeps the old journal: the rerun run's own journal holds the new records.
    replay = cli(["replay", "upgrading:v1", "--run-id", "r1", *base[:2]])
    assert replay.returncode == 0, replay.stdout + replay.stderr


def test_fork_copies_the_journal_before_a_step_into_a_new_run(tmp_path: Path) -> None:
    base, ledger = _completed_run(tmp_path)
    source = _files(tmp_path / "store" / "_local" / "r1" / "journal")
    fork = cli(["fork", "--run-id", "r1", "--from", "publish", "--to", "r2", *base])
    assert fork.returncode == 0, fork.stderr
    assert ledger.read_text().split() == ["publish"]
    assert json.loads(fork.stdout)["review"] == {"ok": True}, "the journaled event was not copied"
    assert _files(tmp_path / "store" / "_local" / "r1" / "journal") == source, "the source's journal changed"
    [fact], archives, text = _history(base, "r2")
    assert (fact["action"], fact["fromRun"], fact["fromStep"]) == ("fork", "_local/r1", "publish")
    assert archives == []
    assert (f"history   forked from run _local/r1 at step 'publish' (position {fact['fromPosition']}, record "
            f"{fact['fromSeq']}) by {fact['by']} ({fact['via']}) at {fact['time']}: its first {fact['fromSeq']} "
            "record(s) copied") in text
    store = open_store(f"file://{tmp_path / 'store'}")
    assert store.backend.list_keys(f"{RunRef.local('r1').path}/{layout.HISTORY_DIR}") == [], \
        "the fork recorded a fact in its source"


def test_bad_input_is_refused_in_one_line_and_nothing_is_written(tmp_path: Path) -> None:
    base, ledger = _completed_run(tmp_path)
    assert cli(["fork", "--run-id", "r1", "--from", "publish", "--to", "r2", *base]).returncode == 0
    ledger.write_text("")
    before = _files(tmp_path / "store")
    cases = {
        "has no step by that name": ["rerun", "--run-id", "r1", "--from", "nope", *base],
        "run _local/r2 exists": ["fork", "--run-id", "r1", "--from", "draft", "--to", "r2", *base],
        "differs from run _local/r1's input": ["fork", "--run-id", "r1", "--from", "draft", "--to", "r3", *base,
                                               "--input", '{"ledger": "elsewhere"}'],
        "no run _local/r9": ["rerun", "--run-id", "r9", "--from", "draft", *base],
    }
    for said, args in cases.items():
        result = cli(args)
        assert result.returncode == Outcome.USAGE_ERROR.exit_code, (args, result.stderr)
        assert said in result.stderr
        assert result.stderr.strip().count("\n") == 0, result.stderr
    assert _files(tmp_path / "store") == before
    assert ledger.read_text() == ""


def test_rerun_is_refused_while_an_attempt_holds_the_run(tmp_path: Path) -> None:
    base, ledger = _completed_run(tmp_path)
    store = open_store(f"file://{tmp_path / 'store'}")
    holder = OwnerLease(store.backend, RunRef.local("r1"), Holder(host="elsewhere", pid=1), 60.0)
    holder.acquire()
    journal = _files(tmp_path / "store" / "_local" / "r1" / "journal")
    refused = cli(["rerun", "--run-id", "r1", "--from", "draft", *base])
    assert refused.returncode == Outcome.USAGE_ERROR.exit_code
    assert "rerun of run _local/r1 refused" in refused.stderr
    assert "held by `durablerun run` on host elsewhere" in refused.stderr
    assert _files(tmp_path / "store" / "_local" / "r1" / "journal") == journal
    assert ledger.read_text() == ""
