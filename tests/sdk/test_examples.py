"""The examples under examples/ run, resume and behave as their docstrings say."""

from __future__ import annotations

import json
from decimal import Decimal
from pathlib import Path
from typing import Any

import code_migration
import fake_llm_research
import pytest

from durablerun.api import AbortReason, Outcome
from durablerun.engine import EngineConfig, Run
from durablerun.resource import Policy
from durablerun.stores import RunRef, Store

from .helpers import REPO, cli

FAST = EngineConfig(retry_initial=__import__("datetime").timedelta(milliseconds=1))


def go(store: Store, wf: Any, input: Any, ref: RunRef, policy: Policy | None = None) -> Any:
    return Run(store=store, run=ref, workflow=wf, input=input, policy=policy,
               config=FAST).run_attempt()


def test_fake_llm_research_charges_cost_retries_and_respects_the_budget(
    mem: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    llm = fake_llm_research.FakeLLM(flaky_every=3)
    monkeypatch.setattr(fake_llm_research, "LLM", llm)
    ref = RunRef.local("research")
    r = go(mem, fake_llm_research.research, {"topic": "durable execution", "width": 6}, ref,
           Policy(costCeilingUSD="0.005"))
    assert r.outcome == Outcome.ABORTED
    assert r.abort_reason == AbortReason.BUDGET_EXHAUSTED
    calls_before = llm.calls
    spent = r.totals.usd
    assert spent >= Decimal("0.005")
    r2 = go(mem, fake_llm_research.research, {"topic": "durable execution", "width": 6}, ref,
            Policy(costCeilingUSD="1.00"))
    assert r2.outcome == Outcome.COMPLETED, r2.message
    assert r2.result["sections"] == 6
    assert r2.result["report"].startswith("answer[")
    assert r2.totals.steps == 8  # plan, 6 research, draft: each journaled once
    assert r2.totals.tokens > 0
    assert r2.totals.usd > spent
    # Resume re-made only the calls not yet journaled (flaky ones retried).
    assert llm.calls - calls_before <= 8 + 8
    again = go(mem, fake_llm_research.research, {"topic": "durable execution", "width": 6}, ref)
    assert again.result == r2.result


def test_code_migration_waits_for_approval(mem: Store) -> None:
    code_migration.APPLIED.clear()
    ref = RunRef.local("mig")
    input = {"repo": "acme/api", "files": 3}
    r1 = go(mem, code_migration.migrate, input, ref)
    assert r1.outcome == Outcome.WAITING
    assert r1.waiting
    assert r1.waiting.event == "plan-approval"
    mem.put_event(run=ref, name="plan-approval", payload={"approved": True, "by": "dana"})
    r2 = go(mem, code_migration.migrate, input, ref)
    assert r2.outcome == Outcome.COMPLETED
    assert r2.result == {"repo": "acme/api", "status": "migrated", "commits": 3,
                         "tests": {"repo": "acme/api", "passed": True}, "approved_by": "dana"}
    # positions: scan 0, proposals 1-3, their gather 4, the wait 5, applies 6-8
    assert [f"_local/mig:{6 + i}:apply:acme/api/src/module_{i}.py"
                                      for i in range(3)] == code_migration.APPLIED
    rejected = RunRef.local("mig-no")
    go(mem, code_migration.migrate, input, rejected)
    mem.put_event(run=rejected, name="plan-approval", payload={"approved": False, "by": "lee"})
    assert go(mem, code_migration.migrate, input, rejected).result["status"] == "rejected"
    late = RunRef.local("mig-late")
    r = go(mem, code_migration.migrate, {**input, "approval_timeout": 0.2}, late)
    assert r.result == {"repo": "acme/api", "status": "escalated"}


def test_examples_run_from_the_cli(tmp_path: Path) -> None:
    store = f"file://{tmp_path}/s"
    env = {"PYTHONPATH": str(REPO / "examples")}
    log = tmp_path / "progress.jsonl"
    r = cli(["run", "fake_llm_research:research", "--run-id", "cli", "--store", store,
             "--input", '{"topic": "x", "width": 2}', "--max-cost", "1",
             "--json-log", str(log)], env=env)
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["sections"] == 2
    events = [json.loads(line)["event"] for line in log.read_text().splitlines()]
    assert events[0] == "run_started"
    assert events[-1] == "run_finished"
    assert events.count("step_completed") == 4  # plan, 2 x research, draft
    m = cli(["run", "code_migration:migrate", "--run-id", "m", "--store", store,
             "--input", '{"repo": "acme/api", "files": 2}'], env=env)
    assert m.returncode == 4
    assert "plan-approval" in m.stderr
    cli(["send-event", "--run-id", "m", "--store", store, "plan-approval",
         '{"approved": true, "by": "cli"}'], env=env)
    m2 = cli(["run", "code_migration:migrate", "--run-id", "m", "--store", store], env=env)
    assert m2.returncode == 0
    assert json.loads(m2.stdout)["status"] == "migrated"


def test_the_review_agent_waits_for_its_review_and_every_example_is_listed(tmp_path: Path) -> None:
    store = ["--store", f"file://{tmp_path}/s"]
    env = {"PYTHONPATH": str(REPO / "examples")}
    first = cli(["run", "review_agent:review_agent", "--run-id", "demo", *store,
                 "--input", '{"parts": 2, "step_seconds": 0.01}'], env=env)
    assert first.returncode == Outcome.WAITING.exit_code, first.stderr
    assert "waiting for event 'review'" in first.stderr
    shown = cli(["inspect", "--run-id", "demo", *store], env=env).stdout
    assert "3/4 steps" in shown  # plan and 2 research steps of the 4 it declared
    # Each research step's fake model call is on its own row, and the rows add up to the run's cost.
    timeline = json.loads(cli(["timeline", "--run-id", "demo", *store, "--output", "json"], env=env).stdout)
    costs = {e["name"]: (e["usd"], e["tokens"]) for e in timeline["entries"] if e["usd"] != "0" or e["tokens"]}
    assert costs == {"research-0": ("0.012", 1500), "research-1": ("0.012", 1500)}, timeline["entries"]
    assert timeline["cost"] == {"usd": "0.024", "tokens": 3000}
    cli(["send-event", "--run-id", "demo", *store, "review", '{"approved": true, "by": "dana"}'],
        env=env)
    done = cli(["resume", "--run-id", "demo", *store], env=env)
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["status"] == "published"
    readme = (REPO / "examples" / "README.md").read_text()
    examples = sorted(p.name for p in (REPO / "examples").iterdir() if (p / "__init__.py").exists())
    assert examples == ["approval_graph", "code_migration", "fake_llm_research", "pydantic_ai_research",
                        "review_agent", "supervisor"]
    for name in examples:
        assert f"[`{name}`]({name}/)" in readme, name


def test_the_supervisor_runs_locally_with_its_children(tmp_path: Path) -> None:
    store = ["--store", f"file://{tmp_path}/s"]
    env = {"PYTHONPATH": str(REPO / "examples")}
    local = cli(["run", "supervisor:supervisor", "--run-id", "sup", *store, "--input", '{"question": "q"}'], env=env)
    assert local.returncode == 0, local.stderr
    assert json.loads(local.stdout)["failed"] == []
    assert "child run _local/sup-agent-2: Completed" in local.stderr
    # Its sub-agent is an ordinary workflow: it runs locally on its own.
    alone = cli(["run", "supervisor:sub_agent", "--run-id", "agent", *store, "--input", '{"topic": "t"}'], env=env)
    assert alone.returncode == 0, alone.stderr
    assert json.loads(alone.stdout) == {"topic": "t", "summary": "t: 3 sources"}
