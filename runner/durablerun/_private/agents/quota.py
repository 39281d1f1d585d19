"""Model quotas: every metered call takes its share of its model's quota before it is sent.

A provider limits an organisation's tokens per minute, requests per minute and, in effect, concurrent calls,
per model. A quota says the same thing for a set of models (a pattern): a metered call reserves its estimated
tokens (the prompt's size plus the most it may answer) and one request before it is sent, waits if the
quota has no room, and settles the usage its response reports, so the window is charged what was really
used. A provider's 429 with ``Retry-After`` cools the model down: the next calls wait it out instead of
being rejected again.

Each limit is a bucket refilled continuously at its per-minute rate, holding at most a minute's worth: a
burst takes what a minute allows, then calls go at the rate. A call bigger than a whole minute's quota
waits for a full bucket and then goes, alone (it could never fit otherwise).

The windows the shares are taken from live in this process (LocalWindows: ``durablerun run`` on a laptop,
where an agent author tests throttling) or in a Redis every runner of a fleet shares (redis_windows). The
quotas come from ``DURABLERUN_LLM_QUOTAS`` (quota_setup): a JSON object, or the path of a file holding one::

    {"quotas": [{"name": "gpt-4o", "models": "gpt-4o*", "tokensPerMinute": 60000,
                 "requestsPerMinute": 500, "concurrent": 8}]}

A model no quota names is not limited. LocalWindows is pure logic with an injected clock: the tests drive
it without waiting.
"""

from __future__ import annotations

import asyncio
import fnmatch
import json
import logging
import math
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

from durablerun import api, errors

log = logging.getLogger("durablerun.quota")

#: Output tokens reserved for a call that names no maximum (settled to what it used).
DEFAULT_OUTPUT_TOKENS = 1024
#: Characters per token when estimating a prompt's size: English text's usual ratio, rounded down so the
#: estimate errs high (a settle gives back what was not used).
CHARS_PER_TOKEN = 4


#: A wait shorter than this is no wait: a float's rounding never leaves a call waiting for nothing.
_CLOSE_ENOUGH = 0.001
#: How soon a call refused for want of a free slot (``concurrent``) asks again: a slot frees when a call settles.
SLOT_POLL_SECONDS = 0.05


@dataclass(frozen=True)
class Quota:
    """Limits shared by every call to the models ``models`` (an fnmatch pattern) names."""

    name: str
    models: str
    tokens_per_minute: int | None = None
    requests_per_minute: int | None = None
    concurrent: int | None = None
    #: This runner's namespace's weight when runs of several namespaces wait for room (ModelQuota spec.weights).
    weight: int = 1

    @classmethod
    def from_json(cls, doc: Any, where: str) -> Quota:
        if not isinstance(doc, dict):
            raise errors.ConfigError(f"{where}: a quota is an object with name, models and limits")
        unknown = set(doc) - {"name", "models", "tokensPerMinute", "requestsPerMinute", "concurrent", "weight"}
        if unknown:
            raise errors.ConfigError(f"{where}: unknown field(s) {', '.join(sorted(unknown))}: a quota has name, "
                                     "models, tokensPerMinute, requestsPerMinute, concurrent and weight")
        for key in ("name", "models"):
            if not isinstance(doc.get(key), str) or not doc[key]:
                raise errors.ConfigError(f"{where}.{key}: required, a string (models: a pattern such as gpt-4o*)")
        limits = {}
        for key in ("tokensPerMinute", "requestsPerMinute", "concurrent", "weight"):
            value = doc.get(key)
            if value is not None and (not isinstance(value, int) or isinstance(value, bool) or value < 1):
                raise errors.ConfigError(f"{where}.{key}: {value!r} is not a whole number of at least 1 (leave it "
                                         "out for no limit)")
            limits[key] = value
        weight = limits.pop("weight") or 1
        if not any(limits.values()):
            raise errors.ConfigError(f"{where}: no limit: give tokensPerMinute, requestsPerMinute or concurrent")
        return cls(doc["name"], doc["models"], limits["tokensPerMinute"], limits["requestsPerMinute"],
                   limits["concurrent"], weight)


def parse_quotas(text: str) -> list[Quota]:
    """Quotas from ``DURABLERUN_LLM_QUOTAS``'s JSON."""
    try:
        doc = json.loads(text)
    except json.JSONDecodeError as e:
        raise errors.ConfigError(f"{api.Env.LLM_QUOTAS}: not JSON ({e}); give {{\"quotas\": [...]}} or a file's path") \
            from None
    if not isinstance(doc, dict) or not isinstance(doc.get("quotas"), list):
        raise errors.ConfigError(f'{api.Env.LLM_QUOTAS}: expected {{"quotas": [{{"name": ..., "models": ..., '
                                 '"tokensPerMinute": ...}}]}}')
    quotas = [Quota.from_json(q, f"{api.Env.LLM_QUOTAS}: quotas[{i}]") for i, q in enumerate(doc["quotas"])]
    names = [q.name for q in quotas]
    if len(set(names)) != len(names):
        raise errors.ConfigError(f"{api.Env.LLM_QUOTAS}: two quotas share a name: names must be unique")
    return quotas


