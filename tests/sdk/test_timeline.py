"""`durablerun timeline` on a real journal: a run killed mid-step, resumed, waiting, then finished."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

from durablerun import api
from durablerun._private.tools import timeline
from durablerun.api import Outcome
from tests.helpers.local_runs import wait_until

from .helpers import cli, sub_env

WORKFLOW = textwrap.dedent('''
    import os, time
    from datetime import timedelta
    from durablerun import llm

    def costly():
        llm.charge(llm.Usage("gpt-4o", 2000, 500))
        return 1

    def hang():
        marker = os.environ["HANG_MARKER"]
        if not os.path.exists(marker):  # the first attempt hangs here and is killed
            open(marker, "w").close()
            time.sleep(600)
        time.sleep(0.5)
        return 2

    async def run(ctx, input):
        await ctx.step("fetch", lambda: 0)
        await ctx.step("costly", costly)
        await ctx.sleep(timedelta(seconds=0.3))
        await ctx.step("hang", hang)
        go = await ctx.wait_for_event("go")
        await ctx.step("finish", lambda: go)
        return "done"
''')


def test_timeline_of_a_run_with_a_restart_a_sleep_and_a_wait(tmp_path: Path) -> None:
    (tmp_path / "wf_timeline.py").write_text(WORKFLOW)
    env = sub_env({"HANG_MARKER": str(tmp_path / "hang-started")})  # the runner imports from its cwd
    base = ["--run-id", "tl", "--store", f"file://{tmp_path / 'store'}"]
    run = [sys.executable, "-m", "durablerun", "run", "wf_timeline:run", *base, "--quiet"]

    first = subprocess.Popen(run, cwd=tmp_path, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        wait_until(lambda: (tmp_path / "hang-started").exists(), timeout=60, what="step hang to start")
        first.send_signal(signal.SIGKILL)
    finally:
        first.kill()
        first.wait(30)
    waiting = subprocess.run(run, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120)
    assert waiting.returncode == Outcome.WAITING.exit_code, waiting.stderr

    open_wait = json.loads(cli(["timeline", *base, "--output", "json"], env=env).stdout)
    assert open_wait["entries"][-1]["kind"] == "wait"
    assert open_wait["entries"][-1]["reason"] == "waiting for event 'go'"

    assert cli(["send-event", *base, "go", '"now"'], env=env).returncode == 0
    done = subprocess.run(run, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr

    shown = cli(["timeline", *base, "--output", "json"], env=env)
    assert shown.returncode == 0, shown.stderr
    doc = json.loads(shown.stdout)
    assert doc["run"] == "_local/tl"
    assert doc["traceID"] == api.trace_id("_local/tl")  # where its spans are, when tracing is on
    # Attempt 1 journaled fetch and costly; attempt 2 (after the kill) hang and the wait; attempt 3 the rest.
    assert len(doc["attempts"]) == 3
    kinds = [(e["kind"], e["name"], e["attempt"]) for e in doc["entries"]]
    # Attempt 2 follows a kill (a restart, red in the run browser); attempt 3 the wait it ended with (a resume).
    assert kinds == [("step", "fetch", 1), ("step", "costly", 1), ("sleep", "sleep", 1),
                     ("restart", "attempt 2", 2), ("step", "hang", 2), ("resume", "attempt 3", 3),
                     ("wait", "go", 3), ("step", "finish", 3), ("complete", "result", 3)]
    entries = {(e["kind"], e["name"]): e for e in doc["entries"]}
    assert entries[("restart", "attempt 2")]["reason"].endswith("resumed the run")
    assert entries[("resume", "attempt 3")]["reason"].endswith("resumed the run after its wait for event 'go'")
    assert entries[("step", "costly")]["tokens"] == 2500
    assert entries[("step", "costly")]["marks"] == ["most expensive"]
    assert entries[("step", "hang")]["marks"] == ["slowest"]
    assert entries[("step", "hang")]["duration"] >= 0.5
    assert 0.29 <= entries[("sleep", "sleep")]["duration"] < 5  # from its journal write to its wake time
    wait = entries[("wait", "go")]
    assert wait["reason"] == "waited for event 'go'"
    assert wait["duration"] > 0
    assert doc["cost"]["tokens"] == 2500

    text = cli(["timeline", *base], env=env)
    assert text.returncode == 0, text.stderr
    lines = text.stdout.splitlines()
    assert lines[0].startswith("run _local/tl: ")
    assert "3 attempt(s)" in lines[0]
    assert "2500 tokens" in lines[0]
    assert lines[0].endswith(f"trace {api.trace_id('_local/tl')}")
    assert any("costly" in line and "<- most expensive" in line and "2500" in line for line in lines)
    assert any(" hang " in line and "<- slowest" in line for line in lines)
    assert sum("<restart>" in line for line in lines) == 1
    assert sum("<resume>" in line for line in lines) == 1
    assert any("<wait> go" in line and "waited for event 'go'" in line for line in lines)

    missing = cli(["timeline", "--run-id", "nope", "--store", f"file://{tmp_path / 'store'}"], env=env)
    assert missing.returncode == 1
    assert "no run _local/nope" in missing.stderr


def test_no_step_is_marked_when_none_stands_out(tmp_path: Path) -> None:
    """Steps that all took the same time (as shown) and cost nothing: no `<- slowest`, no `most expensive`."""
    (tmp_path / "wf_even.py").write_text(textwrap.dedent('''
        async def run(ctx, input):
            for name in ("a", "b", "c"):
                await ctx.step(name, lambda: 1)
            return "done"
    '''))
    env = sub_env({})
    base = ["--run-id", "even", "--store", f"file://{tmp_path / 'store'}"]
    done = subprocess.run([sys.executable, "-m", "durablerun", "run", "wf_even:run", *base, "--quiet"],
                          cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    doc = json.loads(cli(["timeline", *base, "--output", "json"], env=env).stdout)
    steps = [e for e in doc["entries"] if e["kind"] == "step"]
    assert [e["name"] for e in steps] == ["a", "b", "c"]
    assert [e["marks"] for e in steps] == [[], [], []]
    assert "<-" not in cli(["timeline", *base], env=env).stdout


def test_every_cost_is_on_a_row_and_the_rows_add_up_to_the_runs(tmp_path: Path) -> None:
    """ctx.add_cost outside a step travels with the next record, whatever it is: a wait, a sleep, a ctx.uuid.
    Each lands on a row (the wait's, the sleep's, a cost row), so the timeline's costs add up to the run's."""
    (tmp_path / "wf_costs.py").write_text(textwrap.dedent('''
        from datetime import timedelta

        def charged(ctx):
            ctx.add_cost(usd="0.5", tokens=5)
            return 1

        async def run(ctx, input):
            await ctx.step("inside", charged, ctx)
            ctx.add_cost(usd="0.01", tokens=100)
            await ctx.sleep(timedelta(milliseconds=10))
            ctx.add_cost(usd="0.02", tokens=200)
            ctx.uuid()
            ctx.add_cost(usd="0.04", tokens=400)
            await ctx.wait_for_event("go")
            return "done"
    '''))
    env = sub_env({})
    base = ["--run-id", "costs", "--store", f"file://{tmp_path / 'store'}"]
    run = [sys.executable, "-m", "durablerun", "run", "wf_costs:run", *base, "--quiet"]
    waiting = subprocess.run(run, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120)
    assert waiting.returncode == Outcome.WAITING.exit_code, waiting.stderr
    doc = json.loads(cli(["timeline", *base, "--output", "json"], env=env).stdout)
    rows = [(e["kind"], e["name"], e["usd"], e["tokens"]) for e in doc["entries"]]
    assert rows == [("step", "inside", "0.5", 5), ("sleep", "sleep", "0.01", 100), ("cost", "add_cost", "0.02", 200),
                    ("wait", "go", "0.04", 400)], rows
    assert doc["cost"] == {"usd": "0.57", "tokens": 705}
    text = cli(["timeline", *base], env=env).stdout
    assert any("<wait> go" in line and "$0.0400" in line for line in text.splitlines()), text


def test_a_restart_the_events_say_was_planned_is_a_resume_and_one_they_say_crashed_is_a_restart() -> None:
    """The journal cannot tell a suspended run's next attempt from a crash's: the run's Events can."""
    def row(kind: str) -> timeline.Entry:
        return timeline.Entry(kind, "attempt 2", 100.0, 200.0, attempt=2, reason="attempt 2 (w2) resumed the run")

    suspended, crashed, waited = row("restart"), row("restart"), row("resume")
    timeline.restart_causes([suspended], [(101.0, "Suspended", "suspended at a step boundary: spec.suspend is true"),
                                          (150.0, "Resumed", "spec.suspend is false: resuming")])
    assert suspended.kind == "resume"
    assert suspended.reason.startswith("suspended at a step boundary")
    crash = (101.0, api.EVENT_RESTARTING, "Crash: pod exited 137")
    timeline.restart_causes([crashed], [crash])
    assert (crashed.kind, crashed.causes) == ("restart", ["Crash"])
    timeline.restart_causes([waited], [crash])
    assert (waited.kind, waited.causes) == ("restart", ["Crash"])  # it crashed on its way to the wait


def test_an_event_names_the_cause_of_the_nearest_new_attempt_only() -> None:
    """A crash, then a restarted attempt that reaches its wait a second later, then the event: the crash's
    Event is within the slack of both new attempts, and only the restart is a crash; the other is a resume."""
    restart = timeline.Entry("restart", "attempt 2", 100.0, 101.0, attempt=2, reason="attempt 2 (w2) resumed the run")
    resume = timeline.Entry("resume", "attempt 3", 102.0, 160.0, attempt=3, reason="attempt 3 (w3) resumed the run")
    timeline.restart_causes([restart, resume], [(100.5, api.EVENT_RESTARTING, "Crash: pod exited 137"),
                                                (159.0, "EventReceived", "event review received")])
    assert (restart.kind, restart.causes) == ("restart", ["Crash"])
    assert (resume.kind, resume.causes) == ("resume", [])
