"""The local CLI has the operator's powers: retry after a fix, maxDuration counting active time only, an event
for an unknown run refused, `run --follow` through waits."""

from __future__ import annotations

import json
import subprocess
import sys
from datetime import timedelta
from pathlib import Path

from durablerun import api
from durablerun._private.records import codec, layout
from durablerun.api import Outcome, format_time, now
from durablerun.stores import RunRef, open_store
from tests.helpers.local_runs import wait_until

from .helpers import cli, sub_env


def test_retry_runs_the_failed_step_again_after_a_fix(tmp_path: Path) -> None:
    ledger, broken = tmp_path / "ledger", tmp_path / "broken"
    broken.write_text("")
    base = ["--run-id", "f1", "--store", f"file://{tmp_path / 'store'}", "--quiet"]
    input = json.dumps({"ledger": str(ledger), "broken": str(broken)})
    failed = cli(["run", "upgrading:fixable", *base, "--input", input])
    assert failed.returncode == Outcome.FAILED.exit_code, failed.stderr
    # A resume replays the journaled failure: the step does not run again.
    assert cli(["resume", *base]).returncode == Outcome.FAILED.exit_code
    assert ledger.read_text().split() == ["plan", "fetch"]
    broken.unlink()  # the fix
    retried = cli(["retry", *base])
    assert retried.returncode == 0, retried.stderr
    assert ledger.read_text().split() == ["plan", "fetch", "fetch", "publish"]
    assert json.loads(retried.stdout)["fetched"] == "fetched"
    again = cli(["retry", *base])
    assert again.returncode == Outcome.USAGE_ERROR.exit_code
    assert "run _local/f1 is Completed: retry is for a Failed or Aborted run" in again.stderr


def test_max_duration_counts_the_attempts_not_the_waits_between_them(tmp_path: Path) -> None:
    store_uri = f"file://{tmp_path / 'store'}"
    base = ["--run-id", "w1", "--store", store_uri, "--quiet"]
    input = json.dumps({"ledger": str(tmp_path / "ledger")})
    assert cli(["run", "upgrading:v1", *base, "--input", input, "--max-duration", "1h"]).returncode == \
        Outcome.WAITING.exit_code
    # The run waited for its review for two days: none of that counts.
    store = open_store(store_uri)
    rs = store.run_store(RunRef.local("w1"))
    manifest = rs.read_manifest()
    assert manifest is not None
    two_days_ago = format_time(now() - timedelta(days=2), precise=True)
    rs.backend.put(rs.key(layout.MANIFEST), codec.seal(codec.dumps({**manifest, "created": two_days_ago})))
    status = rs.read_status()
    assert status is not None
    assert 0 < status["activeSeconds"] < 600, status
    assert cli(["send-event", *base[:4], "review", "{}"]).returncode == 0
    done = cli(["resume", *base])
    assert done.returncode == 0, done.stderr
    rs.close()
    # What the attempts ran does count: an hour of it already used up stops the run.
    assert cli(["run", "upgrading:v1", "--run-id", "w2", "--store", store_uri, "--quiet", "--input", input]) \
        .returncode == Outcome.WAITING.exit_code
    w2 = store.run_store(RunRef.local("w2"))
    w2.write_status({**(w2.read_status() or {}), "activeSeconds": 3600})
    w2.close()
    assert cli(["send-event", "--run-id", "w2", "--store", store_uri, "review", "{}"]).returncode == 0
    aborted = cli(["resume", "--run-id", "w2", "--store", store_uri, "--max-duration", "1h"])
    assert aborted.returncode == Outcome.ABORTED.exit_code, aborted.stderr
    assert "MaxDurationExceeded" in aborted.stderr


def test_an_event_for_an_unknown_run_is_refused_and_not_stored(tmp_path: Path) -> None:
    store_uri = f"file://{tmp_path / 'store'}"
    (tmp_path / "store").mkdir()
    sent = cli(["send-event", "--run-id", "nope", "--store", store_uri, "review", "{}"])
    assert sent.returncode == Outcome.USAGE_ERROR.exit_code
    assert "no run _local/nope in" in sent.stderr
    assert "nothing was sent" in sent.stderr
    assert not any((tmp_path / "store").rglob("*.json"))


def test_run_follow_stays_through_a_sleep_and_a_wait_and_finishes_once_the_event_is_sent(tmp_path: Path) -> None:
    store_uri, ledger = f"file://{tmp_path / 'store'}", tmp_path / "ledger"
    base = ["--run-id", "f1", "--store", store_uri]
    # A durable sleep of ~2 s (no sleep is slept in process: the attempt ends Waiting for its wake time).
    proc = subprocess.Popen(
        [sys.executable, "-m", "durablerun", "run", "upgrading:v1", *base, "--quiet", "--follow",
         "--input", json.dumps({"ledger": str(ledger), "sleep_hours": 2 / 3600})],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        env=sub_env({api.Env.INLINE_SLEEP_MAX_SECONDS: "0"}))
    try:
        rs = open_store(store_uri).run_store(RunRef.local("f1"))
        wait_until(lambda: ((rs.read_status() or {}).get("waitingFor") or {}).get("event") == "review",
                   timeout=60, what="the run to sleep, then wait for its review")
        assert proc.poll() is None, "run --follow exited at the wait"
        assert cli(["send-event", *base, "review", '{"ok": true}']).returncode == 0
        out, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert proc.returncode == 0, err
    assert "following: waiting here for its wake time" in err
    assert "following: waiting here for event 'review'" in err
    assert json.loads(out)["review"] == {"ok": True}
    assert ledger.read_text().split() == ["plan", "draft", "publish"]


def test_a_failing_step_shows_its_own_traceback_once_and_each_retry_its_delay(tmp_path: Path) -> None:
    ledger, broken = tmp_path / "ledger", tmp_path / "broken"
    broken.write_text("")
    store = ["--store", f"file://{tmp_path / 'store'}"]
    failed = cli(["run", "upgrading:fixable", "--run-id", "f1", *store,
                  "--input", json.dumps({"ledger": str(ledger), "broken": str(broken)})])
    assert failed.returncode == Outcome.FAILED.exit_code
    err = failed.stderr
    assert err.count("step 1 'fetch' failed after 1 attempt; its traceback:") == 1, err
    assert err.count('raise NonRetryableError(f"{broken} exists: the bug is not fixed yet")') == 1, err
    assert err.count("the bug is not fixed yet") == 3, err  # the traceback, the step line, the outcome
    assert "durablerun/_private" not in err, err
    assert err.count("Traceback (most recent call last)") == 1, err

    retried = cli(["run", "upgrading:flaky", "--run-id", "f2", *store, "--retry-initial", "10ms",
                   "--input", json.dumps({"ledger": str(tmp_path / "flaky")})])
    assert retried.returncode == 0, retried.stderr
    for attempt in (1, 2):
        assert f"step 0 'flaky' attempt {attempt} raised ValueError: flaky {attempt}: retrying in 0.0" \
            in retried.stderr, retried.stderr
