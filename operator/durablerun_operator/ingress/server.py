"""The webhook ingress's HTTP server: two routes that each write one event on one run, and one that reads a
run's output stream.

``POST /v1/hooks/{token}``: a capability URL (``ctx.webhook_url``); the token names the run and the
event. ``POST /v1/namespaces/{ns}/runs/{run}/events/{event}[?source=<scheme>.<name>]``: a per-source
signature (GitHub, Stripe, generic HMAC) checked with the run's own source (``spec.webhook``: a scheme
and a Secret entry) or else with the entry of the namespace's sources Secret ``?source=`` names.
Either way the body (JSON, or the part ``?path=a.b`` selects) becomes ``spec.events.<event>``, first
write wins, as ``kubectl durablerun event`` does. Whoever fails authentication gets one answer,
whatever failed: a missing run, a wrong signature and an expired token look the same.

``GET /v1/streams/{token}``: a stream token (``ctx.stream_url``) names a run and one of its output streams;
the answer is Server-Sent Events, one per chunk, read from the run's store with the SDK's reader and
resumed after ``Last-Event-ID``. Connections are capped per run and in all, and one whose client does not
take what is written within ``stream_write_timeout`` is dropped: a client that never reads costs a
bounded buffer, not memory that grows.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from aiohttp import web

from durablerun import api, streams, webhooks
from durablerun_operator import kube
from durablerun_operator.ingress import auth, limits, sse, stream_serving
from durablerun_operator.ingress.counters import LATENCY, REQUESTS

log = logging.getLogger("durablerun.ingress")

#: The pod a bound ServiceAccount token was made for, as a TokenReview reports it.
POD_NAME_CLAIM = "authentication.kubernetes.io/pod-name"


@dataclass
class Settings:
    #: Namespaces whose runs the ingress serves (the chart's webhooks.namespaces).
    namespaces: frozenset[str]
    #: Largest accepted body in bytes (webhooks.maxBodyBytes).
    max_body: int = 256 * 1024
    #: Authenticated deliveries per second and burst allowed per run and source (a capability URL's source is
    #: its run), counted once the signature is checked: nobody else's requests spend them.
    rate: float = 20.0
    burst: int = 100
    #: Failed authentications per second and burst allowed per client address; past them its requests that
    #: cannot be checked without reading the API server are answered 429 before any read.
    failure_rate: float = 1.0
    failure_burst: int = 20
    #: How many times a source's allowance the failed signed requests to one namespace get in all: each read
    #: the run it named before its signature could be checked, so callers from many addresses naming ever
    #: other runs must not make the ingress read at will.
    namespace_share: int = 10
    #: Proxies (addresses or networks) whose X-Forwarded-For names the client; else the peer is the client.
    trusted_proxies: tuple[limits.Network, ...] = ()
    #: Most buckets each rate limit keeps (least recently used dropped first): memory stays bounded.
    max_buckets: int = 20_000
    #: Seconds a Secret read is reused: a rotated key or a new source is seen within this long.
    secret_ttl: float = 10.0
    #: Stream (Server-Sent Events) connections open at once to one run, and in all; more are answered 429
    #: (this run) or 503 (the ingress) with Retry-After.
    stream_max_per_run: int = 10
    stream_max_total: int = 100
    #: Seconds a client may take to accept what is written to it before its connection is dropped: with
    #: aiohttp's bounded write buffer, what one client that never reads costs is about 128 KiB of buffer
    #: and ``stream_window`` chunks (64 KiB each by default, a write's 256 KiB at most).
    stream_write_timeout: float = 10.0
    #: Chunks a stream connection reads from the store at once (held in memory until written).
    stream_window: int = 8
    #: Seconds between comments sent while a stream is idle (keeps proxies from closing it, finds gone clients).
    stream_heartbeat: float = 15.0
    #: Retry-After (seconds) of a stream refused for the caps.
    stream_retry_after: int = 5


class _Answer(Exception):
    def __init__(self, status: int, outcome: str, reason: str) -> None:
        super().__init__(reason)
        self.status, self.outcome, self.reason = status, outcome, reason


_UNAUTHORIZED = _Answer(401, "unauthorized", "unauthorized")
_TOO_MANY_FAILURES = _Answer(429, "rate_limited", "too many failed requests from this address; retry later")


# Over 300 lines: every route (capability events, signed sources, run keys, streams) goes through one token
# check, one set of rate limits and one Secret cache, kept here so no route can skip them. Serving a stream
# once its request is checked is stream_serving's.
class Ingress:
    def __init__(self, client: kube.Kube, settings: Settings, clock: Callable[[], float] = time.time) -> None:
        self.kube, self.settings, self.clock = client, settings, clock
        cap = settings.max_buckets
        #: Authenticated deliveries, per verified run and source.
        self.limits = limits.RateLimits(settings.rate, settings.burst, cap)
        #: Failed authentications, per client address.
        self.failures = limits.RateLimits(settings.failure_rate, settings.failure_burst, cap)
        #: Failed signed requests that read a run first, per namespace.
        self.namespace_failures = limits.RateLimits(settings.rate * settings.namespace_share,
                                                    settings.burst * settings.namespace_share, cap)
        self._secrets: dict[tuple[str, str], tuple[float, dict[str, bytes] | None]] = {}
        self.streams = stream_serving.Connections(settings.stream_max_per_run, settings.stream_max_total)
        #: The runs' stores, shared by the connections reading runs with the same store and credentials.
        self.stores = streams.StoreCache()

    def app(self) -> web.Application:
        app = web.Application(client_max_size=self.settings.max_body + 1)
        app.router.add_post("/v1/hooks/{token}", self._answering(self.capability))
        app.router.add_post(webhooks.KEYS_ROUTE, self._answering(self.run_key))
        app.router.add_post("/v1/namespaces/{namespace}/runs/{run}/events/{event}", self._answering(self.signed))
        app.router.add_get(webhooks.STREAMS_ROUTE + "{token}", self.stream)
        app.router.add_get("/healthz", self.healthz)
        app.on_cleanup.append(self._close_stores)
        return app

    async def _close_stores(self, app: web.Application) -> None:
        await asyncio.to_thread(self.stores.close)

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
        """The token is checked before anything is counted against its run: a forger spends only its own
        address's allowance, and checking costs no API read (the served namespaces' keys are cached)."""
        client = self._client(request)
        claims = await self._authentic(request.match_info["token"], webhooks.USE_EVENT, client)
        self._limit(f"{claims.namespace}/{claims.run}/{claims.uid}", "this run's capability URLs")
        body = await self._body(request)
        value = self._value(body, request)
        return await self._deliver(claims.namespace, claims.run, claims.event, value,
                                   "a capability URL", uid=claims.uid)

    async def _authentic(self, token: str, use: str, client: str) -> webhooks.Claims:
        """The claims of ``token`` if it is authentic, unexpired, for a served namespace and of scope ``use``;
        else the one refusal every bad token gets (a token of the other scope is just a bad token)."""
        try:
            claims = webhooks.read_claims(token)
        except webhooks.TokenError:
            raise self._failed(client) from None
        if claims.namespace not in self.settings.namespaces:
            raise self._failed(client)
        entries = await self._secret(claims.namespace, api.WEBHOOK_KEYS_SECRET)
        try:
            _, keys = webhooks.load_keys(entries or {})
            if claims.use != use:
                raise webhooks.TokenError(f"a {claims.use} token where a {use} token is needed")
            self._verify(token, claims, keys)
        except (ValueError, webhooks.TokenError) as error:
            log.info("capability URL refused for %s/%s from %s: %s", claims.namespace, claims.run, client, error)
            raise self._failed(client) from None
        return claims

    def _verify(self, token: str, claims: webhooks.Claims, keys: dict[str, bytes]) -> None:
        """A token signed with its run's key (derived from the namespace's), or else one signed with the namespace's
        key itself, as runners did before they got keys of their own (docs/security.md, "Webhook keys"). A
        stream token is signed with the run's stream key, and only with it."""
        now = datetime.fromtimestamp(self.clock(), UTC)
        if claims.key_id not in keys:
            raise webhooks.TokenError("unknown key")
        derived = webhooks.derive_run_key(keys[claims.key_id], claims.namespace, claims.run, claims.uid)
        if claims.use == webhooks.USE_STREAM:
            webhooks.verify(token, {claims.key_id: webhooks.derive_stream_key(derived)}, now)
            return
        try:
            webhooks.verify(token, {claims.key_id: derived}, now)
        except webhooks.TokenError as error:
            if str(error) != "bad signature":
                raise
            webhooks.verify(token, keys, now)  # signed with the namespace's key: a URL from before the upgrade
            log.info("capability URL for %s/%s signed with the namespace's key %s (a runner from before run keys)",
                     claims.namespace, claims.run, claims.key_id)

    async def run_key(self, request: web.Request) -> tuple[int, str, dict[str, Any]]:
        """A runner pod's own run's key, for the pod that presents its ServiceAccount token (audience
        ``api.WEBHOOK_TOKEN_AUDIENCE``, bound to the pod) and is its run's current attempt (``status.pod``)."""
        client = self._client(request)
        bearer = request.headers.get("Authorization", "")
        if not bearer.startswith("Bearer ") or not self.failures.available(client):
            raise self._failed(client)  # a token review is an API call: held to the address's failures
        try:
            run = str(json.loads(await self._body(request))["run"])
        except (ValueError, KeyError, TypeError):
            raise _Answer(400, "bad_request", 'the body must be JSON {"run": "<the run\'s name>"}') from None
        review = await asyncio.to_thread(self.kube.review_token, bearer[len("Bearer "):], api.WEBHOOK_TOKEN_AUDIENCE)
        username, extra = review or ("", {})
        parts = username.split(":")
        namespace = parts[2] if len(parts) == 4 and parts[:2] == ["system", "serviceaccount"] else ""
        pod = (extra.get(POD_NAME_CLAIM) or [""])[0]
        if not namespace or not pod or namespace not in self.settings.namespaces:
            log.info("run key for %r refused to %s: the token is not a served namespace's pod's (%s)",
                     run, client, username or "not authenticated")
            raise self._failed(client)
        found = await asyncio.to_thread(self.kube.get_run, namespace, run)
        if found is None or (found.get("status") or {}).get("pod") != pod:
            log.info("run key for %s/%s refused to pod %s: not the run's current attempt", namespace, run, pod)
            raise self._failed(client)
        self._limit(f"{namespace}/{run}/run-key", "this run's pod")
        try:
            current, keys = webhooks.load_keys(await self._secret(namespace, api.WEBHOOK_KEYS_SECRET) or {})
        except ValueError as error:
            log.warning("run key for %s/%s: Secret %s: %s", namespace, run, api.WEBHOOK_KEYS_SECRET, error)
            raise _Answer(503, "error", f"namespace {namespace}'s webhook keys are not usable; the ingress's log "
                                        "says why") from None
        key = webhooks.derive_run_key(keys[current], namespace, run, found["metadata"]["uid"])
        return 200, "key_issued", {"run": run, "uid": found["metadata"]["uid"], "kid": current,
                                   "key": webhooks.encode_key(key)}

    async def signed(self, request: web.Request) -> tuple[int, str, dict[str, Any]]:
        """A signature checked with the run's own source (``spec.webhook``) if it names one, else with the entry
        of the namespace's sources Secret that ``?source=`` names: the run's own wins.

        A ``?source=`` signature is checked first (its Secret is cached). Only the run can say whether it has a
        source of its own, so a request not authentic by then reads the run first, and that read is held to the
        caller's address's failure allowance and to the namespace's share."""
        namespace, run, event = (request.match_info[k] for k in ("namespace", "run", "event"))
        source = request.query.get("source", "")
        if source:
            try:
                auth.check_source_name(source)
            except ValueError as error:
                raise _Answer(400, "bad_request", str(error)) from None
        client = self._client(request)
        if namespace not in self.settings.namespaces:
            raise self._failed(client)
        body = await self._body(request)
        now = self.clock()
        refusal = "no ?source= and the run names no source of its own"
        by_namespace = False
        if source:
            secret = (await self._secret(namespace, api.WEBHOOK_SOURCES_SECRET) or {}).get(source)
            try:
                if not secret:
                    raise auth.Refused(f"no entry {source} in {api.WEBHOOK_SOURCES_SECRET} the ingress may read")
                auth.VERIFIERS[source.split(".", 1)[0]](secret, body, request.headers, now)
                by_namespace = True
            except auth.Refused as error:
                refusal = str(error)
        if not by_namespace:
            if not self.failures.available(client):
                raise _TOO_MANY_FAILURES
            if not self.namespace_failures.available(namespace):
                raise _Answer(429, "rate_limited", "too many failed requests to this namespace; retry later")
        body_run = await asyncio.to_thread(self.kube.get_run, namespace, run)
        own = ((body_run or {}).get("spec") or {}).get("webhook")
        if own:
            label = f"the run's webhook source ({own['scheme']}, Secret {own['secret']})"
            secret = (await self._secret(namespace, own["secret"]) or {}).get(own.get("key") or "secret")
            try:
                if not secret:
                    raise auth.Refused("no such Secret entry, or one the ingress may not read")
                auth.VERIFIERS[own["scheme"]](secret, body, request.headers, now)
            except auth.Refused as error:
                raise self._refused(client, namespace, run, label, str(error)) from None
        elif by_namespace:
            label = f"webhook source {source}"
        else:  # the same answer as a wrong signature (a caller learns nothing of the run)
            raise self._refused(client, namespace, run, f"webhook source {source or '(none)'}", refusal)
        self._limit(f"{namespace}/{run}/{label}", "this source to this run")
        try:
            api.check_event_name(event)
        except Exception as error:
            raise _Answer(400, "bad_request", str(error)) from None
        return await self._deliver(namespace, run, event, self._value(body, request), label)

    # --- reading a stream ----------------------------------------------------------------------

    async def stream(self, request: web.Request) -> web.StreamResponse:
        """A run's output stream as Server-Sent Events, from after ``Last-Event-ID`` until the run has finished
        and the stream is read to its end (or the token expires). ``?final=true``: only the chunks of step tries
        that were journaled (``durablerun stream --final``). Refusals are JSON, as the POST routes' are."""
        started = time.monotonic()
        try:
            claims, run, key = await self._stream_request(request)
        except _Answer as answer:
            REQUESTS.labels(answer.outcome).inc()
            LATENCY.observe(time.monotonic() - started)
            headers = {"Retry-After": str(self.settings.stream_retry_after)} if answer.outcome == "stream_busy" else {}
            return web.json_response({"error": answer.reason}, status=answer.status, headers=headers)
        try:
            try:
                reader, first = await self._open_stream(claims, run, request["stream_start"],
                                                        request["stream_final"])
            except _Answer as answer:
                REQUESTS.labels(answer.outcome).inc()
                return web.json_response({"error": answer.reason}, status=answer.status)
            return await stream_serving.serve(
                request, reader, first, expires=claims.expires, clock=self.clock, started=started,
                pacing=stream_serving.Pacing(self.settings.stream_write_timeout, self.settings.stream_heartbeat),
                where=f"stream {claims.event!r} of {claims.namespace}/{claims.run}")
        finally:
            self.streams.release(key)

    async def _stream_request(self, request: web.Request) -> tuple[webhooks.Claims, dict[str, Any], str]:
        """The claims and the run of an authentic stream request that got a connection slot (release it)."""
        client = self._client(request)
        claims = await self._authentic(request.match_info["token"], webhooks.USE_STREAM, client)
        key = f"{claims.namespace}/{claims.run}/{claims.uid}"
        self._limit(key, "this run's capability URLs")
        problem = streams.stream_name_error(claims.event)
        if problem is not None:  # signed, so only a namespace key's holder can get here: still no key built from it
            raise _Answer(400, "bad_request", problem)
        try:
            start = sse.start_after(request.headers.get("Last-Event-ID"))
        except sse.BadLastEventId as error:
            raise _Answer(400, "bad_request", str(error)) from None
        final = request.query.get("final", "false").lower()
        if final not in ("true", "false", "1", "0"):
            raise _Answer(400, "bad_request", f"?final={final[:20]!r}: use true (only final chunks) or false")
        request["stream_start"], request["stream_final"] = start, final in ("true", "1")
        # Slots before any read: a crowd of readers costs no API call and no store connection past the caps.
        try:
            self.streams.take(key)
        except stream_serving.Busy as busy:
            raise _Answer(busy.status, "stream_busy", busy.reason) from None
        try:
            run = await asyncio.to_thread(self.kube.get_run, claims.namespace, claims.run)
            if run is None or run["metadata"]["uid"] != claims.uid:
                raise _Answer(410, "gone", f"run {claims.namespace}/{claims.run} no longer exists")
        except BaseException:
            self.streams.release(key)
            raise
        return claims, run, key

    async def _open_stream(self, claims: webhooks.Claims, run: dict[str, Any], start: int,
                           final: bool) -> tuple[streams.RunStream, streams.Advance]:
        """The run's stream opened on its store with its credentials Secret, and its first read: a store the
        ingress cannot read is a 503 before anything is streamed (the reason in the log, not to the caller)."""
        where = f"{claims.namespace}/{claims.run} stream {claims.event!r}"
        secret_name = ((run.get("spec") or {}).get("checkpoint") or {}).get("credentialsSecret")
        entries = None
        if secret_name:
            entries = await self._secret(claims.namespace, secret_name)
            if entries is None:
                log.warning("%s: the ingress may not read Secret %s/%s (the run's store credentials): add it to "
                            "the chart's webhooks.streams.storeSecrets", where, claims.namespace, secret_name)
                raise _Answer(503, "error", "the ingress cannot read this run's store; its log says why")
        try:
            reader = await asyncio.to_thread(streams.open_run_stream, run, claims.event, start=start, final=final,
                                             secret=entries, window=self.settings.stream_window,
                                             stores=self.stores)
        except Exception as error:
            log.warning("%s: the run's store does not open: %s", where, error)
            raise _Answer(503, "error", "the ingress cannot read this run's store; its log says why") from None
        try:
            return reader, await asyncio.to_thread(reader.advance)
        except Exception as error:
            await asyncio.to_thread(reader.close)
            log.warning("%s: reading the run's store failed: %s: %s", where, type(error).__name__, error)
            raise _Answer(503, "error", "the ingress cannot read this run's store; its log says why") from None

    # --- shared -----------------------------------------------------------------------------------

    def _client(self, request: web.Request) -> str:
        return limits.client_key(request.remote, request.headers, self.settings.trusted_proxies)

    def _failed(self, client: str) -> _Answer:
        """A failed authentication, counted against the client's address: 401, or 429 past its allowance."""
        return _UNAUTHORIZED if self.failures.allow(client) else _TOO_MANY_FAILURES

    def _refused(self, client: str, namespace: str, run: str, label: str, why: str) -> _Answer:
        """A signed request refused after its run was read: counted against the address and the namespace."""
        log.info("request with %s for %s/%s from %s refused: %s", label, namespace, run, client, why)
        self.failures.allow(client)
        self.namespace_failures.allow(namespace)
        return _UNAUTHORIZED

    def _limit(self, key: str, what: str) -> None:
        if not self.limits.allow(key):
            raise _Answer(429, "rate_limited", f"too many requests from {what}; retry later")

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
