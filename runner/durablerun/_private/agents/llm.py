"""The implementation of durablerun.llm (see its docstring)."""

from __future__ import annotations

import dataclasses
import inspect
import json
import os
import re
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from decimal import Decimal
from typing import Any, TypeVar

from durablerun import api, errors
from durablerun._private.agents import quota, quota_setup
from durablerun._private.engine import replay
from durablerun._private.engine.context import DurableContext
from durablerun._private.telemetry import tracing

T = TypeVar("T")

__all__ = ["PRICES", "PRICES_AS_OF", "Price", "UnpricedModelError", "Usage", "charge", "charge_response", "cost",
           "metered", "price_for", "read_usage", "set_price"]

_M = Decimal(1_000_000)


class UnpricedModelError(errors.ConfigError, errors.NonRetryableError):
    """A model with no price: the step fails at once (a retry would pay for the call again)."""


@dataclass(frozen=True)
class Price:
    """USD per million tokens."""

    input: Decimal
    output: Decimal
    cached_input: Decimal
    cache_write: Decimal

    @classmethod
    def of(cls, input: float | str | Decimal, output: float | str | Decimal,
           cached_input: float | str | Decimal | None = None,
           cache_write: float | str | Decimal | None = None) -> Price:
        i, o = Decimal(str(input)), Decimal(str(output))
        c = i if cached_input is None else Decimal(str(cached_input))
        w = i if cache_write is None else Decimal(str(cache_write))
        if min(i, o, c, w) < 0:
            raise errors.ConfigError(f"prices must be >= 0, got input {i}, output {o}, cached input {c}, "
                                     f"cache write {w}")
        return cls(i, o, c, w)


#: When the pinned prices were taken: the providers' published per-token list prices (standard tier,
#: prompts under 200k tokens), as collected by the genai-prices package 0.2.3 (November 2026).
PRICES_AS_OF = "2026-11-23"

#: Model name -> price (USD per million tokens: input, output, cached input, cache write).
PRICES: dict[str, Price] = {
    # OpenAI: cached input is a prompt-cache read; no charge for cache writes.
    "gpt-4o": Price.of("2.50", "10.00", "1.25"),
    "gpt-4o-mini": Price.of("0.15", "0.60", "0.075"),
    "gpt-4.1": Price.of("2.00", "8.00", "0.50"),
    "gpt-4.1-mini": Price.of("0.40", "1.60", "0.10"),
    "gpt-4.1-nano": Price.of("0.10", "0.40", "0.025"),
    "gpt-5": Price.of("1.25", "10.00", "0.125"),
    "gpt-5-mini": Price.of("0.25", "2.00", "0.025"),
    "gpt-5-nano": Price.of("0.05", "0.40", "0.005"),
    "o3": Price.of("2.00", "8.00", "0.50"),
    "o4-mini": Price.of("1.10", "4.40", "0.275"),
    # Anthropic: cache reads 0.1x input, cache writes (5-minute TTL) 1.25x input.
    "claude-opus-4-5": Price.of("5.00", "25.00", "0.50", "6.25"),
    "claude-opus-4-1": Price.of("15.00", "75.00", "1.50", "18.75"),
    "claude-opus-4-0": Price.of("15.00", "75.00", "1.50", "18.75"),
    "claude-sonnet-4-5": Price.of("3.00", "15.00", "0.30", "3.75"),
    "claude-sonnet-4-0": Price.of("3.00", "15.00", "0.30", "3.75"),
    "claude-3-7-sonnet": Price.of("3.00", "15.00", "0.30", "3.75"),
    "claude-haiku-4-5": Price.of("1.00", "5.00", "0.10", "1.25"),
    "claude-3-5-haiku": Price.of("0.80", "4.00", "0.08", "1.00"),
}

#: Names that differ from the table's only by how the provider spells them.
_ALIASES = {"claude-opus-4": "claude-opus-4-0", "claude-sonnet-4": "claude-sonnet-4-0"}

_ENV = api.Env.LLM_PRICES
_env_loaded: str | None = None
_overrides: dict[str, Price] = {}


def set_price(model: str, *, input: float | str | Decimal, output: float | str | Decimal,
              cached_input: float | str | Decimal | None = None,
              cache_write: float | str | Decimal | None = None) -> None:
    """Set (or add) a model's price, USD per million tokens; cached/cache-write default to ``input``."""
    _overrides[model] = Price.of(input, output, cached_input, cache_write)


