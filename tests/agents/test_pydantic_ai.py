"""pydantic-ai agents as workflows: each model request and tool call is a journaled step.

Against the real pydantic-ai, openai and anthropic packages and a scripted model
server on loopback; the workflow runs in the real CLI (filesystem store and the
test bed's MinIO) and is SIGKILLed.
"""

from __future__ import annotations

import json
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest
from pydantic_ai import Agent
from pydantic_ai.models.anthropic import AnthropicModel
from pydantic_ai.models.openai import OpenAIChatModel
from pydantic_ai.providers.anthropic import AnthropicProvider
from pydantic_ai.providers.openai import OpenAIProvider

from durablerun import DurableContext, Outcome, Policy, api
from durablerun._private.storage.stream_reader import StreamReader
from durablerun.integrations.pydantic_ai import DurableRunDurability, run, stream_text
from durablerun.testing import WorkflowTest
from durablerun_testbed import procs
from durablerun_testbed.jaeger import Jaeger
from tests.agents.helpers import cli, kill_with_turn_in_flight

SCRIPT: list[dict[str, Any]] = [
    {"tool_calls": [{"name": "search", "args": {"query": "raft"}},
                    {"name": "search", "args": {"query": "paxos"}}]},
    {"tool_calls": [{"name": "search", "args": {"query": "viewstamped replication"}}]},
    {"tool_calls": [{"name": "search", "args": {"query": "epaxos"}}]},
    {"text": "Consensus: raft, paxos, VR, epaxos."},
]


def _lines(path: Path) -> list[str]:
    return path.read_text().splitlines() if path.exists() else []


def test_a_killed_agent_resumes_without_asking_a_finished_turn_again(
        llm_server: Any, store: tuple[list[str], dict[str, str]], tmp_path: Path) -> None:
    server = llm_server(SCRIPT)
    tools = tmp_path / "tools.log"
    store_args, store_env = store
    env = {"LLM_BASE_URL": server.openai_base_url, "TOOL_LOG": str(tools), **store_env}
    args = ["run", "pai_research:research", "--run-id", "r1", *store_args,
            "--input", json.dumps({"question": "compare consensus protocols"}), "--quiet"]
    # Turn 2's answer is held: when it is asked, turns 0 and 1 and their tool calls are journaled
    # (each step is durable before the next starts), and turn 2 is in flight when the kill lands.
    kill_with_turn_in_flight(server, 2, args, env, tmp_path)
    assert _lines(tools) == ["raft", "paxos", "viewstamped replication"]

    done = cli(args, env, tmp_path)
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout) == {"answer": "Consensus: raft, paxos, VR, epaxos."}
    # The turn in flight at the kill is asked again; no completed turn is.
    assert server.turns() == [0, 1, 2, 2, 3]
    assert _lines(tools) == ["raft", "paxos", "viewstamped replication", "epaxos"]
    # The resumed request carries the replayed tool results, as the first attempt's did.
    assert server.requests[3]["tool_results"] == server.requests[2]["tool_results"]

    inspected = json.loads(cli(["inspect", "--run-id", "r1", *store_args, "--json"], env, tmp_path).stdout)
    steps = [r["name"] for r in inspected["records"] if r["kind"] == "step"]
    model, tool = "researcher__model.request", "researcher__function_toolset__<agent>.call_tool:search"
    assert steps == [model, tool, tool, model, tool, model, tool, model]
    # Tokens of the four journaled turns only (the killed request was never journaled nor charged):
    # the server's default usage is 1000 + 100 * turn in, 200 out; gpt-4o-mini is $0.15 / $0.60 per 1M.
    assert inspected["totals"]["tokens"] == sum(1000 + 100 * t + 200 for t in range(4))
    assert Decimal(inspected["totals"]["usd"]) == (sum(1000 + 100 * t for t in range(4)) * Decimal("0.15")
                                                   + 4 * 200 * Decimal("0.60")) / 1_000_000


