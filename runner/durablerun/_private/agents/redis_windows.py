"""Quota windows every runner shares, in Redis (or Valkey): the fleet's calls take their shares from one place.

Each quota is a hash (its token and request buckets and its cooldown) and a sorted set (the grants in flight,
scored by when each expires), both under the quota's name in a hash tag, so that a Redis Cluster keeps them on
one node. Every change is one server-side script, atomic in Redis, and the scripts read Redis's own clock
(``TIME``), never the pods': runners whose clocks disagree still share one window. The buckets are the ones
``quota.Bucket`` keeps in a process: refilled continuously at the per-minute rate, holding at most a minute's
worth.

A grant in flight expires after ``SLOT_SECONDS``: the slot of a runner killed before it settled (SIGKILL, a
node lost) comes back by itself; its reservation stays charged, which is what such a call most likely used.

When Redis cannot be reached, ``DURABLERUN_LLM_QUOTA_UNAVAILABLE`` decides: ``wait`` (the default: the call
waits and asks again, so that no quota is overrun; the step in flight is not lost, it only waits) or
``proceed`` (the call goes unlimited). Either says so in the runner's log, once per outage.
"""

from __future__ import annotations

import contextlib
import logging
import os
import threading
import uuid
from typing import Any
from urllib.parse import urlsplit

from durablerun import api, errors, quotas
from durablerun._private.agents.quota import SLOT_POLL_SECONDS, Quota

log = logging.getLogger("durablerun.quota")

#: Seconds a grant holds its slot of ``concurrent`` unless settled first: longer than any model call.
SLOT_SECONDS = 600
#: Seconds a call waits before asking again while Redis cannot be reached (``wait``).
UNAVAILABLE_RETRY_SECONDS = 1.0
#: A quota's keys outlive their last use by this long, then Redis drops them (a full window again).
IDLE_SECONDS = 3600
WAIT, PROCEED = "wait", "proceed"
#: A place in line not claimed this long after its turn is dropped: its run is gone. Longer than a yielded run
#: takes to start its next pod at its wake time (which is late by up to a tenth of its wait).
STALE_SECONDS = 300
#: A place whose turn came this long ago no longer goes before the places behind it: longer than a yielded run's
#: next pod takes to start and ask.
GRACE_SECONDS = 10

