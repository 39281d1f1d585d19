"""ModelQuotas (durablerun.quotas): handed to the runner pods of the namespaces each covers, and read back.

The operator watches the quotas (``Index``, fed by the handler in ``handlers``) and adds to every runner pod it
starts the quotas that cover the pod's namespace, with the shared Redis's address (``runner_env``); the runner's
limiter does the rest. Every ``STATUS_SECONDS`` it reads each quota's windows from that Redis into the quota's
status and its metrics (``StatusWriter``): what ``kubectl get modelquotas`` and the dashboard show.
"""

from __future__ import annotations

import asyncio
import json
import logging
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

import pydantic

from durablerun import api, quotas
from durablerun_operator.config import Settings

log = logging.getLogger("durablerun.operator.quotas")

#: How often the windows are read back into the quotas' status and metrics.
STATUS_SECONDS = 10.0
#: A status that did not change is written again after this long anyway (its observedTime says it is fresh).
STATUS_REFRESH_SECONDS = 60.0


class Index:
    """The ModelQuotas as last watched."""

    def __init__(self) -> None:
        self._specs: dict[str, quotas.ModelQuotaSpec] = {}
        self.uids: dict[str, str] = {}

    def changed(self, name: str, body: dict[str, Any] | None) -> None:
        """Quota ``name`` was written (``body``) or deleted (None)."""
        if body is None:
            self._specs.pop(name, None)
            self.uids.pop(name, None)
            return
        try:
            self._specs[name] = quotas.ModelQuotaSpec.model_validate(body.get("spec") or {})
            self.uids[name] = str((body.get("metadata") or {}).get("uid", ""))
        except pydantic.ValidationError as error:  # the CRD refuses this; an older CRD might not
            log.warning("ModelQuota %s is ignored, its spec is not valid: %s", name, error)
            self._specs.pop(name, None)

    def get(self, name: str) -> quotas.ModelQuotaSpec | None:
        return self._specs.get(name)

    def items(self) -> list[tuple[str, quotas.ModelQuotaSpec]]:
        return sorted(self._specs.items())

    def covering(self, namespace: str) -> list[tuple[str, quotas.ModelQuotaSpec]]:
        return [(name, spec) for name, spec in self.items() if spec.covers(namespace)]


def runner_env(index: Index, namespace: str, settings: Settings, named: set[str]) -> list[dict[str, Any]]:
    """The environment that gives a runner pod of ``namespace`` its quotas and the shared windows; nothing for a
    variable the pod's template sets itself (``named``: a run may bring its own quotas)."""
    covering = index.covering(namespace)
    if not settings.model_quotas or not covering:
        return []
    doc = {"quotas": [quotas.runner_quota(name, spec, namespace) for name, spec in covering]}
    env: list[dict[str, Any]] = [
        {"name": api.Env.LLM_QUOTAS, "value": json.dumps(doc, separators=(",", ":"))},
        {"name": api.Env.LLM_QUOTA_REDIS, "value": settings.quota_redis},
        # The kubelet reads the Secret, in the pod's own namespace; the operator never does.
        {"name": api.Env.LLM_QUOTA_REDIS_PASSWORD, "valueFrom": {"secretKeyRef": {
            "name": api.QUOTA_REDIS_SECRET, "key": api.QUOTA_REDIS_SECRET_KEY, "optional": True}}},
    ]
    if settings.quota_unavailable:
        env.append({"name": api.Env.LLM_QUOTA_UNAVAILABLE, "value": settings.quota_unavailable})
    return [e for e in env if e["name"] not in named]


@dataclass(frozen=True)
class Reading:
    """One quota's windows as read from Redis."""

    tokens_used: float
    requests_used: float
    in_flight: int
    cooldown_seconds: float
    #: Calls a provider refused (429), and grants by how long they waited (quotas.WAIT_BUCKETS, one count past
    #: the last bound) with the seconds they waited in all: counts since the windows were last idle.
    rejected: int = 0
    waits: tuple[int, ...] = ()
    wait_seconds: float = 0.0


class Windows:
    """The runners' shared windows, read (never written) by the operator."""

    def __init__(self, url: str, password: str) -> None:
        import redis

        self.errors: tuple[type[Exception], ...] = (redis.RedisError, OSError)
        self._client = redis.Redis.from_url(url, password=password or None, socket_timeout=2.0,
                                            socket_connect_timeout=2.0)
        self._peek = self._client.register_script(quotas.PEEK_SCRIPT)

    def read(self, name: str, spec: quotas.ModelQuotaSpec) -> Reading:
        tokens, requests, in_flight, cooldown, rejected, wait_seconds, *waits = self._peek(
            keys=list(quotas.window_keys(name)[:2]), args=[spec.tokensPerMinute or 0, spec.requestsPerMinute or 0])
        return Reading(float(tokens), float(requests), int(in_flight), float(cooldown), int(rejected),
                       tuple(int(w) for w in waits), float(wait_seconds))