def test_an_agents_model_calls_are_spans_whose_tokens_and_cost_add_up_to_the_runs(
        llm_server: Any, jaeger: Jaeger, tmp_path: Path) -> None:
    """Each model call is a ``chat <model>`` span (GenAI conventions) under its step, in the run's trace."""
    server = llm_server(SCRIPT)
    store_args = ["--store", f"file://{tmp_path / 'store'}"]
    env = {"LLM_BASE_URL": server.openai_base_url, "TOOL_LOG": str(tmp_path / "tools.log"),
           "OTEL_EXPORTER_OTLP_ENDPOINT": jaeger.otlp_endpoint, "OTEL_BSP_SCHEDULE_DELAY": "100"}
    done = cli(["run", "pai_research:research", "--run-id", "traced-agent", *store_args,
                "--input", json.dumps({"question": "compare consensus protocols"}), "--quiet"], env, tmp_path)
    assert done.returncode == 0, done.stderr
    totals = json.loads(cli(["inspect", "--run-id", "traced-agent", *store_args, "--json"], env, tmp_path)
                        .stdout)["totals"]

    def chats() -> list[dict[str, Any]] | None:
        trace = jaeger.trace(api.trace_id(f"{api.LOCAL_NAMESPACE}/traced-agent"))
        found = [s for s in (trace or {}).get("spans", []) if s["operationName"].startswith("chat ")]
        return found if len(found) == len(SCRIPT) else None

    spans = procs.wait_for(chats, timeout=30, interval=0.2, what="the agent's model-call spans in Jaeger")
    tags = [{t["key"]: t["value"] for t in s["tags"]} for s in spans]
    assert {t["gen_ai.request.model"] for t in tags} == {"gpt-4o-mini"}
    assert {t["gen_ai.system"] for t in tags} == {"openai"}
    assert sum(t["gen_ai.usage.input_tokens"] + t["gen_ai.usage.output_tokens"] for t in tags) == totals["tokens"]
    assert sum(Decimal(str(t["durablerun.cost.usd"])) for t in tags) == pytest.approx(Decimal(totals["usd"]))
    # Under the model-request steps that made them.
    by_id = {s["spanID"]: s for s in jaeger.trace(api.trace_id(f"{api.LOCAL_NAMESPACE}/traced-agent"))["spans"]}
    for span in spans:
        (ref,) = [r for r in span["references"] if r["refType"] == "CHILD_OF"]
        assert by_id[ref["spanID"]]["operationName"] == "step researcher__model.request"


def test_a_runaway_agent_is_stopped_by_the_cost_budget(llm_server: Any, tmp_path: Path) -> None:
    """An agent that never stops calling tools, on gpt-4o, with --max-cost: no accounting code anywhere."""
    server = llm_server([{"tool_calls": [{"name": "search", "args": {"query": "more"}}]}], repeat_last=True)
    tools = tmp_path / "tools.log"
    env = {"LLM_BASE_URL": server.openai_base_url, "TOOL_LOG": str(tools), "LLM_MODEL": "gpt-4o"}
    done = cli(["run", "pai_research:research", "--run-id", "runaway", "--store", f"file://{tmp_path / 's'}",
                "--input", json.dumps({"question": "everything"}), "--quiet", "--max-cost", "0.01"], env, tmp_path)
    assert done.returncode == 3, done.stderr
    assert "policy.costCeilingUSD" in done.stderr
    # $2.50 / $10 per 1M: turn n costs 2.5e-6 * (1000 + 100 n) + 10e-6 * 200, so the third turn
    # ($0.01425 in all) passes $0.01 and the budget stops the next step, the tool call it asked for.
    assert server.turns() == [0, 1, 2]
    assert _lines(tools) == ["more", "more"]
    status = json.loads(cli(["inspect", "--run-id", "runaway", "--store", f"file://{tmp_path / 's'}", "--json"],
                            env, tmp_path).stdout)
    assert Decimal(status["totals"]["usd"]) == Decimal("0.01425")


def test_outside_a_durable_run_the_agent_runs_as_usual(llm_server: Any) -> None:
    server = llm_server([{"text": "plain"}])
    model = OpenAIChatModel("gpt-4o-mini", provider=OpenAIProvider(base_url=server.openai_base_url, api_key="k"))
    agent = Agent(model, name="plain", capabilities=[DurableRunDurability()])
    assert agent.run_sync("hi").output == "plain"


def test_run_needs_the_capability(llm_server: Any) -> None:
    server = llm_server([{"text": "x"}])
    model = OpenAIChatModel("gpt-4o-mini", provider=OpenAIProvider(base_url=server.openai_base_url, api_key="k"))
    bare = Agent(model, name="bare")

    async def wf(ctx: DurableContext, input: Any) -> Any:
        return (await run(ctx, bare, "hi")).output

    result = WorkflowTest(wf).attempt()
    assert result.outcome == Outcome.FAILED
    assert "has no DurableRunDurability capability" in (result.message or "")
    assert server.requests == []


@pytest.mark.parametrize("max_tokens", [2500])
def test_a_token_budget_stops_the_agent_between_steps(llm_server: Any, max_tokens: int) -> None:
    server = llm_server(SCRIPT)
    model = OpenAIChatModel("gpt-4o-mini", provider=OpenAIProvider(base_url=server.openai_base_url, api_key="k"))
    agent = Agent(model, name="budgeted", capabilities=[DurableRunDurability()])
    ran: list[str] = []

    @agent.tool_plain
    def search(query: str) -> str:
        ran.append(query)
        return "ok"

    async def wf(ctx: DurableContext, input: Any) -> Any:
        return (await run(ctx, agent, "go")).output

    t = WorkflowTest(wf, policy=Policy(maxTokens=max_tokens))
    first = t.attempt()
    # Turn 0 (1200 tokens) and its two tool calls, turn 1 (1300): 2500 reached before the next step.
    assert first.outcome == Outcome.ABORTED, first.message
    assert server.turns() == [0, 1]
    assert ran == ["raft", "paxos"]
    # Raising the budget resumes it from the journal: no turn is asked twice, no tool runs twice.
    done = t.attempt(policy=Policy(maxTokens=100_000))
    assert done.outcome == Outcome.COMPLETED, done.message
    assert done.result == SCRIPT[-1]["text"]
    assert server.turns() == [0, 1, 2, 3]
    assert ran == ["raft", "paxos", "viewstamped replication", "epaxos"]


