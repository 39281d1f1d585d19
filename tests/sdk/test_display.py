"""What `durablerun run` shows: a redrawn line on a terminal, plain lines otherwise."""

from __future__ import annotations

import io
import os
import pty
import subprocess
import sys
from decimal import Decimal
from pathlib import Path

from durablerun._private.tools.display import PlainProgress, TtyProgress
from durablerun.api import Outcome
from durablerun.engine import AttemptResult, RunStarted

from .helpers import sub_env

INFO = RunStarted(run="_local/x", attempt_id="a", journal_records=0, resumed=False,
                  objects_read=1, code_version="c")


def test_tty_progress_redraws_one_line_with_steps_current_step_and_cost() -> None:
    out = io.StringIO()
    tty = TtyProgress(out)
    tty.run_started(info=INFO)
    tty.step_started(position="0", name="plan", attempt=1)
    tty._last_draw = 0
    tty.step_completed(position="0", name="plan", seq=0, ok=True, duration=0.1)
    tty._last_draw = 0
    tty.cost_updated(usd=Decimal("0.25"), tokens=100, steps=1)
    tty.run_finished(result=AttemptResult(Outcome.COMPLETED, "done"))
    text = out.getvalue()
    assert "\r\x1b[2K" in text  # redraws in place
    last = text.rsplit("\r\x1b[2K", 1)[1]
    assert "1 steps" in last
    assert "plan" in last
    assert "$0.25" in last
    assert "100 tokens" in last


def test_plain_progress_writes_one_line_per_step() -> None:
    out = io.StringIO()
    plain = PlainProgress(out)
    plain.run_started(info=INFO)
    plain.step_completed(position="3", name="fetch", seq=3, ok=False, duration=1.5)
    lines = out.getvalue().splitlines()
    assert lines == ["durablerun: starting _local/x",
                     "durablerun: step 3 'fetch' FAILED in 1.500s"]
    assert "\x1b" not in out.getvalue()


def test_the_cli_picks_the_display_by_whether_stderr_is_a_terminal(tmp_path: Path) -> None:
    args = [sys.executable, "-m", "durablerun", "run", "racing:approval", "--run-id", "d",
            "--store", f"file://{tmp_path}/s", "--input", '{"work": 2}']
    piped = subprocess.run(args, env=sub_env(), capture_output=True, text=True, timeout=60)
    assert "durablerun: step 0 'work-0' done" in piped.stderr
    assert "\x1b[2K" not in piped.stderr
    # On a terminal: the live line.
    leader, follower = pty.openpty()
    tty_args = [a if a != "d" else "d2" for a in args]
    proc = subprocess.Popen(tty_args, env=sub_env(),
                            stdin=follower, stdout=subprocess.PIPE, stderr=follower)
    os.close(follower)
    proc.communicate(timeout=60)
    chunks = []
    while True:
        try:
            data = os.read(leader, 65536)
        except OSError:
            break
        if not data:
            break
        chunks.append(data)
    os.close(leader)
    screen = b"".join(chunks).decode(errors="replace")
    assert proc.returncode == 4
    assert "\x1b[2K" in screen
    assert "2 steps" in screen
    assert "$0.80" in screen


def test_both_displays_say_which_generation_a_continuing_run_is_in() -> None:
    resumed = RunStarted(run="_local/x", attempt_id="a", journal_records=3010, resumed=True,
                         objects_read=4, code_version="c", generation=3, first_loaded=3002)
    out = io.StringIO()
    tty = TtyProgress(out)
    tty.run_started(info=resumed)
    tty._last_draw = 0
    tty.continued_as_new(generation=4, seq=3050)
    text = out.getvalue()
    assert "resuming _local/x (3010 journal records, generation 3)" in text
    assert "gen 4" in text.rsplit("\r\x1b[2K", 1)[1]
    out = io.StringIO()
    plain = PlainProgress(out)
    plain.run_started(info=resumed)
    plain.continued_as_new(generation=4, seq=3050)
    assert out.getvalue().splitlines() == [
        "durablerun: resuming _local/x: 3010 journal records, generation 3 (read from record 3002) "
        "(4 objects read)",
        "durablerun: continued as new: generation 4 starts after journal record 3050"]
