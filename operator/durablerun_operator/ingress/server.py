"""The webhook ingress's HTTP server: two routes that each write one event on one run.

``POST /v1/hooks/{token}``: a capability URL (``ctx.webhook_url``); the token names the run and the
event. ``POST /v1/namespaces/{ns}/runs/{run}/events/{event}[?source=<scheme>.<name>]``: a per-source
signature (GitHub, Stripe, generic HMAC) checked with the run's own source (``spec.webhook``: a scheme
and a Secret entry) or else with the entry of the namespace's sources Secret ``?source=`` names.
Either way the body (JSON, or the part ``?path=a.b`` selects) becomes ``spec.events.<event>``, first
write wins, as ``kubectl durablerun event`` does. Whoever fails authentication gets one answer,
whatever failed: a missing run, a wrong signature and an expired token look the same.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from aiohttp import web
from prometheus_client import Counter, Histogram

from durablerun import api, webhooks
from durablerun_operator import kube
from durablerun_operator.ingress import auth

log = logging.getLogger("durablerun.ingress")

REQUESTS = Counter("durablerun_webhook_requests", "Webhook requests by outcome.", ["outcome"])
LATENCY = Histogram("durablerun_webhook_request_seconds", "Time to answer a webhook request.",
                    buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5))
OUTCOMES = ("delivered", "duplicate", "unauthorized", "gone", "conflict", "bad_request", "too_large",
            "rate_limited", "error")
for _outcome in OUTCOMES:
    REQUESTS.labels(_outcome)


@dataclass
class Settings:
    #: Namespaces whose runs the ingress serves (the chart's webhooks.namespaces).
    namespaces: frozenset[str]
    #: Largest accepted body in bytes (webhooks.maxBodyBytes).
    max_body: int = 256 * 1024
    #: Requests per second and burst allowed per source (a capability URL's source is its run).
    rate: float = 20.0
    burst: int = 100
    #: How many times a source's allowance a namespace's signed requests get in all: each reads the run it
    #: names before its signature can be checked, so a caller naming ever other runs must not read at will.
    namespace_share: int = 10
    #: Seconds a Secret read is reused: a rotated key or a new source is seen within this long.
    secret_ttl: float = 10.0


class _Answer(Exception):
    def __init__(self, status: int, outcome: str, reason: str) -> None:
        super().__init__(reason)
        self.status, self.outcome, self.reason = status, outcome, reason


_UNAUTHORIZED = _Answer(401, "unauthorized", "unauthorized")


@dataclass
class _Bucket:
    tokens: float
    stamp: float


@dataclass
class RateLimits:
    """A token bucket per source: ``rate`` a second, up to ``burst`` at once."""

    rate: float
    burst: int
    clock: Callable[[], float] = time.monotonic
    buckets: dict[str, _Bucket] = field(default_factory=dict)

    def allow(self, source: str) -> bool:
        now = self.clock()
        bucket = self.buckets.setdefault(source, _Bucket(float(self.burst), now))
        bucket.tokens = min(float(self.burst), bucket.tokens + (now - bucket.stamp) * self.rate)
        bucket.stamp = now
        if bucket.tokens < 1:
            return False
        bucket.tokens -= 1
        return True


class Ingress:
    def __init__(self, client: kube.Kube, settings: Settings, clock: Callable[[], float] = time.time) -> None:
        self.kube, self.settings, self.clock = client, settings, clock
        self.limits = RateLimits(settings.rate, settings.burst)
        self.namespace_limits = RateLimits(settings.rate * settings.namespace_share,
                                           settings.burst * settings.namespace_share)
        self._secrets: dict[tuple[str, str], tuple[float, dict[str, bytes] | None]] = {}

    def app(self) -> web.Application:
        app = web.Application(client_max_size=self.settings.max_body + 1)
        app.router.add_post("/v1/hooks/{token}", self._answering(self.capability))
        app.router.add_post("/v1/namespaces/{namespace}/runs/{run}/events/{event}", self._answering(self.signed))
        app.router.add_get("/healthz", self.healthz)
        return app

    async def healthz(self, request: web.Request) -> web.Response:
        return web.Response(text="ok\n")

    def _answering(self, route: Callable[[web.Request], Any]) -> Callable[[web.Request], Any]:
        async def handle(request: web.Request) -> web.Response:
            started = time.monotonic()
            try:
                status, outcome, body = await route(request)
            except _Answer as answer:
                status, outcome, body = answer.status, answer.outcome, {"error": answer.reason}
            except Exception:  # never a stack trace to an outside caller
                log.exception("webhook request failed")
                status, outcome, body = 500, "error", {"error": "internal error; retry later"}
            REQUESTS.labels(outcome).inc()
            LATENCY.observe(time.monotonic() - started)
            return web.json_response(body, status=status)
        return handle

    # --- the two ways in ------------------------------------------------------------------------

    async def capability(self, request: web.Request) -> tuple[int, str, dict[str, Any]]:
        try:
            claims = webhooks.read_claims(request.match_info["token"])
        except webhooks.TokenError:
            raise _UNAUTHORIZED from None
        self._limit(f"{claims.namespace}/{claims.run}")
        if claims.namespace not in self.settings.namespaces:
            raise _UNAUTHORIZED
        entries = await self._secret(claims.namespace, api.WEBHOOK_KEYS_SECRET)
        try:
            _, keys = webhooks.load_keys(entries or {})
            webhooks.verify(request.match_info["token"], keys, datetime.fromtimestamp(self.clock(), UTC))
        except (ValueError, webhooks.TokenError) as error:
            log.info("capability URL refused for %s/%s: %s", claims.namespace, claims.run, error)
            raise _UNAUTHORIZED from None
        body = await self._body(request)
        value = self._value(body, request)
        return await self._deliver(claims.namespace, claims.run, claims.event, value,
                                   "a capability URL", uid=claims.uid)

    async def signed(self, request: web.Request) -> tuple[int, str, dict[str, Any]]:
        """A signature checked with the run's own source (``spec.webhook``) if it names one, else with the entry
        of the namespace's sources Secret that ``?source=`` names: the run's own wins."""
        namespace, run, event = (request.match_info[k] for k in ("namespace", "run", "event"))
        source = request.query.get("source", "")
        if source:
            try:
                auth.check_source_name(source)
            except ValueError as error:
                raise _Answer(400, "bad_request", str(error)) from None
        self._limit(f"{namespace}/{source or run}")
        if namespace not in self.settings.namespaces:
            raise _UNAUTHORIZED
        if not self.namespace_limits.allow(namespace):
            raise _Answer(429, "rate_limited", "too many requests to this namespace; retry later")
        body = await self._body(request)
        body_run = await asyncio.to_thread(self.kube.get_run, namespace, run)
        own = ((body_run or {}).get("spec") or {}).get("webhook")
        if own:
            scheme, label = own["scheme"], f"the run's webhook source ({own['scheme']}, Secret {own['secret']})"
            secret = (await self._secret(namespace, own["secret"]) or {}).get(own.get("key") or "secret")
        elif source:
            scheme, label = source.split(".", 1)[0], f"webhook source {source}"
            secret = (await self._secret(namespace, api.WEBHOOK_SOURCES_SECRET) or {}).get(source)
        else:  # neither: the same answer as a wrong signature (a caller learns nothing of the run)
            raise _UNAUTHORIZED
        if not secret:
            log.info("%s of %s/%s: no such Secret entry, or one the ingress may not read", label, namespace, run)
            raise _UNAUTHORIZED
        try:
            auth.VERIFIERS[scheme](secret, body, request.headers, self.clock())
        except auth.Refused as error:
            log.info("request with %s for %s/%s refused: %s", label, namespace, run, error)
            raise _UNAUTHORIZED from None
        try:
            api.check_event_name(event)
        except Exception as error:
            raise _Answer(400, "bad_request", str(error)) from None
        return await self._deliver(namespace, run, event, self._value(body, request), label)

    # --- shared -----------------------------------------------------------------------------------

    def _limit(self, source: str) -> None:
        if not self.limits.allow(source):
            raise _Answer(429, "rate_limited", "too many requests from this source; retry later")

    async def _body(self, request: web.Request) -> bytes:
        if (request.content_length or 0) > self.settings.max_body:
            raise _Answer(413, "too_large", f"the body is larger than {self.settings.max_body} bytes")
        try:
            return await request.read()
        except web.HTTPRequestEntityTooLarge:
            raise _Answer(413, "too_large", f"the body is larger than {self.settings.max_body} bytes") from None

    @staticmethod
    def _value(body: bytes, request: web.Request) -> Any:
        try:
            return auth.event_value(body, request.query.get("path", ""))
        except auth.BadBody as bad:
            raise _Answer(bad.status, "bad_request", bad.reason) from None

    async def _secret(self, namespace: str, name: str) -> dict[str, bytes] | None:
        now = time.monotonic()
        cached = self._secrets.get((namespace, name))
        if cached and now - cached[0] < self.settings.secret_ttl:
            return cached[1]
        entries = await asyncio.to_thread(self.kube.get_secret_data, namespace, name)
        self._secrets[(namespace, name)] = (now, entries)
        return entries

    async def _deliver(self, namespace: str, name: str, event: str, value: Any, source: str,
                       uid: str | None = None) -> tuple[int, str, dict[str, Any]]:
        """Write the event once; a second delivery of the same value changes nothing."""
        for _ in range(3):
            run = await asyncio.to_thread(self.kube.get_run, namespace, name)
            if run is None or (uid is not None and run["metadata"]["uid"] != uid):
                return 410, "gone", {"error": f"run {namespace}/{name} no longer exists"}
            sent = (run.get("spec") or {}).get("events") or {}
            if event in sent:
                if sent[event] == value:
                    return 200, "duplicate", {"delivered": False, "reason": f"event {event!r} was already delivered"}
                return 409, "conflict", {"error": f"event {event!r} was already set to another value; "
                                                  "events are write-once: send a new event instead"}
            try:
                written = await asyncio.to_thread(
                    self.kube.merge_patch_run, namespace, name, {"spec": {"events": {event: value}}})
            except kube.Conflict as conflict:
                log.info("event %r of %s/%s: %s; reading the run again", event, namespace, name, conflict)
                continue  # set meanwhile by someone else: answer from what is there now
            if written is None:
                return 410, "gone", {"error": f"run {namespace}/{name} no longer exists"}
            await asyncio.to_thread(self.kube.post_event, written, "Normal", "EventReceived",
                                    f"event {event!r} delivered by {source}")
            return 202, "delivered", {"delivered": True, "run": f"{namespace}/{name}", "event": event}
        raise _Answer(503, "error", "the run kept changing; retry later")
