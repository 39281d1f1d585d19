"""The ModelQuota custom resource: limits on model calls that every run of a fleet shares.

A ModelQuota is cluster-scoped, as a provider's limits are an organisation's: it names the models it limits
(a pattern), tokens and requests per minute and concurrent calls, the namespaces whose runs it covers, and
each namespace's weight when they contend for it. The operator hands each runner pod the quotas that cover its
namespace, as the JSON of ``DURABLERUN_LLM_QUOTAS`` (:func:`runner_quota`), and the runners take their shares
from windows in one Redis (``durablerun._private.agents.redis_windows``; the keys are :func:`window_keys`). The
operator reads the windows back into each quota's status, which ``kubectl get modelquotas`` shows.

This module is the one definition of a quota's fields: the CRD is generated from its models
(``durablerun_operator.crd``), and a runner reads the JSON with them, so a quota a runner gets is one the API
server accepted. It imports only ``durablerun.api``.
"""

from __future__ import annotations

import fnmatch
from typing import Annotated, Any
from urllib.parse import urlsplit

from pydantic import Field

from durablerun.api import _Model

#: A namespace's weight when none is given.
DEFAULT_WEIGHT = 1
_NAMESPACE_PATTERN = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$"
#: Bounds that keep the object, and its CEL rule's cost, small.
NAMESPACES_MAX = 256


class ModelQuotaSpec(_Model):
    """Limits shared by every metered model call of the runs it covers: each call takes its estimated tokens and
    one request before it is sent, waits (with no pod, past a threshold) while there is no room, and gives back
    what its response says it did not use."""

    models: str = Field(
        min_length=1, max_length=253,
        description="The models it limits: a pattern (fnmatch: * and ?) matched against the model a call names, "
                    "such as gpt-4o* or claude-sonnet-4*. A call whose model several quotas match takes its share "
                    "of the one with the longest pattern.")
    tokensPerMinute: int | None = Field(
        default=None, ge=1,
        description="Tokens per minute (prompt and answer), as the provider's TPM limit: a continuously refilled "
                    "window holding at most a minute's worth.")
    requestsPerMinute: int | None = Field(default=None, ge=1, description="Requests per minute (the provider's RPM).")
    concurrent: int | None = Field(default=None, ge=1, description="Calls in flight at once.")
    namespaces: list[Annotated[str, Field(pattern=_NAMESPACE_PATTERN, max_length=63)]] = Field(
        default_factory=list, max_length=NAMESPACES_MAX,
        description="The namespaces whose runs it covers; empty: every namespace.",
        json_schema_extra={"x-kubernetes-list-type": "set"})
    weights: dict[str, Annotated[int, Field(ge=1, le=1000)]] = Field(
        default_factory=dict,
        description="Each namespace's share when runs of several namespaces wait for room: a namespace of weight "
                    "2 gets twice the tokens of one of weight 1. A namespace not named has weight 1.",
        json_schema_extra={"maxProperties": NAMESPACES_MAX})

    def covers(self, namespace: str) -> bool:
        """Whether the runs of ``namespace`` take their shares of this quota."""
        return not self.namespaces or namespace in self.namespaces

    def matches(self, model: str) -> bool:
        return fnmatch.fnmatchcase(model, self.models)

    def weight(self, namespace: str) -> int:
        return self.weights.get(namespace, DEFAULT_WEIGHT)


#: The CEL rule on the spec, and what it tells the user.
LIMIT_RULE = "has(self.tokensPerMinute) || has(self.requestsPerMinute) || has(self.concurrent)"
LIMIT_MISSING = "a quota limits something: give tokensPerMinute, requestsPerMinute or concurrent"


class ModelQuotaStatus(_Model):
    """What the quota's windows hold now, as the operator last read them from the runners' shared Redis."""

    tokensUsed: int | None = Field(default=None, description="Tokens taken in the last minute's window.")
    requestsUsed: int | None = Field(default=None, description="Requests taken in the last minute's window.")
    inFlight: int | None = Field(default=None, description="Calls granted and not yet settled.")
    runsWaiting: int | None = Field(
        default=None, description="Runs Waiting, with no pod, for room in this quota (status.waitingFor.quota).")
    coolingDownUntil: str | None = Field(
        default=None, description="A provider refused a call (429): no call goes until then.")
    tokens: str | None = Field(default=None, description='Tokens used of the limit, for people: "41200/60000".')
    requests: str | None = Field(default=None, description='Requests used of the limit, for people: "12/500".')
    observedTime: str | None = Field(default=None, description="When the operator read the windows.")
    message: str | None = Field(
        default=None, description="Why the windows could not be read (no shared Redis, or it cannot be reached).")


