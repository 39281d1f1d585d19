"""LLM cost and tokens read from the real OpenAI and Anthropic SDKs' responses, priced from the table."""

from __future__ import annotations

import json
from decimal import Decimal
from pathlib import Path
from typing import Any

import anthropic
import openai
import pytest
from pydantic_ai import Agent
from pydantic_ai.models.openai import OpenAIChatModel
from pydantic_ai.providers.openai import OpenAIProvider

from durablerun import ConfigError, DurableContext, Outcome, Policy, api, llm
from durablerun._private.agents import llm as llm_impl
from durablerun._private.agents import quota_setup
from durablerun._private.storage.stream_reader import StreamReader
from durablerun.integrations.pydantic_ai import DurableRunDurability, run
from durablerun.testing import WorkflowTest

M = Decimal(1_000_000)


@pytest.fixture(autouse=True)
def _clean_prices(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(api.Env.LLM_PRICES, raising=False)
    monkeypatch.setattr(llm_impl, "_overrides", {})


def test_openai_calls_charge_their_step(llm_server: Any) -> None:
    server = llm_server([{"text": "a", "input_tokens": 2000, "output_tokens": 300, "cached_tokens": 1500},
                         {"text": "b", "input_tokens": 500, "output_tokens": 100}])
    client = llm.metered(openai.AsyncOpenAI(base_url=server.openai_base_url, api_key="k", max_retries=0))

    async def ask(history: list[dict[str, str]]) -> str:
        reply = await client.chat.completions.create(model="gpt-4o-2024-08-06",
                                                     messages=[*history, {"role": "user", "content": "go"}])
        return reply.choices[0].message.content or ""

    async def wf(ctx: DurableContext, input: Any) -> Any:
        first = await ctx.step("first", ask, [])
        return [first, await ctx.step("second", ask, [{"role": "assistant", "content": first}])]

    t = WorkflowTest(wf)
    done = t.attempt()
    assert done.outcome == Outcome.COMPLETED, done.message
    # gpt-4o: $2.50 in, $1.25 cached in, $10 out per 1M; OpenAI counts cached tokens inside prompt_tokens.
    first = (500 * Decimal("2.50") + 1500 * Decimal("1.25") + 300 * 10) / M
    second = (500 * Decimal("2.50") + 100 * 10) / M
    assert done.totals.usd == first + second
    assert done.totals.tokens == 2300 + 600
    # Replay charges nothing again and asks nothing again.
    assert t.attempt().totals.usd == first + second
    assert len(server.requests) == 2


def test_anthropic_calls_charge_cache_reads_apart(llm_server: Any) -> None:
    server = llm_server([{"text": "hello", "input_tokens": 10_000, "output_tokens": 1000, "cached_tokens": 8000}])
    client = llm.metered(anthropic.Anthropic(base_url=server.anthropic_base_url, api_key="k", max_retries=0))

    def ask() -> str:
        msg = client.messages.create(model="claude-opus-4-5", max_tokens=1024,
                                     messages=[{"role": "user", "content": "hi"}])
        return str(msg.content[0].text)  # type: ignore[union-attr]

    async def wf(ctx: DurableContext, input: Any) -> Any:
        return await ctx.step("ask", ask)

    done = WorkflowTest(wf).attempt()
    assert done.result == "hello"
    # The wire says input_tokens 2000 + cache_read_input_tokens 8000; opus 4.5: $5 in, $0.50 cache read, $25 out.
    assert done.totals.usd == (2000 * 5 + 8000 * Decimal("0.50") + 1000 * 25) / M
    assert done.totals.tokens == 11_000
    assert server.requests[0]["api"] == "anthropic"


def test_streamed_calls_charge_their_step_and_settle_their_share_when_the_stream_ends(
        llm_server: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """An OpenAI stream (sync; the usage it sends only when asked, which the metered client asks for) and an
    Anthropic stream (async; usage in message_start and message_delta): each charges its step the usage the
    stream reported, and settles its share of the quota with it."""
    server = llm_server([{"text": "streamed", "input_tokens": 2000, "output_tokens": 300}], repeat_last=True)
    monkeypatch.setenv(api.Env.LLM_QUOTAS, json.dumps({"quotas": [  # 20 tokens a second
        {"name": "gpt", "models": "gpt-4o*", "tokensPerMinute": 1200},
        {"name": "claude", "models": "claude-*", "tokensPerMinute": 1200}]}))
    oai = llm.metered(openai.OpenAI(base_url=server.openai_base_url, api_key="k", max_retries=0))
    claude = llm.metered(anthropic.AsyncAnthropic(base_url=server.anthropic_base_url, api_key="k", max_retries=0))

    def ask_openai() -> str:
        with oai.chat.completions.create(model="gpt-4o-2024-08-06", stream=True,
                                         messages=[{"role": "user", "content": "hi"}]) as stream:
            return "".join(c.choices[0].delta.content or "" for c in stream if c.choices)

    async def ask_claude() -> str:
        stream = await claude.messages.create(model="claude-opus-4-5", max_tokens=1024, stream=True,
                                              messages=[{"role": "user", "content": "hi"}])
        return "".join([e.delta.text async for e in stream if e.type == "content_block_delta"])

    async def wf(ctx: DurableContext, input: Any) -> Any:
        return [await ctx.step("openai", ask_openai), await ctx.step("claude", ask_claude)]

    done = WorkflowTest(wf).attempt()
    assert done.outcome == Outcome.COMPLETED, done.message
    assert done.result == ["streamed", "streamed"]
    # gpt-4o: $2.50 in, $10 out per 1M; opus 4.5: $5 in, $25 out.
    assert done.totals.usd == (2000 * Decimal("2.50") + 300 * 10 + 2000 * 5 + 300 * 25) / M
    assert done.totals.tokens == 2 * 2300
    limits = quota_setup.limiter()
    assert limits is not None
    # Each window was charged the 2,300 tokens its stream used, not the estimate its call reserved (some 1,030:
    # the prompt, and 1,024 answer tokens): 1,100 in debt, a token is a minute away; with the estimate it would
    # be there at once.
    for model in ("gpt-4o", "claude-opus-4-5"):
        wait = limits.try_take(model, 1)
        assert isinstance(wait, float)
        assert wait > 20


def test_a_streamed_answer_goes_to_an_output_stream_as_it_arrives(llm_server: Any) -> None:
    """A metered stream's tokens written to ``ctx.stream`` as they come (docs/agents.md): a reader gets the answer
    the step returns, and the step is charged the usage the stream reported at its end."""
    answer = "durable answers stream to their readers token by token"
    server = llm_server([{"text": answer, "input_tokens": 100, "output_tokens": 9}])
    oai = llm.metered(openai.OpenAI(base_url=server.openai_base_url, api_key="k", max_retries=0))

    async def wf(ctx: DurableContext, input: Any) -> Any:
        out = ctx.stream("answer")

        def ask() -> str:
            said = []
            with oai.chat.completions.create(model="gpt-4o-2024-08-06", stream=True,
                                             messages=[{"role": "user", "content": "hi"}]) as stream:
                for chunk in stream:
                    if chunk.choices and chunk.choices[0].delta.content:
                        out.write(chunk.choices[0].delta.content)
                        said.append(chunk.choices[0].delta.content)
            return "".join(said)

        return await ctx.step("ask", ask)

    test = WorkflowTest(wf)
    done = test.attempt()
    assert done.outcome == Outcome.COMPLETED, done.message
    assert len(server.requests) == 1
    run_store = test.store.run_store(test.ref)
    reads = list(StreamReader(run_store, "answer", final=True).read())
    assert "".join(r.chunk.text for r in reads) == done.result == answer
    assert done.totals.tokens == 109


def test_a_metered_call_outside_a_step_is_refused_before_it_is_made(llm_server: Any) -> None:
    server = llm_server([{"text": "never"}])
    client = llm.metered(openai.OpenAI(base_url=server.openai_base_url, api_key="k"))

    async def wf(ctx: DurableContext, input: Any) -> Any:
        return client.chat.completions.create(model="gpt-4o", messages=[])

    done = WorkflowTest(wf).attempt()
    assert done.outcome == Outcome.FAILED
    assert "must run inside a step" in (done.message or "")
    assert server.requests == []


def test_a_budget_stops_a_loop_of_metered_calls(llm_server: Any) -> None:
    server = llm_server([{"text": "again", "input_tokens": 4000, "output_tokens": 1000}], repeat_last=True)
    client = llm.metered(openai.OpenAI(base_url=server.openai_base_url, api_key="k", max_retries=0))

    def turn(n: int) -> str:
        history = [{"role": "assistant", "content": "again"}] * n  # the server's turn counter
        return client.chat.completions.create(model="gpt-4.1", messages=[*history, {"role": "user", "content": "go"}]
                                              ).choices[0].message.content or ""

    async def forever(ctx: DurableContext, input: Any) -> Any:
        n = 0
        while True:
            await ctx.step(f"turn-{n}", turn, n)
            n += 1

    done = WorkflowTest(forever, policy=Policy(costCeilingUSD="0.05")).attempt()
    # gpt-4.1: 4000 * $2 + 1000 * $8 per 1M = $0.016 a turn: the fourth passes $0.05, the fifth never starts.
    assert done.outcome == Outcome.ABORTED
    assert "costCeilingUSD" in (done.message or "")
    assert len(server.requests) == 4
    assert done.totals.usd == 4 * Decimal("0.016")


def test_prices_match_dated_and_prefixed_names() -> None:
    assert llm.price_for("gpt-4o-mini-2024-07-18") == llm.PRICES["gpt-4o-mini"]
    assert llm.price_for("openai:gpt-4o") == llm.PRICES["gpt-4o"]
    assert llm.price_for("claude-3-5-haiku-latest") == llm.PRICES["claude-3-5-haiku"]
    assert llm.price_for("claude-sonnet-4-20250514") == llm.PRICES["claude-sonnet-4-0"]


def test_an_unpriced_model_is_an_error_naming_it_and_the_fix() -> None:
    with pytest.raises(ConfigError, match=r"no price for model 'my-llama'.*set_price\('my-llama'"):
        llm.price_for("my-llama")


def test_prices_are_overridden_from_code_and_from_the_environment(tmp_path: Path,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    llm.set_price("gpt-4o", input=1, output=2)
    assert llm.price_for("gpt-4o") == llm.Price.of(1, 2, 1, 1)
    monkeypatch.setenv(api.Env.LLM_PRICES, json.dumps({"my-llama": {"input": 0, "output": 0}}))
    assert llm.cost(llm.Usage("my-llama", 1000, 1000)) == 0
    table = tmp_path / "prices.json"
    table.write_text(json.dumps({"my-llama": {"input": 1, "output": 3, "cached_input": "0.5"}}))
    monkeypatch.setenv(api.Env.LLM_PRICES, str(table))
    assert llm.cost(llm.Usage("my-llama", 3_000_000, 1_000_000, cached_tokens=1_000_000)) == Decimal("5.5")
    monkeypatch.setenv(api.Env.LLM_PRICES, json.dumps({"my-llama": {"in": 1}}))
    with pytest.raises(ConfigError, match=rf"{api.Env.LLM_PRICES}: model 'my-llama': give input and output"):
        llm.price_for("my-llama")


def test_usage_of_the_responses_api_is_read() -> None:
    usage = llm.read_usage({"model": "gpt-5", "usage": {"input_tokens": 100, "output_tokens": 20,
                                                         "input_tokens_details": {"cached_tokens": 40}}})
    assert usage == llm.Usage("gpt-5", 100, 20, 40)


def test_a_metered_call_to_an_unpriced_model_fails_the_step_before_it_is_sent(llm_server: Any) -> None:
    server = llm_server([{"text": "x"}])
    client = llm.metered(openai.OpenAI(base_url=server.openai_base_url, api_key="k"))

    async def wf(ctx: DurableContext, input: Any) -> Any:
        return await ctx.step("ask", lambda: client.chat.completions.create(model="my-llama", messages=[]))

    done = WorkflowTest(wf).attempt()
    assert done.outcome == Outcome.FAILED
    assert "no price for model 'my-llama'" in (done.message or "")
    assert "failed after 1 attempt" in (done.message or "")  # not retried
    assert server.requests == []


def test_an_agent_on_an_unpriced_model_fails_after_one_call_not_four(llm_server: Any) -> None:
    server = llm_server([{"text": "x"}])
    model = OpenAIChatModel("my-llama", provider=OpenAIProvider(base_url=server.openai_base_url, api_key="k"))
    agent = Agent(model, name="local", capabilities=[DurableRunDurability()])

    async def wf(ctx: DurableContext, input: Any) -> Any:
        return (await run(ctx, agent, "hi")).output

    done = WorkflowTest(wf).attempt()
    assert done.outcome == Outcome.FAILED
    assert "no price for model 'my-llama'" in (done.message or "")
    assert len(server.requests) == 1
