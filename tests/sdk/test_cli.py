"""The local CLI as a user runs it: real processes, real exit codes."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from durablerun.api import Outcome
from tests.helpers.local_runs import StoreSpec, wait_until

from .helpers import cli, sub_env


def test_run_wait_send_event_resume_and_inspect(durable_store_spec: StoreSpec,
                                                tmp_path: Path) -> None:
    spec = durable_store_spec
    base = ["--run-id", "demo", "--store", spec.uri, *spec.cli_args]
    first = cli(["run", "racing:approval", *base, "--input", '{"topic": "llms"}'], env=spec.env)
    assert first.returncode == Outcome.WAITING.exit_code, first.stderr
    assert "waiting for event 'decision'" in first.stderr
    assert "send-event" in first.stderr

    sent = cli(["send-event", *base, "decision", '{"approved": true}'], env=spec.env)
    assert sent.returncode == 0, sent.stderr
    assert "stored" in sent.stdout
    assert "waiting for it" in sent.stdout
    again = cli(["send-event", *base, "decision", '{"approved": false}'], env=spec.env)
    assert again.returncode == 0
    assert "first write wins" in again.stdout

    # Resume without repeating --input: the stored input is used.
    done = cli(["run", "racing:approval", *base], env=spec.env)
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout) == {"done": [0, 1], "decision": {"approved": True},
                                       "topic": "llms"}

    table = cli(["inspect", *base], env=spec.env)
    assert table.returncode == 0, table.stderr
    assert "Completed" in table.stdout
    assert "work-0" in table.stdout
    assert "$0.80" in table.stdout
    assert "decision" in table.stdout
    as_json = json.loads(cli(["inspect", *base, "--json"], env=spec.env).stdout)
    assert as_json["completed"] is True
    assert as_json["totals"]["usd"] == "0.80"
    kinds = [r["kind"] for r in as_json["records"]]
    assert kinds == ["step", "step", "wait", "event", "complete"]


def test_budget_abort_then_raise_the_limit(tmp_path: Path) -> None:
    base = ["--run-id", "b", "--store", f"file://{tmp_path}/s", "--input", '{"work": 5}']
    aborted = cli(["run", "racing:approval", *base, "--max-cost", "1.00"])
    assert aborted.returncode == Outcome.ABORTED.exit_code, aborted.stderr
    assert "Aborted (BudgetExhausted)" in aborted.stderr
    assert "ceiling $1.00" in aborted.stderr
    assert "--max-cost" in aborted.stderr
    resumed = cli(["run", "racing:approval", *base, "--max-cost", "10"])
    assert resumed.returncode == Outcome.WAITING.exit_code, resumed.stderr
    info = json.loads(cli(["inspect", "--run-id", "b", "--store", f"file://{tmp_path}/s",
                           "--json"]).stdout)
    assert info["totals"] == {"usd": "2.00", "tokens": 250, "steps": 5}


def test_a_soft_budget_exits_waiting_and_a_resume_that_lifts_it_goes_on(tmp_path: Path) -> None:
    store = f"file://{tmp_path}/s"
    base = ["--run-id", "b", "--store", store]

    def steps() -> int:
        return int(json.loads(cli(["inspect", *base, "--json"]).stdout)["totals"]["steps"])

    asked = cli(["run", "racing:approval", *base, "--input", '{"work": 5}', "--ask-at-cost", "1.00"])
    assert asked.returncode == Outcome.WAITING.exit_code, asked.stderr
    assert "policy.askAt.costUSD reached: raise it and resume: durablerun resume" in asked.stderr
    assert "--ask-at-cost <higher>" in asked.stderr
    assert steps() == 3
    assert cli(["resume", *base]).returncode == Outcome.WAITING.exit_code  # the limit is kept
    assert steps() == 3
    lifted = cli(["resume", *base, "--ask-at-cost", "none"])
    assert lifted.returncode == Outcome.WAITING.exit_code, lifted.stderr  # now on the workflow's own wait
    assert "--ask-at-cost 1.00 -> none" in lifted.stderr
    assert "waiting for event 'decision'" in lifted.stderr
    assert steps() == 5


def test_a_runs_budgets_are_recorded_and_kept_on_every_resume(tmp_path: Path) -> None:
    store = f"file://{tmp_path}/s"
    base = ["--run-id", "b", "--store", store, "--quiet"]
    wf = ["racing:many_steps", "--input", '{"steps": 6}']
    first = cli(["run", *wf, *base, "--max-steps", "2"])
    assert first.returncode == Outcome.ABORTED.exit_code, first.stderr
    assert "2 steps journaled, limit 2 (policy.maxSteps, checked before each step starts)" \
        in first.stderr
    assert f"raise it and resume: durablerun resume --run-id b --store {store} --max-steps " \
        "<higher>" in first.stderr
    assert "run this command again" not in first.stderr
    assert "to resume:" not in first.stderr  # one piece of advice, not two that contradict

    def steps() -> int:
        info = json.loads(cli(["inspect", "--run-id", "b", "--store", store, "--json"]).stdout)
        return int(info["totals"]["steps"])

    # The same command without the flag, and a plain resume: the run keeps its budget.
    for again in (["run", *wf, *base], ["resume", *base]):
        r = cli(again)
        assert r.returncode == Outcome.ABORTED.exit_code, (again, r.stderr)
        assert "limit 2" in r.stderr
        assert steps() == 2
    raised = cli(["resume", *base, "--max-steps", "4"])
    assert raised.returncode == Outcome.ABORTED.exit_code, raised.stderr
    assert "changing the policy of run _local/b: --max-steps 2 -> 4 (recorded: later resumes " \
        "keep it)" in raised.stderr
    assert steps() == 4
    assert cli(["resume", *base]).returncode == Outcome.ABORTED.exit_code
    lifted = cli(["resume", *base, "--max-steps", "none"])
    assert lifted.returncode == 0, lifted.stderr
    assert "--max-steps 4 -> none" in lifted.stderr
    assert json.loads(lifted.stdout) == sum(range(6))


def test_usage_errors_exit_2_and_name_the_flag(tmp_path: Path,
                                               capsys: pytest.CaptureFixture[str]) -> None:
    store = ["--store", f"file://{tmp_path}/s"]
    cases = [
        (["run", "racing:approval", "--run-id", "x", *store, "--input", "{nope"], "--input"),
        (["run", "racing:approval", "--run-id", "x", *store, "--max-cost", "lots"],
         "--max-cost"),
        (["run", "racing:approval", "--run-id", "x", *store, "--max-duration", "8 hours"],
         "--max-duration"),
        (["run", "racing:approval", "--run-id", "bad id!", *store], "--run-id"),
        (["run", "no_such_module:run", "--run-id", "x", *store], "no module named"),
        (["run", "racing:nope", "--run-id", "x", *store], "no attribute 'nope'"),
        (["run", "racing:_charge", "--run-id", "x", *store], "must be an async function"),
        (["run", "racing:approval", "--run-id", "x", "--store", "ftp://x"], "unknown scheme"),
        (["run", "racing:approval", "--run-id", "x", "--store",
          f"file://{tmp_path}/missing/deeper"], "does not exist"),
        (["run", "racing:approval", *store], "--run-id"),
        (["send-event", "--run-id", "x", *store, "bad name!"], "invalid event name"),
    ]
    from durablerun._private.tools import cli as cli_module

    for args, needle in cases:
        assert cli_module.main(args) == 2, args
        err = capsys.readouterr().err
        assert needle in err, (args, err)
    # And once as a real process: the exit code reaches the shell.
    r = cli(cases[0][0])
    assert r.returncode == 2
    assert "--input" in r.stderr


def test_workflow_raising_at_import_fails_with_exit_1(tmp_path: Path) -> None:
    r = cli(["run", "broken_import:run", "--run-id", "x", "--store", f"file://{tmp_path}/s"])
    assert r.returncode == 1
    assert "config file missing" in r.stderr


def test_pod_subcommand_delegates_to_durablerun_pod(monkeypatch: pytest.MonkeyPatch) -> None:
    import types

    from durablerun._private import pod as pod_package
    from durablerun._private.tools import cli as cli_module

    seen: list[list[str]] = []
    fake = types.ModuleType("durablerun._private.pod.attempt")
    fake.main = lambda argv: seen.append(argv) or 5  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "durablerun._private.pod.attempt", fake)
    monkeypatch.setattr(pod_package, "attempt", fake, raising=False)
    assert cli_module.main(["pod", "--epoch", "3"]) == 5
    assert seen == [["--epoch", "3"]]
    # Without the module: a clear usage error, not a traceback.
    monkeypatch.setitem(sys.modules, "durablerun._private.pod.attempt", None)
    monkeypatch.delattr(pod_package, "attempt", raising=False)
    assert cli_module.main(["pod"]) == 2


def test_sigterm_suspends_at_a_step_boundary_and_rerun_resumes(tmp_path: Path) -> None:
    marker = tmp_path / "marker"
    base = ["--run-id", "t", "--store", f"file://{tmp_path}/s"]
    args = [sys.executable, "-m", "durablerun", "run", "racing:slow_steps", *base,
            "--input", json.dumps({"marker": str(marker), "steps": 30}), "--quiet"]
    proc = subprocess.Popen(args, env=sub_env(), stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    wait_until(lambda: marker.exists() and len(marker.read_text().split()) >= 3, timeout=30,
               what="a few steps")
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=30)
    assert proc.returncode == Outcome.SUSPENDED.exit_code, err
    assert "Suspended" in err
    ran = marker.read_text().split()
    assert len(ran) == len(set(ran))  # the step in flight finished within its grace period
    again = subprocess.run(args, env=sub_env(), capture_output=True, text=True, timeout=60)
    assert again.returncode == 0
    assert json.loads(again.stdout) == sum(range(30))
    executed = marker.read_text().split()
    assert sorted(map(int, executed)) == list(range(30))  # each step exactly once


def test_run_and_inspect_a_run_that_continues_as_new(durable_store_spec: StoreSpec) -> None:
    spec = durable_store_spec
    base = ["--run-id", "loop", "--store", spec.uri, *spec.cli_args]
    first = cli(["run", "continuing:loop", *base, "--input",
                 '{"total": 7, "every": 3, "wait": true}'], env=spec.env)
    assert first.returncode == Outcome.WAITING.exit_code, first.stderr
    # The plain display says where each generation starts.
    assert "continued as new: generation 1 starts after journal record 3" in first.stderr
    assert "continued as new: generation 2 starts after journal record 7" in first.stderr
    assert "step 2/0 'turn-6' done" in first.stderr

    table = cli(["inspect", *base], env=spec.env)
    assert table.returncode == 0, table.stderr
    assert "$0.70" in table.stdout
    assert "7 steps" in table.stdout
    assert ("generation 2 (ctx.continue_as_new 2 time(s)); it starts at record 7: records 7.. "
            "below; --all shows the earlier ones") in table.stdout
    assert "turn-6" in table.stdout
    assert "turn-0" not in table.stdout  # an earlier generation's: only with --all
    every = cli(["inspect", *base, "--all"], env=spec.env)
    assert "turn-0" in every.stdout
    assert "continue_as_new -> generation 1" in every.stdout
    as_json = json.loads(cli(["inspect", *base, "--json"], env=spec.env).stdout)
    assert as_json["generation"] == 2
    assert as_json["generationStart"] == 7
    assert as_json["totals"] == {"usd": "0.70", "tokens": 35, "steps": 7}
    assert [(r["position"], r["kind"]) for r in as_json["records"]] == [
        ("1/3", "continue"), ("2/0", "step"), ("2/1", "wait")]

    assert cli(["send-event", *base, "done"], env=spec.env).returncode == 0
    done = cli(["run", "continuing:loop", *base], env=spec.env)
    assert done.returncode == 0, done.stderr
    assert "resuming _local/loop: 10 journal records, generation 2 (read from record 7)" \
        in done.stderr
    assert json.loads(done.stdout) == {"i": 7, "acc": 21}


def test_inspect_into_a_pipe_that_closes_early_ends_quietly(tmp_path: Path) -> None:
    base = ["--run-id", "long", "--store", f"file://{tmp_path}/s"]
    assert cli(["run", "racing:many_steps", *base, "--input", '{"steps": 1500}', "--quiet"]
               ).returncode == 0
    # `durablerun inspect ... | head -1`: the table is bigger than the pipe's buffer.
    proc = subprocess.Popen([sys.executable, "-m", "durablerun", "inspect", *base], env=sub_env(),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    assert proc.stdout is not None
    assert proc.stderr is not None
    assert proc.stdout.readline().startswith(b"run ")
    proc.stdout.close()
    err = proc.stderr.read().decode()
    assert proc.wait(timeout=60) == 141, err  # 128 + SIGPIPE, as a shell reports it
    assert "Traceback" not in err, err
    assert "BrokenPipeError" not in err, err


def test_send_event_says_whether_a_live_attempt_picks_it_up(tmp_path: Path) -> None:
    store = f"file://{tmp_path}/s"
    # A run whose attempt ended waiting: it must be resumed.
    ended = ["--run-id", "ended", "--store", store]
    assert cli(["run", "racing:approval", *ended]).returncode == Outcome.WAITING.exit_code
    sent = cli(["send-event", *ended, "decision", "true"])
    assert "its last attempt has ended: deliver it with durablerun resume --run-id ended" \
        in sent.stdout, sent.stdout
    assert cli(["resume", *ended]).returncode == 0
    # A run whose attempt is still polling for the event (a short deadline): it needs nothing.
    live = ["--run-id", "live", "--store", store]
    proc = subprocess.Popen([sys.executable, "-m", "durablerun", "run", "racing:short_wait", *live,
                             "--input", '{"timeout": 40}', "--quiet"], env=sub_env(),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    from durablerun.stores import RunRef, open_store

    wait_until(lambda: (open_store(store).read_run(run=RunRef.local("live")).status or {}).get(
        "outcome") == "Waiting", timeout=30, what="the attempt to publish that it waits")
    sent = cli(["send-event", *live, "go", '"now"'])
    assert "its attempt is still polling for it" in sent.stdout, sent.stdout
    assert "picks the event up by itself" in sent.stdout
    assert "run it again" not in sent.stdout
    assert "resume" not in sent.stdout
    out, err = proc.communicate(timeout=30)
    assert proc.returncode == 0, err  # delivered without running anything again
    assert json.loads(out) == "now"


def test_resume_refuses_an_unknown_run_id_and_run_starts_one(tmp_path: Path) -> None:
    store = ["--store", f"file://{tmp_path}/s"]
    assert cli(["run", "racing:approval", "--run-id", "real", *store]).returncode == 4
    typo = cli(["resume", "racing:approval", "--run-id", "reel", *store])
    assert typo.returncode == 2, typo.stderr
    assert "no run _local/reel" in typo.stderr
    assert "nothing to resume" in typo.stderr
    assert "durablerun list" in typo.stderr
    assert "Traceback" not in typo.stderr
    listed = cli(["list", *store])
    assert "reel" not in listed.stdout  # nothing was created
    # resume takes the workflow from the run when it is not given
    assert cli(["send-event", "--run-id", "real", *store, "decision", "1"]).returncode == 0
    done = cli(["resume", "--run-id", "real", *store])
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["decision"] == 1


def test_list_and_delete_local_runs(durable_store_spec: StoreSpec) -> None:
    spec = durable_store_spec
    store = ["--store", spec.uri, *spec.cli_args]
    assert cli(["run", "racing:approval", "--run-id", "one", *store], env=spec.env).returncode == 4
    assert cli(["run", "racing:many_steps", "--run-id", "two", *store, "--quiet"],
               env=spec.env).returncode == 0
    listed = cli(["list", *store], env=spec.env)
    assert listed.returncode == 0, listed.stderr
    lines = listed.stdout.splitlines()
    assert lines[0].split() == ["RUN", "ID", "OUTCOME", "STEPS", "COST", "WORKFLOW", "STARTED"]
    assert lines[1].split()[:5] == ["one", "Waiting", "2", "$0.80", "racing:approval"]
    assert lines[2].split()[:4] == ["two", "Completed", "10", "$0"]
    as_json = json.loads(cli(["list", *store, "--json"], env=spec.env).stdout)
    assert [r["run"] for r in as_json] == ["_local/one", "_local/two"]

    deleted = cli(["delete", "--run-id", "one", *store], env=spec.env)
    assert deleted.returncode == 0, deleted.stderr
    assert "deleted run _local/one" in deleted.stdout
    assert [r["run"] for r in json.loads(cli(["list", *store, "--json"], env=spec.env).stdout)] \
        == ["_local/two"]
    assert cli(["inspect", "--run-id", "one", *store], env=spec.env).returncode == 1
    again = cli(["delete", "--run-id", "one", *store], env=spec.env)
    assert again.returncode == 1
    assert "no run _local/one" in again.stderr


def test_inspect_a_killed_run_and_a_gather(tmp_path: Path) -> None:
    store = ["--store", f"file://{tmp_path}/s"]
    marker = tmp_path / "marker"
    args = [sys.executable, "-m", "durablerun", "run", "racing:slow_steps", "--run-id", "killed",
            *store, "--input", json.dumps({"marker": str(marker), "steps": 200}), "--quiet"]
    proc = subprocess.Popen(args, env=sub_env(), stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)
    wait_until(lambda: marker.exists() and len(marker.read_text().split()) >= 3, timeout=30,
               what="a few steps")
    proc.kill()
    proc.wait(timeout=30)
    table = cli(["inspect", "--run-id", "killed", *store])
    assert table.returncode == 0, table.stderr
    assert "outcome -:" not in table.stdout
    assert "outcome   none recorded: an attempt is running now, or was killed" in table.stdout

    assert cli(["run", "racing:fan_out", "--run-id", "fan", *store]).returncode == 0
    table = cli(["inspect", "--run-id", "fan", *store]).stdout
    rows = [line.split()[1:3] for line in table.splitlines() if line[:5].strip().isdigit()]
    # ctx.gather(ctx.step(...), ctx.step(...)): the steps took 1 and 2 when called, the gather 3.
    assert sorted(rows) == [["0", "step"], ["1", "step"], ["2", "step"], ["4.0.0", "step"],
                            ["4.1.0", "step"], ["5", "step"], ["end", "complete"]], table
    assert "positions 3: no record. A ctx.gather takes a position and journals nothing itself" \
        in table
    assert ("positions 4: ctx.gather of coroutines, which journals no record of its own; branch "
            "b's operations are numbered <gather>.b.n") in table
