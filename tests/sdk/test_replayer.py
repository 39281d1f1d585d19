"""The replayer: today's code checked against recorded journals, executing and writing nothing."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import pytest

from durablerun import errors
from durablerun._private.records import codec, layout
from durablerun.api import Outcome
from durablerun.engine import Run
from durablerun.stores import RunRef, Store, open_store
from durablerun.testing import replay_run

from .helpers import cli

REF = RunRef.local("r1")


def _attempt(store: Store, input: dict[str, Any], workflow: str = "upgrading:v1") -> Any:
    return Run(store=store, run=REF, workflow=workflow, input=input).run_attempt()


def _files(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


def _waiting_run(tmp_path: Path, sleep_hours: int = 0) -> tuple[Store, Path, dict[str, Any]]:
    ledger = tmp_path / "ledger"
    store = open_store(f"file://{tmp_path / 'store'}")
    input = {"ledger": str(ledger), "sleep_hours": sleep_hours}
    assert _attempt(store, input).outcome == Outcome.WAITING
    ledger.write_text("")
    return store, ledger, input


def test_todays_code_replays_a_waiting_run_cleanly_executing_and_writing_nothing(tmp_path: Path) -> None:
    store, ledger, _ = _waiting_run(tmp_path)
    before = _files(tmp_path / "store")
    for workflow in ("upgrading:v1", "upgrading:patched"):
        report = replay_run(store, REF, workflow)
        assert report.clean, report.summary()
        assert report.exit_code == 0
        assert report.summary() == ("run _local/r1 replays cleanly: 4 journal records; the run would go on "
                                    "with the delivery of event 'review' at position 3")
    assert ledger.read_text() == "", "the replayer executed a step"
    assert _files(tmp_path / "store") == before, "the replayer wrote to the store"


def test_a_renamed_step_is_reported_as_the_first_divergence(tmp_path: Path) -> None:
    store, ledger, _ = _waiting_run(tmp_path)
    report = replay_run(store, REF, "upgrading:renamed")
    assert not report.clean
    assert report.exit_code == 1
    assert report.divergence is not None
    assert (report.divergence.position, report.divergence.expected, report.divergence.found) == (
        "2", "step 'draft'", "step 'draft-v2'")
    assert ledger.read_text() == ""


def test_a_durable_sleep_is_not_slept_and_the_journal_end_is_named(tmp_path: Path) -> None:
    store, ledger, _ = _waiting_run(tmp_path, sleep_hours=5)
    started = time.monotonic()
    report = replay_run(store, REF, "upgrading:v1")
    assert report.clean, report.summary()
    assert report.end == "the run would go on with step 'draft' at position 2"
    assert time.monotonic() - started < 30
    # A release that raises where the journal ends cannot be checked: it is an error, exit 3.
    crashed = replay_run(store, REF, "upgrading:crashing")
    assert crashed.exit_code == 3, crashed.summary()
    assert crashed.error is not None
    assert "RuntimeError: a bug in the new release" in crashed.error
    assert ledger.read_text() == ""


def test_a_completed_journal_replays_to_its_result_and_catches_a_dropped_step(tmp_path: Path) -> None:
    store, ledger, input = _waiting_run(tmp_path)
    store.put_event(run=REF, name="review", payload={"ok": True})
    assert _attempt(store, input).outcome == Outcome.COMPLETED
    ledger.write_text("")
    done = replay_run(store, REF, "upgrading:v1")
    assert done.clean, done.summary()
    assert done.end == "the journal's workflow completed, and so does the code's"
    dropped = replay_run(store, REF, "upgrading:shortened")
    assert dropped.divergence is not None
    assert (dropped.divergence.position, dropped.divergence.expected, dropped.divergence.found) == (
        "4", "step 'publish'", "nothing (the workflow ended first)")
    assert ledger.read_text() == ""


def test_the_replay_command_exit_codes_and_output(tmp_path: Path) -> None:
    store_uri = f"file://{tmp_path / 'store'}"
    base = ["--run-id", "r1", "--store", store_uri]
    input = json.dumps({"ledger": str(tmp_path / "ledger")})
    first = cli(["run", "upgrading:v1", *base, "--input", input, "--quiet"])
    assert first.returncode == Outcome.WAITING.exit_code, first.stderr

    clean = cli(["replay", "upgrading:patched", *base])
    assert clean.returncode == 0, clean.stderr
    assert clean.stdout.startswith("run _local/r1 replays cleanly: 4 journal records")

    diverged = cli(["replay", "upgrading:renamed", *base])
    assert diverged.returncode == 1, diverged.stderr
    assert diverged.stdout.count("\n") == 1
    assert diverged.stdout.startswith("run _local/r1 diverges at journal position 2: the journal holds "
                                      "step 'draft', the code asks for step 'draft-v2'")
    as_json = json.loads(cli(["replay", "upgrading:renamed", *base, "--json"]).stdout)
    assert as_json["clean"] is False
    assert as_json["divergence"]["position"] == "2"

    unknown = cli(["replay", "upgrading:v1", "--run-id", "nope", "--store", store_uri])
    assert unknown.returncode == Outcome.USAGE_ERROR.exit_code
    assert "no run _local/nope" in unknown.stderr


def test_a_journal_of_a_newer_layout_is_refused_in_one_line(tmp_path: Path) -> None:
    store, _, _ = _waiting_run(tmp_path)
    rs = store.run_store(REF)
    manifest = rs.read_manifest()
    assert manifest is not None
    rs.backend.put(rs.key(layout.MANIFEST), codec.seal(codec.dumps({**manifest, "layout": 2})))
    with pytest.raises(errors.ConfigError, match="journal layout 2"):
        replay_run(store, REF, "upgrading:v1")
    result = cli(["replay", "upgrading:v1", "--run-id", "r1", "--store", f"file://{tmp_path / 'store'}"])
    assert result.returncode == Outcome.USAGE_ERROR.exit_code
    assert result.stderr.strip().count("\n") == 0, result.stderr
    assert "newer than this SDK reads (layout 1)" in result.stderr