def _load_env() -> None:
    global _env_loaded
    raw = os.environ.get(_ENV, "")
    if raw == _env_loaded:
        return
    text = raw
    if raw and not raw.lstrip().startswith("{"):
        try:
            with open(raw) as f:
                text = f.read()
        except OSError as e:
            raise errors.ConfigError(f"{_ENV}={raw!r}: cannot read the price file: {e}") from None
    table: dict[str, Price] = {}
    if text:
        try:
            data = json.loads(text)
            if not isinstance(data, dict):
                raise ValueError("not a JSON object")
            for model, p in data.items():
                unknown = set(p) - {"input", "output", "cached_input", "cache_write"}
                if unknown or "input" not in p or "output" not in p:
                    raise ValueError(f"model {model!r}: give input and output (and optionally cached_input, "
                                     f"cache_write), USD per million tokens; got {sorted(p)}")
                table[model] = Price.of(p["input"], p["output"], p.get("cached_input"), p.get("cache_write"))
        except (ValueError, TypeError, AttributeError) as e:
            raise errors.ConfigError(
                f"{_ENV}: {e}. Expected {{\"model\": {{\"input\": 2.5, \"output\": 10, \"cached_input\": 1.25}}}} "
                "(USD per million tokens), inline or in a file") from None
    _env_prices.clear()
    _env_prices.update(table)
    _env_loaded = raw


_env_prices: dict[str, Price] = {}
_DATE_SUFFIX = re.compile(r"(-\d{4}-\d{2}-\d{2}|-\d{8}|-latest)$")


def price_for(model: str) -> Price:
    """The price of ``model``: overrides first, then the table, matching dated and prefixed names.

    ``gpt-4o-mini-2024-07-18`` and ``openai:gpt-4o-mini`` price as ``gpt-4o-mini``;
    ``claude-sonnet-4-5-20250929`` as ``claude-sonnet-4-5``. No price: ConfigError.
    """
    _load_env()
    name = re.split(r"[:/]", model)[-1]
    for table in (_overrides, _env_prices, PRICES):
        for candidate in (model, name, _DATE_SUFFIX.sub("", name)):
            candidate = _ALIASES.get(candidate, candidate)
            if candidate in table:
                return table[candidate]
    raise UnpricedModelError(
        f"no price for model {model!r}, so its calls cannot count against a cost budget: add one with "
        f"durablerun.llm.set_price({name!r}, input=..., output=...) or in {_ENV} "
        f"(USD per million tokens; docs/agents.md)")


@dataclass(frozen=True)
class Usage:
    """Tokens of one model call. ``input_tokens`` counts every prompt token, cached ones included."""

    model: str
    input_tokens: int
    output_tokens: int
    cached_tokens: int = 0
    cache_write_tokens: int = 0

    @property
    def tokens(self) -> int:
        return self.input_tokens + self.output_tokens


def cost(usage: Usage) -> Decimal:
    """USD for ``usage`` at the model's price."""
    p = price_for(usage.model)
    plain = max(usage.input_tokens - usage.cached_tokens - usage.cache_write_tokens, 0)
    return (plain * p.input + usage.cached_tokens * p.cached_input + usage.cache_write_tokens * p.cache_write
            + usage.output_tokens * p.output) / _M


def _get(obj: Any, key: str) -> Any:
    return obj.get(key) if isinstance(obj, Mapping) else getattr(obj, key, None)


def _n(value: Any) -> int:
    return int(value or 0)


def read_usage(response: Any) -> Usage | None:
    """Usage of an OpenAI (chat completion, Responses API) or Anthropic (message) response.

    Takes the SDK's objects or their dicts; None when the response carries no usage.
    """
    model = _get(response, "model")
    u = _get(response, "usage")
    if u is None or not model:
        return None
    if _get(u, "prompt_tokens") is not None:  # OpenAI chat completions
        details = _get(u, "prompt_tokens_details")
        cached = _n(_get(details, "cached_tokens")) if details is not None else 0
        return Usage(str(model), _n(_get(u, "prompt_tokens")), _n(_get(u, "completion_tokens")), cached)
    if _get(u, "cache_read_input_tokens") is not None or _get(response, "stop_reason") is not None:
        # Anthropic: input_tokens excludes cache reads and cache writes.
        read, write = _n(_get(u, "cache_read_input_tokens")), _n(_get(u, "cache_creation_input_tokens"))
        return Usage(str(model), _n(_get(u, "input_tokens")) + read + write, _n(_get(u, "output_tokens")), read, write)
    if _get(u, "input_tokens") is not None:  # OpenAI Responses API
        details = _get(u, "input_tokens_details")
        cached = _n(_get(details, "cached_tokens")) if details is not None else 0
        return Usage(str(model), _n(_get(u, "input_tokens")), _n(_get(u, "output_tokens")), cached)
    return None