class Bucket:
    """``per_minute`` units refilled continuously, at most a minute's worth held; it may go below zero when a
    call used more than it reserved (the debt delays the next calls)."""

    def __init__(self, per_minute: int, now: float) -> None:
        self.capacity = float(per_minute)
        self.rate = per_minute / 60.0
        self.level = float(per_minute)
        self.at = now

    def _refill(self, now: float) -> None:
        self.level = min(self.capacity, self.level + (now - self.at) * self.rate)
        self.at = max(self.at, now)

    def wait_for(self, amount: float, now: float) -> float:
        """Seconds until ``amount`` fits (a call bigger than the bucket waits for a full one)."""
        self._refill(now)
        short = min(amount, self.capacity) - self.level
        return 0.0 if short <= 0 else short / self.rate

    def take(self, amount: float, now: float) -> None:
        self._refill(now)
        self.level -= amount

    def give(self, amount: float, now: float) -> None:
        self._refill(now)
        self.level = min(self.capacity, self.level + amount)


class Windows(Protocol):
    """Where the quotas' windows live: this process (LocalWindows) or a Redis every runner shares
    (redis_windows.RedisWindows). A grant is named by an id its settle gives back."""

    def try_take(self, quota: Quota, tokens: int) -> str | float:
        """A grant's id if a call of ``tokens`` may go now (its share taken), else the seconds to wait."""

    def settle(self, quota: Quota, grant: str, reserved: int, used: int) -> None:
        """Free the grant's slot and charge the window ``used`` tokens in place of the ``reserved`` ones."""

    def refused(self, quota: Quota, seconds: float) -> None:
        """A provider refused a call of the quota (counted where it is shared): none goes for ``seconds``."""


@dataclass
class _State:
    tokens: Bucket | None
    requests: Bucket | None
    in_flight: int = 0
    cooldown_until: float = 0.0


