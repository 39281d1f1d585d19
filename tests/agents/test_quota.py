"""Model quotas in one process: the limiter's arithmetic on a fake clock, and its configuration's errors."""

from __future__ import annotations

import json
import time
import uuid
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest

from durablerun import ConfigError, api
from durablerun._private.agents import quota, quota_setup
from durablerun._private.agents.quota import Grant, Limiter, Quota
from durablerun._private.records.model import StepRecord


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def take_all(limiter: Limiter, clock: Clock, model: str, calls: list[int],
             used: list[int] | None = None) -> list[float]:
    """When each call (its estimate) is granted, taking them in order and settling each at once with its usage
    (its estimate if ``used`` is None); the fake clock jumps to each grant."""
    times = []
    for i, tokens in enumerate(calls):
        grant = limiter.take(model, tokens, sleep=lambda s: setattr(clock, "now", clock.now + s))
        times.append(clock.now - 1000.0)
        grant.settle(tokens if used is None else used[i])
    return times


def test_tokens_per_minute_allow_a_minutes_burst_then_the_rate() -> None:
    clock = Clock()
    limiter = Limiter([Quota("gpt", "gpt-4o*", tokens_per_minute=60_000)], clock=clock)
    times = take_all(limiter, clock, "gpt-4o-mini", [20_000] * 5)
    # Three fit the first minute's bucket; then 20,000 tokens refill in 20 s (1,000 a second).
    assert times == pytest.approx([0, 0, 0, 20, 40], abs=0.01)


def test_a_settle_gives_back_what_the_call_did_not_use_and_charges_what_it_used_past_its_estimate() -> None:
    clock = Clock()
    limiter = Limiter([Quota("gpt", "gpt-4o*", tokens_per_minute=60_000)], clock=clock)
    # Reserved 30,000 each but used 10,000: the second and third fit at once.
    assert take_all(limiter, clock, "gpt-4o", [30_000] * 3, used=[10_000] * 3) == pytest.approx([0, 0, 0], abs=0.01)
    clock.now += 60  # full again
    # Used 50,000 past a 10,000 estimate: the debt delays the next call.
    times = take_all(limiter, clock, "gpt-4o", [10_000, 10_000], used=[60_000, 10_000])
    assert times[1] - times[0] == pytest.approx(10, abs=0.01)


def test_requests_per_minute_and_concurrent_calls() -> None:
    clock = Clock()
    limiter = Limiter([Quota("claude", "claude-*", requests_per_minute=2, concurrent=1)], clock=clock)
    first = limiter.try_take("claude-opus-4-5", 100)
    assert isinstance(first, Grant)
    assert limiter.try_take("claude-opus-4-5", 100) == 0.05  # one at a time: a slot frees when it settles
    first.settle(100)
    second = limiter.try_take("claude-sonnet-4-5", 100)  # the same quota: its pattern names both
    assert isinstance(second, Grant)
    second.settle(100)
    assert limiter.try_take("claude-haiku-4-5", 100) == pytest.approx(30.0)  # 2 a minute: one every 30 s


def test_a_call_larger_than_a_minutes_quota_waits_for_a_full_bucket_and_goes_alone() -> None:
    clock = Clock()
    limiter = Limiter([Quota("small", "local-*", tokens_per_minute=1000)], clock=clock)
    # The big call waits until the bucket is full (24 s), then goes; the 4,000 tokens it used past the bucket
    # and the next call's 100 refill in 246 s.
    assert take_all(limiter, clock, "local-llama", [400, 5000, 100]) == pytest.approx([0, 24, 24 + 246], abs=0.01)


def test_a_providers_retry_after_cools_the_whole_quota_down() -> None:
    clock = Clock()
    limiter = Limiter([Quota("gpt", "gpt-*", tokens_per_minute=1_000_000)], clock=clock)
    limiter.refused("gpt-4.1", 40)
    assert limiter.try_take("gpt-4o", 10) == pytest.approx(40)
    clock.now += 40
    assert isinstance(limiter.try_take("gpt-4o", 10), Grant)


def test_the_most_specific_pattern_wins_and_a_model_without_a_quota_is_not_limited() -> None:
    limiter = Limiter([Quota("all", "*", requests_per_minute=1), Quota("mini", "gpt-4o-mini*", requests_per_minute=9)])
    assert limiter.quota_for("gpt-4o-mini-2024-07-18").name == "mini"  # type: ignore[union-attr]
    assert limiter.quota_for("gpt-4o").name == "all"  # type: ignore[union-attr]
    assert Limiter([Quota("gpt", "gpt-*", concurrent=1)]).quota_for("claude-opus-4-5") is None
    unlimited = Limiter([Quota("gpt", "gpt-*", concurrent=1)])
    grants = [unlimited.try_take("claude-opus-4-5", 10**9) for _ in range(3)]
    assert all(isinstance(g, Grant) for g in grants)