# KEYS: state hash, in-flight set, places in line (a sorted set: each holder scored by when its turn comes),
# tenants (a hash: next:<tenant> and next<priority>:<tenant>, when the tenant's last place in the line of that
# priority comes; w:<tenant>, its weight), asking (a sorted set: each holder waiting for a grant, scored by when
# it first asked), urgent (a hash: the priority of each place in line above 0).
# ARGV: tokensPerMinute, requestsPerMinute, concurrent (0: no limit), tokens, grant id, slot seconds, poll
# seconds, idle seconds, tenant, weight, holder, priority. Returns {1, ""} granted, or {0, seconds to wait};
# numbers as strings (Redis truncates a script's numbers to integers).
#
# A line, not a scramble. A call that cannot go now, or finds others in line, takes a place: the time its
# turn comes. Each tenant (namespace) has a line of its own that moves at its weight's share of the window
# (tokensPerMinute x its weight / the weights of the tenants in line), so under contention each tenant gets
# its weight's share, and a tenant alone gets everything. The place is kept under the holder's name (its run,
# ns/name), so a run that yields (a wait longer than a step waits in its pod) finds it again when its next pod
# asks at the due time; a place not claimed STALE_SECONDS after its turn is dropped (its run is gone). Places
# go in the order of their turns; the first in line may go before its turn if the window has room.
#
# Priority first. A call of an urgent run (its priority above 0) waits only behind places of its priority or
# above, in lines of their own, and while such places wait (their turn not more than GRACE_SECONDS gone) no call
# of a lower priority goes: the window's room goes to the most urgent first, and the lower lines slip by what
# it took.
_TAKE = quotas.LUA_LEVEL + """
local t = now()
local tpm, rpm, concurrent, tokens = tonumber(ARGV[1]), tonumber(ARGV[2]), tonumber(ARGV[3]), tonumber(ARGV[4])
local tenant, weight, idle, holder = ARGV[9], tonumber(ARGV[10]), ARGV[8], ARGV[11]
local priority = tonumber(ARGV[12])
local function expire() for _, key in ipairs(KEYS) do redis.call('EXPIRE', key, idle) end end
-- Not now: the holder's first ask is kept, so that its grant counts how long it waited (across its run's pods).
local function no(wait)
  redis.call('ZADD', KEYS[5], 'NX', t, holder)
  redis.call('EXPIRE', KEYS[5], idle)
  return {0, tostring(wait)}
end
redis.call('ZREMRANGEBYSCORE', KEYS[2], '-inf', t)
redis.call('ZREMRANGEBYSCORE', KEYS[3], '-inf', t - STALE_SECONDS)
redis.call('ZREMRANGEBYSCORE', KEYS[5], '-inf', t - ASKING_FORGOTTEN_SECONDS)
-- The urgent places still in line (few: most runs have priority 0), and the highest priority waiting.
local urgent, top = {}, 0
local held = redis.call('HGETALL', KEYS[6])
for i = 1, #held, 2 do
  local at = tonumber(redis.call('ZSCORE', KEYS[3], held[i]))
  if at then
    local p = tonumber(held[i + 1])
    urgent[#urgent + 1] = {held[i], p, at}
    if p > top and at >= t - GRACE_SECONDS then top = p end
  else
    redis.call('HDEL', KEYS[6], held[i])
  end
end
-- The earliest place of this call's priority or above (and its turn), from ``after`` on (nil: any), or nil.
local function earliest(after)
  if priority == 0 then
    local r = redis.call('ZRANGEBYSCORE', KEYS[3], after and tostring(after) or '-inf', '+inf', 'WITHSCORES',
                         'LIMIT', 0, 1)
    if r[1] then return r[1], tonumber(r[2]) end
    return nil
  end
  local first, turn
  for _, u in ipairs(urgent) do
    if u[2] >= priority and (not after or u[3] >= after) and (not turn or u[3] < turn) then first, turn = u[1], u[3] end
  end
  return first, turn
end
local s = redis.call('HMGET', KEYS[1], 'tokens', 'tokensAt', 'requests', 'requestsAt', 'cooldownUntil')
local cooldown = tonumber(s[5]) or 0
local wait = cooldown - t
local tl, rl
if tpm > 0 then
  tl = level(s[1], s[2], tpm, t)
  local short = math.min(tokens, tpm) - tl
  if short > 0 then wait = math.max(wait, short * 60 / tpm) end
end
if rpm > 0 then
  rl = level(s[3], s[4], rpm, t)
  if rl < 1 then wait = math.max(wait, (1 - rl) * 60 / rpm) end
end
local place = tonumber(redis.call('ZSCORE', KEYS[3], holder))
if place then
  local first = earliest() == holder
  if t < place - 0.001 and not first then return no(place - t) end
  if wait > 0.001 then return no(wait) end
  -- Places whose turn came just before this one's go first; one late by more than GRACE_SECONDS (its run is
  -- slow to come back, or gone) no longer holds the others up.
  -- (Scores compared as numbers here: Lua's tostring keeps 14 digits, and a place would find itself ahead.)
  if not first then
    local ahead, turn = earliest(t - GRACE_SECONDS)
    if ahead and ahead ~= holder and turn < place then return no(ARGV[7]) end
  end
elseif tpm > 0 and (wait > 0.001 or earliest()) then
  -- Take a place in the tenant's line of this priority, which moves at the tenant's share of the window.
  local mark = (priority == 0 and 'next:' or 'next' .. priority .. ':')
  local weights, mine = 0, tonumber(redis.call('HGET', KEYS[4], mark .. tenant)) or 0
  local fields = redis.call('HGETALL', KEYS[4])
  for i = 1, #fields, 2 do
    local name = fields[i]
    if string.sub(name, 1, #mark) == mark and tonumber(fields[i + 1]) > t and name ~= mark .. tenant then
      weights = weights + (tonumber(redis.call('HGET', KEYS[4], 'w:' .. string.sub(name, #mark + 1))) or 1)
    end
  end
  local share = tpm / 60 * weight / (weights + weight)
  local due
  if not earliest() then due = t + wait else due = math.max(t, mine) + tokens / share end
  due = math.max(due, cooldown)
  redis.call('ZADD', KEYS[3], due, holder)
  if priority > 0 then redis.call('HSET', KEYS[6], holder, priority) end
  redis.call('HSET', KEYS[4], mark .. tenant, tostring(due), 'w:' .. tenant, weight)
  expire()
  return no(due - t)
elseif wait > 0.001 then
  return no(wait)
end
if priority < top then
  -- More urgent calls wait for this room: ask again when the first of them is due (at least a second on).
  local turn
  for _, u in ipairs(urgent) do if u[2] > priority and (not turn or u[3] < turn) then turn = u[3] end end
  return no(math.max(1, turn - t))
end
if concurrent > 0 and redis.call('ZCARD', KEYS[2]) >= concurrent then return no(ARGV[7]) end
if tpm > 0 then redis.call('HSET', KEYS[1], 'tokens', tostring(tl - tokens), 'tokensAt', tostring(t)) end
if rpm > 0 then redis.call('HSET', KEYS[1], 'requests', tostring(rl - 1), 'requestsAt', tostring(t)) end
redis.call('ZADD', KEYS[2], t + tonumber(ARGV[6]), ARGV[5])
redis.call('ZREM', KEYS[3], holder)
redis.call('HDEL', KEYS[6], holder)
local since = tonumber(redis.call('ZSCORE', KEYS[5], holder))
local waited = since and math.max(0, t - since) or 0
redis.call('ZREM', KEYS[5], holder)
local bucket = #WAIT_BUCKETS + 1
for i, bound in ipairs(WAIT_BUCKETS) do if waited <= bound then bucket = i break end end
redis.call('HINCRBY', KEYS[1], 'wait' .. bucket, 1)
redis.call('HINCRBYFLOAT', KEYS[1], 'waitSum', tostring(waited))
expire()
return {1, ""}
""".replace("STALE_SECONDS", str(STALE_SECONDS)).replace("GRACE_SECONDS", str(GRACE_SECONDS)).replace(
    "ASKING_FORGOTTEN_SECONDS", str(quotas.ASKING_FORGOTTEN_SECONDS)).replace(
    "#WAIT_BUCKETS", str(len(quotas.WAIT_BUCKETS))).replace(
    "ipairs(WAIT_BUCKETS)", "ipairs({" + ", ".join(str(b) for b in quotas.WAIT_BUCKETS) + "})")