def charge(usage: Usage, ctx: DurableContext | None = None) -> Decimal:
    """Charge ``usage`` to the run (inside a step, the step's record); returns the USD charged.

    Without ``ctx`` it must be called inside a step (it charges that step).
    """
    usd = cost(usage)
    if ctx is not None:
        ctx.add_cost(usd=usd, tokens=usage.tokens)
    elif not replay.charge_step(usd, usage.tokens):
        raise errors.WorkflowError(
            "durablerun.llm.charge() without ctx must be called inside a step (ctx.step); "
            "outside one pass ctx")
    tracing.model_call(model=usage.model, input_tokens=usage.input_tokens, output_tokens=usage.output_tokens,
                       cached_tokens=usage.cached_tokens, usd=usd)
    return usd


def charge_response(response: Any, ctx: DurableContext | None = None) -> Decimal:
    """Read the usage of an OpenAI or Anthropic response and charge it (see :func:`charge`)."""
    usage = read_usage(response)
    if usage is None:
        return Decimal(0)
    return charge(usage, ctx)


#: The calls of the SDKs' clients that return a response with usage.
_METERED_CALLS = {("chat", "completions", "create"), ("chat", "completions", "parse"),
                  ("beta", "chat", "completions", "parse"), ("responses", "create"), ("responses", "parse"),
                  ("messages", "create")}


class _Metered:
    def __init__(self, target: Any, path: tuple[str, ...], is_async: bool) -> None:
        self._target = target
        self._path = path
        self._async = is_async

    def __getattr__(self, name: str) -> Any:
        attr = getattr(self._target, name)
        path = (*self._path, name)
        if path in _METERED_CALLS:
            return _metered_call(attr, path, self._async)
        if any(call[:len(path)] == path for call in _METERED_CALLS):
            return _Metered(attr, path, self._async)
        return attr


def _metered_call(fn: Any, path: tuple[str, ...], is_async: bool) -> Any:
    def call(*args: Any, **kwargs: Any) -> Any:
        if not replay.in_step():
            # Refused before the call: outside a step it would be made (and paid for) again on every resume.
            raise errors.WorkflowError(
                "a metered client's calls must run inside a step (ctx.step): outside one the call is "
                "not journaled and runs again on every resume")
        model = kwargs.get("model")
        send = lambda: fn(*args, **kwargs)  # noqa: E731 - reads kwargs when called, stream_options included
        if not isinstance(model, str):
            return _charged_async(send) if is_async else _charged(send)
        price_for(model)  # an unpriced model fails before the call is paid for
        estimate = quota.estimate_tokens(kwargs)
        if kwargs.get("stream"):
            if path[:2] == ("chat", "completions"):  # OpenAI sends a stream's usage only when asked to
                kwargs["stream_options"] = {**(kwargs.get("stream_options") or {}), "include_usage": True}
            return _stream_async(model, estimate, send) if is_async else _stream(model, estimate, send)
        if is_async:
            return _charged_async(lambda: within_quota_async(model, estimate, send, _tokens_of))
        return _charged(lambda: within_quota(model, estimate, send, _tokens_of))
    return call


def _charged(send: Callable[[], Any]) -> Any:
    response = send()
    charge_response(response)
    return response


async def _charged_async(send: Callable[[], Awaitable[Any]]) -> Any:
    response = await send()
    charge_response(response)
    return response


def _tokens_of(response: Any) -> int | None:
    usage = read_usage(response)
    return usage.tokens if usage is not None else None


def within_quota(model: str, estimate: int, send: Callable[[], T], tokens_of: Callable[[T], int | None]) -> T:
    """``send()`` once its call to ``model`` (``estimate`` tokens) has its share of the model's quota (at once if
    no quota names it), the share settled with what ``tokens_of`` reads from the response (docs/agents.md,
    "Model quotas"). Called in a step; a wait longer than a step waits in process ends the attempt instead."""
    held = _hold(model, estimate)
    response = _sent(held, model, send)
    if held is not None:
        held.settle(tokens_of(response))
    return response


async def within_quota_async(model: str, estimate: int, send: Callable[[], Awaitable[T]],
                             tokens_of: Callable[[T], int | None]) -> T:
    """:func:`within_quota` for a coroutine: waits without blocking the event loop."""
    held = await hold_async(model, estimate)
    response = await _sent_async(held, model, send)
    if held is not None:
        held.settle(tokens_of(response))
    return response


def _hold(model: str, estimate: int) -> quota.Grant | None:
    """The call's share of its model's quota, once it has room (None: no quota names the model)."""
    limits = quota_setup.limiter()
    if limits is None or limits.quota_for(model) is None:
        return None
    return limits.take(model, estimate, on_first_wait=lambda wait: _throttle(limits, model, wait))


async def hold_async(model: str, estimate: int) -> quota.Grant | None:
    """:func:`_hold` for a coroutine; also for calls durable-run does not send itself (LangChain's, through a
    callback): settle the grant with the call's usage, or :func:`settle_refused` if it failed."""
    limits = quota_setup.limiter()
    if limits is None or limits.quota_for(model) is None:
        return None
    return await limits.take_async(model, estimate, on_first_wait=lambda wait: _throttle(limits, model, wait))


