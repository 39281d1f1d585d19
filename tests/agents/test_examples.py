"""The agent examples (examples/pydantic_ai_research, examples/approval_graph) run as their docstrings say,
against the scripted model server with the examples' own scripts."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from decimal import Decimal
from pathlib import Path

import pytest

from durablerun_testbed.llmserver import LLMServer, load_script
from tests.agents.helpers import REPO, cli

EXAMPLES = REPO / "examples"


Serve = Callable[[str], dict[str, str]]


@pytest.fixture
def serve() -> Iterator[Serve]:
    """Starts the model server with an example's script; returns the env that points the example at it."""
    servers: list[LLMServer] = []

    def start(script: str) -> dict[str, str]:
        turns, repeat = load_script(str(EXAMPLES / script))
        server = LLMServer(turns, repeat_last=repeat).start()
        servers.append(server)
        return {"OPENAI_BASE_URL": server.openai_base_url, "OPENAI_API_KEY": "local",
                "PYTHONPATH": str(EXAMPLES)}

    yield start
    for s in servers:
        s.stop()


def test_the_pydantic_ai_research_agent_answers_and_its_model_calls_are_charged(serve: Serve, tmp_path: Path) -> None:
    env = serve("pydantic_ai_research/script.json")
    store = f"file://{tmp_path / 'runs'}"
    done = cli(["run", "pydantic_ai_research:research", "--run-id", "a1", "--store", store, "--quiet",
                "--input", json.dumps({"question": "durable execution"}), "--max-cost", "0.05"], env, EXAMPLES)
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["report"].startswith("Durable execution journals every step")
    totals = json.loads(cli(["inspect", "--run-id", "a1", "--store", store, "--json"], env, EXAMPLES).stdout)["totals"]
    assert totals["steps"] == 6  # 3 model requests, 3 searches
    assert Decimal(totals["usd"]) > 0


def test_the_runaway_pydantic_ai_research_agent_is_stopped_by_its_budget(serve: Serve, tmp_path: Path) -> None:
    env = serve("pydantic_ai_research/runaway.json")
    done = cli(["run", "pydantic_ai_research:research", "--run-id", "a2", "--store", f"file://{tmp_path / 'runs'}",
                "--quiet", "--input", json.dumps({"question": "everything"}), "--max-cost", "0.05"], env, EXAMPLES)
    assert done.returncode == 3, done.stderr
    assert "policy.costCeilingUSD" in done.stderr


def test_the_approval_graph_waits_for_a_human_and_publishes(serve: Serve, tmp_path: Path) -> None:
    env = serve("approval_graph/script.json")
    store = f"file://{tmp_path / 'runs'}"
    waiting = cli(["run", "approval_graph:approval", "--run-id", "g1", "--store", store, "--quiet",
                   "--input", json.dumps({"topic": "durable agents"})], env, EXAMPLES)
    assert waiting.returncode == 4, waiting.stderr
    sent = cli(["send-event", "--run-id", "g1", "--store", store, "approval",
                json.dumps({"approved": True, "by": "dana"})], env, EXAMPLES)
    assert sent.returncode == 0, sent.stderr
    done = cli(["resume", "--run-id", "g1", "--store", store, "--quiet"], env, EXAMPLES)
    assert done.returncode == 0, done.stderr
    result = json.loads(done.stdout)
    assert result["approved_by"] == "dana"
    assert result["published"].startswith("Durable agents: they pick up after a crash")
    assert result["checks"] == ["legal: no claims to verify", "style: 12 words"]