class RateLimited(Exception):
    status_code = 429

    def __init__(self, headers: dict[str, str]) -> None:
        super().__init__("rate limited")
        self.response = type("Response", (), {"headers": headers})()


@pytest.mark.parametrize(("error", "seconds"), [
    (RateLimited({"retry-after": "40"}), 40.0),
    (RateLimited({"retry-after-ms": "1500", "retry-after": "2"}), 1.5),
    (RateLimited({}), None),
    (RateLimited({"retry-after": "Wed, 21 Oct 2015 07:28:00 GMT"}), None),
    (ValueError("not a 429"), None),
])
def test_retry_after_is_read_from_a_429(error: BaseException, seconds: float | None) -> None:
    assert quota.retry_after(error) == seconds


def test_an_estimate_is_the_prompts_size_and_the_most_the_call_may_answer() -> None:
    messages = [{"role": "user", "content": "x" * 3996}]
    assert quota.estimate_tokens({"messages": messages, "max_tokens": 100}) == \
        -(-len(json.dumps(messages)) // 4) + 100
    assert quota.estimate_tokens({"input": "hi"}) == 1 + quota.DEFAULT_OUTPUT_TOKENS


@pytest.mark.parametrize(("doc", "says"), [
    ('{"quotas": [{"name": "a", "models": "gpt-*", "tokensPerMinute": 0}]}',
     "quotas[0].tokensPerMinute: 0 is not a whole number of at least 1"),
    ('{"quotas": [{"name": "a", "models": "gpt-*"}]}', "quotas[0]: no limit"),
    ('{"quotas": [{"name": "a", "models": "gpt-*", "tpm": 5}]}', "quotas[0]: unknown field(s) tpm"),
    ('{"quotas": [{"models": "gpt-*", "concurrent": 2}]}', "quotas[0].name: required"),
    ('{"quotas": [{"name": "a", "models": "x", "concurrent": 1}, {"name": "a", "models": "y", "concurrent": 1}]}',
     "two quotas share a name"),
    ('[1, 2]', 'expected {"quotas": ['),
    ("{nope", "not JSON"),
])
def test_bad_quotas_name_the_field_and_the_fix(doc: str, says: str) -> None:
    with pytest.raises(ConfigError, match=None) as raised:
        quota.parse_quotas(doc)
    assert says in str(raised.value)
    assert api.Env.LLM_QUOTAS in str(raised.value)


def test_the_quotas_come_from_the_environment_as_json_or_a_file(tmp_path: Path,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    doc: dict[str, Any] = {"quotas": [{"name": "gpt", "models": "gpt-*", "requestsPerMinute": 5}]}
    monkeypatch.setenv(api.Env.LLM_QUOTAS, json.dumps(doc))
    assert quota_setup.limiter().quotas == [Quota("gpt", "gpt-*", requests_per_minute=5)]  # type: ignore[union-attr]
    (tmp_path / "quotas.json").write_text(json.dumps({"quotas": [{"name": "c", "models": "c*", "concurrent": 2}]}))
    monkeypatch.setenv(api.Env.LLM_QUOTAS, str(tmp_path / "quotas.json"))
    assert quota_setup.limiter().quotas == [Quota("c", "c*", concurrent=2)]  # type: ignore[union-attr]
    monkeypatch.delenv(api.Env.LLM_QUOTAS)
    assert quota_setup.limiter() is None


@pytest.mark.parametrize("with_quota", [False, True], ids=["no quota", "a quota"])
def test_metered_calls_under_a_quota_are_never_refused_by_the_provider(
        llm_server: Any, monkeypatch: pytest.MonkeyPatch, with_quota: bool) -> None:
    """Four 20,000-token calls to a provider that allows 60,000 tokens a minute: on their own the fourth is
    refused (429) and its step fails; under a quota a little below the provider's limit (clocks and the
    provider's counting differ), the calls wait for room and the provider refuses none."""
    import openai

    from durablerun import DurableContext, Outcome, Policy, llm
    from durablerun.testing import WorkflowTest

    server = llm_server([{"text": "ok", "input_tokens": 19_900, "output_tokens": 100}], repeat_last=True,
                        tokens_per_minute=60_000)
    if with_quota:
        monkeypatch.setenv(api.Env.LLM_QUOTAS, json.dumps(
            {"quotas": [{"name": "gpt-4o", "models": "gpt-4o*", "tokensPerMinute": 57_000}]}))
    else:
        monkeypatch.delenv(api.Env.LLM_QUOTAS, raising=False)
    client = llm.metered(openai.OpenAI(base_url=server.openai_base_url, api_key="k", max_retries=0))
    prompt = [{"role": "user", "content": "x" * 79_550}]  # some 19,900 tokens, as the provider counts them

    def ask() -> str:
        return client.chat.completions.create(model="gpt-4o-mini", messages=prompt, max_tokens=100
                                              ).choices[0].message.content or ""

    async def wf(ctx: DurableContext, input: Any) -> Any:
        return [await ctx.step(f"ask-{i}", ask) for i in range(4)]

    done = WorkflowTest(wf, policy=Policy(maxRetries=0)).attempt()
    refused = [r for r in server.requests if r.get("status") == 429]
    if with_quota:
        assert done.outcome == Outcome.COMPLETED, done.message
        assert (refused, done.totals.tokens) == ([], 80_000)
    else:
        assert done.outcome == Outcome.FAILED
        assert len(refused) == 1
        assert "RateLimitError" in (done.message or "")


def test_a_call_with_no_room_for_longer_than_a_step_waits_in_process_ends_the_attempt_waiting(
        llm_server: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """A second call that would wait about 20 s, in a run whose steps wait out 5 s at most: the attempt ends
    Waiting on the quota, with the wake time the room is due and no process; nothing of the step is journaled,
    and a later attempt runs it again from its start (the provider is asked once per call that went)."""
    import openai

    from durablerun import DurableContext, Outcome, llm
    from durablerun.engine import EngineConfig
    from durablerun.testing import WorkflowTest

    server = llm_server([{"text": "ok", "input_tokens": 900, "output_tokens": 100}], repeat_last=True)
    name = "tiny-" + uuid.uuid4().hex[:6]

    def declare(tokens_per_minute: int) -> None:
        monkeypatch.setenv(api.Env.LLM_QUOTAS, json.dumps(
            {"quotas": [{"name": name, "models": "gpt-4o*", "tokensPerMinute": tokens_per_minute}]}))

    declare(1500)  # 25 tokens a second
    client = llm.metered(openai.OpenAI(base_url=server.openai_base_url, api_key="k", max_retries=0))
    prompt = [{"role": "user", "content": "x" * 3560}]  # some 900 tokens by the estimate, 1,000 with the answer

    def ask() -> str:
        return client.chat.completions.create(model="gpt-4o-mini", messages=prompt, max_tokens=100
                                              ).choices[0].message.content or ""

    async def wf(ctx: DurableContext, input: Any) -> Any:
        return [await ctx.step("first", ask), await ctx.step("second", ask)]

    run = WorkflowTest(wf, config=EngineConfig(inline_sleep_max=timedelta(seconds=5)))
    asked = time.time()
    waiting = run.attempt()
    assert waiting.outcome == Outcome.WAITING, waiting.message
    assert waiting.waiting is not None
    assert waiting.waiting.quota == name
    assert waiting.waiting.wake_time is not None
    due = waiting.waiting.wake_time.timestamp() - asked
    assert 15 < due < 25, due  # the second call's ~510 missing tokens at 25 a second, plus at most a tenth
    assert f"waiting for room in model quota {name!r}" in (waiting.message or "")
    assert len(server.requests) == 1  # the second call was never sent
    journal = run.store.run_store(run.ref)
    assert [r.name for r in journal.read_all() if isinstance(r, StepRecord)] == ["first"]

    declare(60_000)  # the owner raised the quota: room at once
    done = run.attempt()
    assert done.outcome == Outcome.COMPLETED, done.message
    assert done.result == ["ok", "ok"]
    assert len(server.requests) == 2  # the first step was not asked again; the second once


@pytest.mark.parametrize("with_quota", [False, True], ids=["no quota", "a quota"])
def test_a_pydantic_ai_agents_model_requests_take_their_share(
        llm_server: Any, monkeypatch: pytest.MonkeyPatch, with_quota: bool) -> None:
    """Three 21,000-token model requests of a pydantic-ai agent to a provider allowing 60,000 tokens a minute:
    on their own the third is refused (429); under a quota of 57,000 it waits for room and none is."""
    from pai_quota import ask_three_times

    from durablerun import Outcome, Policy
    from durablerun.testing import WorkflowTest

    server = llm_server([{"text": "ok", "input_tokens": 20_900, "output_tokens": 100}], repeat_last=True,
                        tokens_per_minute=60_000)
    if with_quota:
        monkeypatch.setenv(api.Env.LLM_QUOTAS, json.dumps(
            {"quotas": [{"name": "gpt-" + uuid.uuid4().hex[:6], "models": "gpt-4o*", "tokensPerMinute": 57_000}]}))
    else:
        monkeypatch.delenv(api.Env.LLM_QUOTAS, raising=False)
    # Some 20,900 tokens by the estimate (its characters over 4), as the provider counts them.
    run = WorkflowTest(ask_three_times, {"base_url": server.openai_base_url, "chars": 83_500},
                       policy=Policy(maxRetries=0))
    done = run.attempt()
    refused = [r for r in server.requests if r.get("status") == 429]
    if with_quota:
        assert done.outcome == Outcome.COMPLETED, done.message
        assert (refused, done.totals.tokens) == ([], 63_000)
    else:
        assert done.outcome == Outcome.FAILED
        assert len(refused) == 1