def _sent(held: quota.Grant | None, model: str, send: Callable[[], T]) -> T:
    try:
        return send()
    except BaseException as error:
        if held is not None:
            settle_refused(model, held, error)
        raise


async def _sent_async(held: quota.Grant | None, model: str, send: Callable[[], Awaitable[T]]) -> T:
    try:
        return await send()
    except BaseException as error:
        if held is not None:
            settle_refused(model, held, error)
        raise


class _StreamUsage:
    """The usage a stream reports as it goes: OpenAI's in its last chunk (chat completions) or its
    ``response.completed`` event (Responses API); Anthropic's input in ``message_start``, output in
    ``message_delta``. Settles the call's share and charges the step once, when the stream ends."""

    def __init__(self, held: quota.Grant | None) -> None:
        self.held = held
        self.usage: Usage | None = None
        self.ended = False

    def see(self, event: Any) -> None:
        kind = _get(event, "type")
        if kind == "message_start":
            self.usage = read_usage(_get(event, "message"))
        elif kind == "message_delta" and self.usage is not None:
            output = _n(_get(_get(event, "usage"), "output_tokens"))
            self.usage = dataclasses.replace(self.usage, output_tokens=output)
        elif kind == "response.completed":
            self.usage = read_usage(_get(event, "response"))
        elif _get(event, "usage") is not None:
            self.usage = read_usage(event) or self.usage

    def end(self) -> None:
        """The stream ended or was closed: an unread rest is charged its reservation in the window, and its cost
        (unknown) is not charged."""
        if self.ended:
            return
        self.ended = True
        if self.held is not None:
            self.held.settle(self.usage.tokens if self.usage is not None else None)
        if self.usage is not None:
            charge(self.usage)


class _MeteredStream:
    """A streamed response whose usage settles its call's share and charges its step when it ends."""

    def __init__(self, stream: Any, usage: _StreamUsage) -> None:
        self._stream = stream
        self._usage = usage

    def __iter__(self) -> Any:
        try:
            for event in self._stream:
                self._usage.see(event)
                yield event
        finally:
            self._usage.end()

    def __enter__(self) -> _MeteredStream:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        self._usage.end()
        self._stream.close()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._stream, name)


class _AsyncMeteredStream:
    def __init__(self, stream: Any, usage: _StreamUsage) -> None:
        self._stream = stream
        self._usage = usage

    async def __aiter__(self) -> Any:
        try:
            async for event in self._stream:
                self._usage.see(event)
                yield event
        finally:
            self._usage.end()

    async def __aenter__(self) -> _AsyncMeteredStream:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def close(self) -> None:
        self._usage.end()
        await self._stream.close()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._stream, name)


def _stream(model: str, estimate: int, send: Callable[[], Any]) -> _MeteredStream:
    held = _hold(model, estimate)
    return _MeteredStream(_sent(held, model, send), _StreamUsage(held))


async def _stream_async(model: str, estimate: int, send: Callable[[], Awaitable[Any]]) -> _AsyncMeteredStream:
    held = await hold_async(model, estimate)
    return _AsyncMeteredStream(await _sent_async(held, model, send), _StreamUsage(held))


def _throttle(limits: quota.Limiter, model: str, wait: float) -> None:
    """A call that found no room: it waits in its step, unless the wait is longer than a step waits out in
    process; then the run waits instead, with no process (engine/replay.throttled)."""
    named = limits.quota_for(model)
    halt = replay.throttled(named.name, wait) if named is not None else None
    if halt is not None:
        raise halt


def settle_refused(model: str, grant: quota.Grant, error: BaseException) -> None:
    """A call that failed: a provider's 429 used nothing and cools the model down for every call that shares
    its windows; any other failure keeps its reservation (what it used is unknown)."""
    wait = quota.retry_after(error)
    limits = quota_setup.limiter()
    if getattr(error, "status_code", None) == 429:
        grant.settle(0)
        if limits is not None:
            limits.refused(model, wait)
    else:
        grant.settle(None)


def metered(client: Any) -> Any:
    """An OpenAI or Anthropic client (sync or async) whose calls charge the step they run in.

    ``client.chat.completions.create``, ``client.responses.create`` and
    ``client.messages.create`` read the response's usage and charge it with
    ``ctx.add_cost``; everything else passes through. Call them inside steps. Under a model quota
    (``DURABLERUN_LLM_QUOTAS``, api.Env.LLM_QUOTAS: docs/agents.md, "Model quotas") each call first waits for its share.
    """
    # The SDKs' async clients close with a coroutine (AsyncOpenAI, AsyncAnthropic): their calls are awaited.
    is_async = inspect.iscoroutinefunction(getattr(client, "close", None))
    return _Metered(client, (), is_async)