# KEYS: state hash, in-flight set. ARGV: tokensPerMinute, grant id, reserved, used.
_SETTLE = quotas.LUA_LEVEL + """
redis.call('ZREM', KEYS[2], ARGV[2])
local tpm, reserved, used = tonumber(ARGV[1]), tonumber(ARGV[3]), tonumber(ARGV[4])
if tpm > 0 and used ~= reserved then
  local t = now()
  local s = redis.call('HMGET', KEYS[1], 'tokens', 'tokensAt')
  local tl = math.min(tpm, level(s[1], s[2], tpm, t) + reserved - used)
  redis.call('HSET', KEYS[1], 'tokens', tostring(tl), 'tokensAt', tostring(t))
end
return 1
"""

# KEYS: state hash. ARGV: seconds (0: the provider said no Retry-After), idle seconds.
_REFUSED = quotas.LUA_LEVEL + """
redis.call('HINCRBY', KEYS[1], 'rejected', 1)
local ends = now() + tonumber(ARGV[1])
local current = tonumber(redis.call('HGET', KEYS[1], 'cooldownUntil')) or 0
if tonumber(ARGV[1]) > 0 and ends > current then redis.call('HSET', KEYS[1], 'cooldownUntil', tostring(ends)) end
redis.call('EXPIRE', KEYS[1], ARGV[2])
return 1
"""


class RedisRefusedError(errors.ConfigError, errors.NonRetryableError):
    """Redis refused the password: a setting to fix, not an outage to wait out (the step fails at once)."""


def _keys(quota: Quota) -> list[str]:
    return list(quotas.window_keys(quota.name))