def test_an_anthropic_agent_is_charged_for_cache_reads_at_their_price(llm_server: Any) -> None:
    server = llm_server([{"tool_calls": [{"name": "search", "args": {"query": "q"}}],
                          "input_tokens": 10_000, "output_tokens": 100, "cached_tokens": 9000},
                         {"text": "done", "input_tokens": 10_500, "output_tokens": 50, "cached_tokens": 9000}])
    model = AnthropicModel("claude-haiku-4-5",
                           provider=AnthropicProvider(base_url=server.anthropic_base_url, api_key="k"))
    agent = Agent(model, name="claude", capabilities=[DurableRunDurability()])

    @agent.tool_plain
    def search(query: str) -> str:
        return "found"

    async def wf(ctx: DurableContext, input: Any) -> Any:
        return (await run(ctx, agent, "go")).output

    done = WorkflowTest(wf).attempt()
    assert done.result == "done", done.message
    assert [r["api"] for r in server.requests] == ["anthropic", "anthropic"]
    # claude-haiku-4-5: $1 in, $0.10 cache read, $5 out per 1M.
    assert done.totals.usd == ((1000 + 1500) * 1 + 2 * 9000 * Decimal("0.10") + 150 * 5) / 1_000_000
    assert done.totals.tokens == 10_100 + 10_550


def test_a_resumed_agent_run_keeps_its_run_id(llm_server: Any) -> None:
    server = llm_server([{"text": "hello"}])
    model = OpenAIChatModel("gpt-4o-mini", provider=OpenAIProvider(base_url=server.openai_base_url, api_key="k"))
    agent = Agent(model, name="stable", capabilities=[DurableRunDurability()])
    seen: list[tuple[str, str | None]] = []

    async def wf(ctx: DurableContext, input: Any) -> Any:
        result = await run(ctx, agent, "hi")
        seen.append((result.run_id, result.all_messages()[-1].run_id))
        await ctx.wait_for_event("go")
        return result.output

    t = WorkflowTest(wf)
    assert t.attempt().outcome == Outcome.WAITING
    t.send_event("go")
    assert t.attempt().result == "hello"
    # The replay is the same agent run to pydantic-ai: same run id, on the replayed messages too.
    assert seen[0] == seen[1]
    assert seen[0][0] == seen[0][1]
    assert len(server.requests) == 1


def test_a_streamed_answer_is_written_to_an_output_stream_word_by_word_and_charged(llm_server: Any) -> None:
    """``stream_text``: each model request streams inside its step and its text reaches the output stream as the
    model sends it; the step is named for a streamed request and charged the stream's usage. A tool call between
    the turns reaches the handler as pydantic-ai delivers it to every engine, and writes nothing."""
    answer = "streamed answers reach their readers word by word"
    server = llm_server([{"tool_calls": [{"name": "lookup", "args": {"topic": "streams"}}]},
                         {"text": answer, "input_tokens": 100, "output_tokens": 8, "stream_pause": 0.1}])
    model = OpenAIChatModel("gpt-4o-mini", provider=OpenAIProvider(base_url=server.openai_base_url, api_key="k"))
    agent = Agent(model, name="streamer",
                  capabilities=[DurableRunDurability(event_stream_handler=stream_text("answer"))])

    @agent.tool_plain
    def lookup(topic: str) -> str:
        return f"notes on {topic}"

    async def wf(ctx: DurableContext, input: Any) -> Any:
        return (await run(ctx, agent, "explain streams")).output

    test = WorkflowTest(wf)
    done = test.attempt()
    assert done.outcome == Outcome.COMPLETED, done.message
    assert done.result == answer
    journal = test.store.run_store(test.ref)
    reads = list(StreamReader(journal, "answer", final=True).read())
    assert "".join(r.chunk.text for r in reads) == answer
    assert len(reads) > 1  # as it came, not whole at the end
    steps = [r.name for r in journal.read_all() if r.kind == "step"]
    model, events, tool = ("streamer__model.request_stream", "streamer__event_stream_handler",
                           "streamer__function_toolset__<agent>.call_tool:lookup")
    assert steps == [model, events, tool, events, model]  # the tool's call and result events, a step each
    assert done.totals.tokens == (1000 + 200) + (100 + 8)  # the first turn's default usage, then the script's
    assert server.turns() == [0, 1]