def status(spec: quotas.ModelQuotaSpec, reading: Reading | None, runs_waiting: int | None, now: Any,
           error: str | None = None) -> dict[str, Any]:
    """A quota's status from one reading of its windows (None: they could not be read, ``error`` says why)."""
    out = quotas.ModelQuotaStatus(runsWaiting=runs_waiting, observedTime=api.format_time(now), message=error)
    if reading is not None:
        out.inFlight = reading.in_flight
        if spec.tokensPerMinute:
            out.tokensUsed = round(reading.tokens_used)
            out.tokens = f"{out.tokensUsed}/{spec.tokensPerMinute}"
        if spec.requestsPerMinute:
            out.requestsUsed = round(reading.requests_used)
            out.requests = f"{out.requestsUsed}/{spec.requestsPerMinute}"
        if reading.cooldown_seconds > 0:
            out.coolingDownUntil = api.format_time(now + timedelta(seconds=reading.cooldown_seconds))
    # Every field, None included: a merge patch with null removes what an earlier reading set.
    return out.model_dump(mode="json")


class StatusWriter:
    """Reads every quota's windows into its status and metrics, every STATUS_SECONDS."""

    def __init__(self, index: Index, kube: Any, settings: Settings, metrics: Any, owns: Any,
                 windows: Windows | None = None) -> None:
        """``owns(name)``: whether this replica writes quota ``name``'s status (one replica per quota)."""
        self._index, self._kube, self._settings, self._metrics, self._owns = index, kube, settings, metrics, owns
        self._windows = windows or Windows(settings.quota_redis, settings.quota_redis_password)
        self._written: dict[str, tuple[dict[str, Any], float]] = {}
        self._unreadable: set[str] = set()  # quotas whose windows could not be read last time (one Event each way)

    async def write_all(self, now: Any, monotonic: float) -> None:
        # Runs waiting per quota, of the runs this replica decides: its metric (summed over replicas on the
        # dashboard), and the status only when it decides every run (with shards, each sees only its own).
        waiting = self._metrics.runs_waiting_on_quota()
        names = set()
        for name, spec in self._index.items():
            names.add(name)
            try:
                reading: Reading | None = await asyncio.to_thread(self._windows.read, name, spec)
                error = None
            except self._windows.errors as e:
                where = quotas.redis_host(self._settings.quota_redis)
                reading, error = None, f"the shared windows at {where} cannot be read: {type(e).__name__}"
            self._metrics.observe_quota(name, spec.tokensPerMinute, spec.requestsPerMinute,
                                        None if reading is None else (reading.tokens_used, reading.requests_used,
                                                                      reading.in_flight),
                                        waiting.get(name, 0))
            owned = self._owns(name)
            self._metrics.observe_quota_counts(name, (reading.rejected, reading.waits, reading.wait_seconds)
                                               if owned and reading is not None else None)
            if not owned:
                continue
            await self._tell(name, error)
            body = status(spec, reading, None if self._settings.shards else waiting.get(name, 0), now, error)
            same = {k: v for k, v in body.items() if k != "observedTime"}
            last = self._written.get(name)
            if last and last[0] == same and monotonic - last[1] < STATUS_REFRESH_SECONDS:
                continue
            await asyncio.to_thread(self._kube.patch_quota_status, name, body)
            self._written[name] = (same, monotonic)
        for gone in set(self._written) - names:
            del self._written[gone]
        self._unreadable &= names
        self._metrics.forget_quotas_but(names)

    async def _tell(self, name: str, error: str | None) -> None:
        """A Warning Event when the quota's windows stop being readable, a Normal one when they are again."""
        if (error is not None) == (name in self._unreadable):
            return
        uid = self._index.uids.get(name, "")
        if error is not None:
            self._unreadable.add(name)
            await asyncio.to_thread(self._kube.post_quota_event, name, uid, "Warning", "QuotaWindowsUnreachable",
                                    f"{error}: runners' calls {self._unavailable()} until it is back")
        else:
            self._unreadable.discard(name)
            await asyncio.to_thread(self._kube.post_quota_event, name, uid, "Normal", "QuotaWindowsReachable",
                                    "the shared windows can be read again")

    def _unavailable(self) -> str:
        return "go unlimited" if self._settings.quota_unavailable == "proceed" else "wait"

    async def run_forever(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            try:
                await self.write_all(api.now(), loop.time())
            except Exception:
                log.exception("the quotas' status could not be written; trying again in %ss", STATUS_SECONDS)
            await asyncio.sleep(STATUS_SECONDS)


def writes_status(name: str, settings: Settings, keeper: Any, index: Index) -> bool:
    """Whether this replica writes quota ``name``'s status: one replica per quota (with shards, the one holding
    the name's shard), and one that serves every namespace the quota covers (with --namespace, only a quota
    that lists its namespaces, all served)."""
    if keeper is not None and not keeper.owns(name):
        return False
    if not settings.namespaces:
        return True
    covered = index.get(name)
    return covered is not None and bool(covered.namespaces) and set(covered.namespaces) <= set(settings.namespaces)