def runner_quota(name: str, spec: ModelQuotaSpec, namespace: str) -> dict[str, Any]:
    """The quota as a runner of ``namespace`` reads it in ``DURABLERUN_LLM_QUOTAS``'s ``quotas`` list."""
    doc: dict[str, Any] = {"name": name, "models": spec.models}
    for key in ("tokensPerMinute", "requestsPerMinute", "concurrent"):
        if getattr(spec, key) is not None:
            doc[key] = getattr(spec, key)
    doc["weight"] = spec.weight(namespace)
    return doc


def redis_host(url: str) -> str:
    """Where the windows' Redis is, for a message or a log: its host (or socket path), never the URL, which may
    carry a password."""
    parts = urlsplit(url)
    return parts.hostname or parts.path or "?"


# --- the windows in Redis: written by the runners (durablerun._private.agents.redis_windows), read by the operator

def window_keys(name: str) -> tuple[str, str, str, str, str, str]:
    """The Redis keys of quota ``name``'s windows: a hash (its buckets, its cooldown and its counts: see
    :data:`PEEK_SCRIPT`), a sorted set (the grants in flight, scored by when each expires), the line of calls
    waiting for room (a sorted set of places, each scored by when its turn comes, and a hash of each tenant's line
    and weight), a sorted set of holders waiting for a grant, scored by when they first asked, and a hash of the
    priority of each urgent place in line. They share a hash tag, so that a Redis Cluster keeps them on one
    node."""
    tag = "{durablerun:quota:" + name + "}"
    return tag + ":window", tag + ":in-flight", tag + ":waiting", tag + ":tenants", tag + ":asking", tag + ":urgent"


#: Upper bounds (seconds) of the buckets that count grants by how long their call waited for them, from its
#: first ask to its grant, across the run's pods when it yielded (durablerun_quota_grant_wait_seconds).
WAIT_BUCKETS = (0.1, 1.0, 10.0, 60.0, 300.0, 1800.0, 7200.0)
#: A first ask older than this is dropped unanswered (its run is gone); a grant after it counts as no wait.
ASKING_FORGOTTEN_SECONDS = 86400


#: Lua both sides' scripts start with: a bucket's level refilled to ``now`` (the hash's fields ``tokens`` and
#: ``tokensAt``, ``requests`` and ``requestsAt``; a missing field is a full bucket), and Redis's own clock.
LUA_LEVEL = """
local function level(value, at, per_minute, now)
  if not value then return per_minute end
  return math.min(per_minute, tonumber(value) + math.max(0, now - tonumber(at)) * per_minute / 60)
end
local function now()
  local t = redis.call('TIME')
  return tonumber(t[1]) + tonumber(t[2]) / 1000000
end
"""

#: The window hash's counts, kept since the quota's keys were last idle (IDLE_SECONDS of the runners' module):
#: ``rejected`` (calls a provider refused with a 429), ``waitSum`` (seconds grants waited) and ``wait<i>``
#: (grants whose wait fell in WAIT_BUCKETS' bucket i, 1-based; i = len + 1 past the last bound).
WAIT_FIELDS = tuple(f"wait{i}" for i in range(1, len(WAIT_BUCKETS) + 2))

# KEYS: window hash, in-flight set. ARGV: tokensPerMinute, requestsPerMinute (0: no limit). Returns tokens and
# requests used in the window, grants in flight, seconds of cooldown left, calls refused by a provider, seconds
# grants waited, then the grants per wait bucket (numbers as strings: Redis truncates a script's numbers to
# integers).
PEEK_SCRIPT = LUA_LEVEL + """
local t = now()
local tpm, rpm = tonumber(ARGV[1]), tonumber(ARGV[2])
local s = redis.call('HMGET', KEYS[1], 'tokens', 'tokensAt', 'requests', 'requestsAt', 'cooldownUntil', 'rejected',
                     'waitSum', WAIT_FIELDS)
local tokens, requests = 0, 0
if tpm > 0 then tokens = tpm - level(s[1], s[2], tpm, t) end
if rpm > 0 then requests = rpm - level(s[3], s[4], rpm, t) end
local out = {tostring(tokens), tostring(requests), redis.call('ZCOUNT', KEYS[2], t, '+inf'),
             tostring(math.max(0, (tonumber(s[5]) or 0) - t)), s[6] or '0', s[7] or '0'}
for i = 8, #s do out[#out + 1] = s[i] or '0' end
return out
""".replace("WAIT_FIELDS", ", ".join(f"'{f}'" for f in WAIT_FIELDS))