class LocalWindows:
    """The windows of one process. Thread-safe: steps call models from worker threads and from the loop."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self.clock = clock
        self._lock = threading.Lock()
        self._states: dict[str, _State] = {}

    def _state(self, quota: Quota) -> _State:
        state = self._states.get(quota.name)
        if state is None:
            now = self.clock()
            state = self._states[quota.name] = _State(
                Bucket(quota.tokens_per_minute, now) if quota.tokens_per_minute else None,
                Bucket(quota.requests_per_minute, now) if quota.requests_per_minute else None)
        return state

    def try_take(self, quota: Quota, tokens: int) -> str | float:
        with self._lock:
            state, now = self._state(quota), self.clock()
            waits = [state.cooldown_until - now]
            if state.tokens is not None:
                waits.append(state.tokens.wait_for(tokens, now))
            if state.requests is not None:
                waits.append(state.requests.wait_for(1, now))
            wait = max(waits)
            if wait > _CLOSE_ENOUGH:
                return wait
            if quota.concurrent is not None and state.in_flight >= quota.concurrent:
                return SLOT_POLL_SECONDS
            if state.tokens is not None:
                state.tokens.take(tokens, now)
            if state.requests is not None:
                state.requests.take(1, now)
            state.in_flight += 1
            return quota.name

    def settle(self, quota: Quota, grant: str, reserved: int, used: int) -> None:
        with self._lock:
            state, now = self._state(quota), self.clock()
            state.in_flight -= 1
            if state.tokens is not None:
                if used < reserved:
                    state.tokens.give(reserved - used, now)
                else:
                    state.tokens.take(used - reserved, now)

    def refused(self, quota: Quota, seconds: float) -> None:
        with self._lock:
            state = self._state(quota)
            state.cooldown_until = max(state.cooldown_until, self.clock() + seconds)


@dataclass
class Grant:
    """A call's share, taken before it is sent: settle it with the usage its response reports (or with 0
    if it failed before using any), exactly once."""

    windows: Windows | None  # None: a model no quota names
    quota: Quota | None
    id: str
    reserved: int
    settled: bool = field(default=False)

    def settle(self, used_tokens: int | None) -> None:
        """Charge the window what the call used (its reservation if its usage is unknown) and free its slot."""
        if self.settled:
            return
        self.settled = True
        if self.windows is not None and self.quota is not None:
            self.windows.settle(self.quota, self.id, self.reserved,
                                self.reserved if used_tokens is None else used_tokens)


class Limiter:
    """The quotas, and the windows that hold their shares."""

    def __init__(self, quotas: list[Quota], *, clock: Callable[[], float] = time.monotonic,
                 windows: Windows | None = None) -> None:
        self.quotas = quotas
        self.windows: Windows = windows if windows is not None else LocalWindows(clock)

    def quota_for(self, model: str) -> Quota | None:
        """The quota of ``model``: the most specific pattern that matches it (the longest), or None."""
        matching = [q for q in self.quotas if fnmatch.fnmatchcase(model, q.models)]
        return max(matching, key=lambda q: len(q.models), default=None)

    def try_take(self, model: str, tokens: int) -> Grant | float:
        """The grant of a call of ``tokens`` estimated tokens to ``model`` if it may go now, else the seconds to
        wait before asking again (a model no quota names always gets a grant)."""
        quota = self.quota_for(model)
        if quota is None:
            return Grant(None, None, "", tokens)
        taken = self.windows.try_take(quota, tokens)
        return Grant(self.windows, quota, taken, tokens) if isinstance(taken, str) else taken

    def take(self, model: str, tokens: int, *, sleep: Callable[[float], None] = time.sleep,
             on_first_wait: Callable[[float], None] | None = None) -> Grant:
        """Wait (blocking this thread) until the call may go, and take its share. ``on_first_wait`` sees the
        first wait before it begins (and may raise instead)."""
        waiting = _Waiting(self, model, tokens, on_first_wait)
        while not isinstance(granted := self.try_take(model, tokens), Grant):
            sleep(waiting.pause(granted))
        return granted

    async def take_async(self, model: str, tokens: int, *,
                         on_first_wait: Callable[[float], None] | None = None) -> Grant:
        """:meth:`take` for a coroutine: waits without blocking the event loop (nor does asking: a shared
        window is a network call)."""
        waiting = _Waiting(self, model, tokens, on_first_wait)
        while True:
            granted = await asyncio.to_thread(self.try_take, model, tokens)
            if isinstance(granted, Grant):
                return granted
            await asyncio.sleep(waiting.pause(granted))

    def refused(self, model: str, retry_after: float | None) -> None:
        """The provider refused a call to ``model`` (a 429), counted in its quota; with a Retry-After, every call
        to the models of its quota waits until then."""
        quota = self.quota_for(model)
        if quota is None:
            return
        seconds = max(0.0, retry_after or 0.0)
        self.windows.refused(quota, seconds)
        if seconds:
            log.warning("quota %s: the provider refused a call to %s; its calls wait %.1fs (Retry-After)",
                        quota.name, model, seconds)


def next_ask(wait: float) -> float:
    """How long a call told to wait ``wait`` seconds sleeps before it asks again: halfway to the time (at least a
    second on), so a long wait costs a few asks rather than one a second, and room that comes early (a call that
    used less than it reserved) is still noticed well before the time."""
    return min(wait, max(1.0, wait / 2))


@dataclass
class _Waiting:
    """A call waiting for room: says so once, and asks again as :func:`next_ask` says."""

    limiter: Limiter
    model: str
    tokens: int
    on_first_wait: Callable[[float], None] | None = None
    said: bool = False

    def pause(self, wait: float) -> float:
        if not self.said:
            if self.on_first_wait is not None:
                self.on_first_wait(wait)
            quota = self.limiter.quota_for(self.model)
            log.info("quota %s: a call to %s (about %d tokens) waits %.1fs for room", quota.name if quota else "?",
                     self.model, self.tokens, wait)
            self.said = True
        return next_ask(wait)


def estimate_tokens(kwargs: Mapping[str, Any]) -> int:
    """A call's tokens before it is sent: its prompt's characters over CHARS_PER_TOKEN, plus the most it may
    answer (max_tokens and its aliases; DEFAULT_OUTPUT_TOKENS if it names none)."""
    prompt = sum(len(json.dumps(kwargs.get(key), default=str)) for key in ("messages", "input", "system",
                                                                               "instructions", "tools")
                 if kwargs.get(key) is not None)
    answer = next((kwargs[k] for k in ("max_tokens", "max_completion_tokens", "max_output_tokens")
                   if isinstance(kwargs.get(k), int)), DEFAULT_OUTPUT_TOKENS)
    return math.ceil(prompt / CHARS_PER_TOKEN) + int(answer)


def retry_after(error: BaseException) -> float | None:
    """The seconds a provider's 429 says to wait (``Retry-After`` or ``retry-after-ms``), or None: not a 429,
    or one that says nothing."""
    if getattr(error, "status_code", None) != 429:
        return None
    headers = getattr(getattr(error, "response", None), "headers", None) or {}
    try:
        if headers.get("retry-after-ms") is not None:
            return float(headers["retry-after-ms"]) / 1000
        if headers.get("retry-after") is not None:
            return float(headers["retry-after"])
    except (TypeError, ValueError):
        return None
    return None