class RedisWindows:
    """quota.Windows in a Redis every runner shares."""

    def __init__(self, url: str, *, password: str | None = None, unavailable: str = WAIT,
                 slot_seconds: float = SLOT_SECONDS, tenant: str = api.LOCAL_NAMESPACE,
                 holder: str | None = None, priority: int = 0) -> None:
        """``tenant``: whose share this process's calls take when tenants contend (its run's namespace);
        ``holder``: whose place in line its calls keep (its run, the same in each of its pods); ``priority``:
        its run's (spec.policy.quotaPriority): calls of a higher one go first."""
        try:
            import redis
        except ImportError:
            raise errors.ConfigError(f"{api.Env.LLM_QUOTA_REDIS} is set, but the redis package is not installed: "
                                     "pip install 'durable-run[quotas]'") from None
        if unavailable not in (WAIT, PROCEED):
            raise errors.ConfigError(f"{api.Env.LLM_QUOTA_UNAVAILABLE}: {unavailable!r} is neither {WAIT!r} nor "
                                     f"{PROCEED!r}")
        parts = urlsplit(url)
        if parts.scheme not in ("redis", "rediss", "unix"):
            raise errors.ConfigError(f"{api.Env.LLM_QUOTA_REDIS}: give a redis://host:port (rediss:// for TLS, "
                                     "unix:///path) URL, not " + (parts.scheme or "a bare host"))
        self.where = quotas.redis_host(url)
        self.unavailable = unavailable
        self.slot_seconds = slot_seconds
        self.tenant = tenant
        self.holder = holder or f"{tenant}/{uuid.uuid4().hex}"
        self.priority = priority
        self._errors = (redis.ConnectionError, redis.TimeoutError)
        self._bad_credentials = redis.AuthenticationError  # a ConnectionError too: told apart first
        self._client = redis.Redis.from_url(url, password=password or None, socket_timeout=2.0,
                                            socket_connect_timeout=2.0)
        self._take = self._client.register_script(_TAKE)
        self._settle = self._client.register_script(_SETTLE)
        self._refused_script = self._client.register_script(_REFUSED)
        self._down = threading.Event()  # said once per outage

    def _call(self, script: Any, keys: list[str], args: list[Any]) -> Any:
        try:
            result = script(keys=keys, args=args)
        except self._bad_credentials as error:
            raise RedisRefusedError(f"the Redis of {api.Env.LLM_QUOTA_REDIS} at {self.where} refused its "
                                    f"credentials ({error}): check {api.Env.LLM_QUOTA_REDIS_PASSWORD}") from None
        except self._errors as error:
            if not self._down.is_set():
                self._down.set()
                log.warning("quota windows at %s cannot be reached (%s): calls %s until it is back", self.where,
                            type(error).__name__, "wait" if self.unavailable == WAIT else "go unlimited")
            raise
        if self._down.is_set():
            self._down.clear()
            log.warning("quota windows at %s reached again", self.where)
        return result

    def try_take(self, quota: Quota, tokens: int) -> str | float:
        grant = uuid.uuid4().hex
        try:
            granted, wait = self._call(self._take, _keys(quota), [
                quota.tokens_per_minute or 0, quota.requests_per_minute or 0, quota.concurrent or 0, tokens, grant,
                self.slot_seconds, SLOT_POLL_SECONDS, IDLE_SECONDS, self.tenant, quota.weight, self.holder,
                self.priority])
        except self._errors:
            return "" if self.unavailable == PROCEED else UNAVAILABLE_RETRY_SECONDS
        return grant if granted == 1 else float(wait)

    def settle(self, quota: Quota, grant: str, reserved: int, used: int) -> None:
        if not grant:
            return  # granted while Redis was down (proceed): nothing was taken
        with contextlib.suppress(*self._errors):  # the slot expires by itself; the reservation stays charged
            self._call(self._settle, _keys(quota), [quota.tokens_per_minute or 0, grant, reserved, used])

    def refused(self, quota: Quota, seconds: float) -> None:
        with contextlib.suppress(*self._errors):  # each runner that is refused again waits again
            self._call(self._refused_script, _keys(quota)[:1], [seconds, IDLE_SECONDS])


def from_environment() -> RedisWindows | None:
    """The shared windows ``DURABLERUN_LLM_QUOTA_REDIS`` names, or None (each process keeps its own)."""
    url = os.environ.get(api.Env.LLM_QUOTA_REDIS)
    if not url:
        return None
    return RedisWindows(url, password=os.environ.get(api.Env.LLM_QUOTA_REDIS_PASSWORD),
                        unavailable=os.environ.get(api.Env.LLM_QUOTA_UNAVAILABLE) or WAIT,
                        tenant=os.environ.get(api.Env.NAMESPACE) or api.LOCAL_NAMESPACE,
                        holder=_run() or None, priority=_priority())


def _run() -> str:
    """The run this process serves (namespace/name, from the operator's environment), or ""."""
    namespace, name = os.environ.get(api.Env.NAMESPACE), os.environ.get(api.Env.NAME)
    return f"{namespace}/{name}" if namespace and name else ""


def _priority() -> int:
    """This run's priority in the quotas' lines (``DURABLERUN_LLM_QUOTA_PRIORITY``, from spec.policy.quotaPriority)."""
    value = os.environ.get(api.Env.LLM_QUOTA_PRIORITY) or "0"
    try:
        priority = int(value)
    except ValueError:
        priority = -1
    if not 0 <= priority <= api.QUOTA_PRIORITY_MAX:
        raise errors.ConfigError(f"{api.Env.LLM_QUOTA_PRIORITY}: {value!r} is not a whole number from 0 to "
                                 f"{api.QUOTA_PRIORITY_MAX} (0, the default: no priority)")
    return priority
