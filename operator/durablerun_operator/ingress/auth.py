"""Who may send an event: per-source signature schemes, the replay window, the body's selected part.

Pure functions of the request's bytes and headers, so each scheme is table-tested. Capability
tokens are ``durablerun.webhooks`` (the SDK signs them). Every comparison of a
signature is constant-time.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import re
from collections.abc import Mapping
from typing import Any

#: How far a signed timestamp may be from the ingress's clock (Stripe's default tolerance).
REPLAY_WINDOW_SECONDS = 300

# A source is an entry of the namespace's sources Secret named <scheme>.<name>.
_SOURCE = re.compile(r"^(github|stripe|hmac)\.[A-Za-z0-9_-]{1,60}$")

# The generic scheme's headers (any sender can compute them; docs/web.md gives a curl line).
HMAC_TIMESTAMP = "X-Durablerun-Timestamp"
HMAC_SIGNATURE = "X-Durablerun-Signature"


class Refused(Exception):
    """The request is not authentic. Its message is for the ingress's log, never for the caller."""


def check_source_name(source: str) -> str:
    """The scheme of a source name (``github.ci`` → ``github``); ValueError naming the rule."""
    if not _SOURCE.match(source):
        raise ValueError(f"source {source!r} is not <scheme>.<name> with scheme github, stripe or hmac "
                         "(e.g. github.ci): name an entry of the namespace's sources Secret")
    return source.split(".", 1)[0]


def _hex_hmac(secret: bytes, message: bytes) -> str:
    return hmac.new(secret, message, hashlib.sha256).hexdigest()


def _same(expected: str, given: str) -> bool:
    """Constant-time equality of a signature and what the caller sent, compared as bytes: a header may hold
    any text, which ``compare_digest`` refuses to compare as str."""
    return hmac.compare_digest(expected.encode(), given.encode())


def _header(headers: Mapping[str, str], name: str) -> str:
    for key, value in headers.items():
        if key.lower() == name.lower():
            return value
    return ""


def _fresh(timestamp: str, now: float) -> None:
    try:
        moment = int(timestamp)
    except ValueError:
        raise Refused(f"timestamp {timestamp!r} is not Unix seconds") from None
    if abs(now - moment) > REPLAY_WINDOW_SECONDS:
        raise Refused(f"timestamp {moment} is outside the {REPLAY_WINDOW_SECONDS} s replay window")


def verify_github(secret: bytes, body: bytes, headers: Mapping[str, str], now: float) -> None:
    """GitHub: ``X-Hub-Signature-256: sha256=<hex HMAC-SHA256 of the body>``.

    GitHub signs no timestamp, so a replayed delivery verifies; it changes nothing, since an event
    is written once (first write wins).
    """
    given = _header(headers, "X-Hub-Signature-256")
    if not _same("sha256=" + _hex_hmac(secret, body), given):
        raise Refused("X-Hub-Signature-256 does not match")


def verify_stripe(secret: bytes, body: bytes, headers: Mapping[str, str], now: float) -> None:
    """Stripe: ``Stripe-Signature: t=<unix>,v1=<hex HMAC-SHA256 of "<t>.<body>">`` (several v1 allowed)."""
    parts = [p.split("=", 1) for p in _header(headers, "Stripe-Signature").split(",") if "=" in p]
    timestamp = next((v for k, v in parts if k.strip() == "t"), "")
    candidates = [v for k, v in parts if k.strip() == "v1"]
    if not timestamp or not candidates:
        raise Refused("Stripe-Signature lacks t= or v1=")
    _fresh(timestamp, now)
    expected = _hex_hmac(secret, timestamp.encode() + b"." + body)
    # Compare against every candidate, matched or not, so the time taken says nothing.
    if not sum(_same(expected, c.strip()) for c in candidates):
        raise Refused("no v1 signature of Stripe-Signature matches")


def verify_hmac(secret: bytes, body: bytes, headers: Mapping[str, str], now: float) -> None:
    """Generic: ``X-Durablerun-Timestamp: <unix>`` and ``X-Durablerun-Signature: sha256=<hex HMAC-SHA256
    of "<timestamp>.<body>">``."""
    timestamp = _header(headers, HMAC_TIMESTAMP)
    if not timestamp:
        raise Refused(f"no {HMAC_TIMESTAMP} header")
    _fresh(timestamp, now)
    expected = "sha256=" + _hex_hmac(secret, timestamp.encode() + b"." + body)
    if not _same(expected, _header(headers, HMAC_SIGNATURE)):
        raise Refused(f"{HMAC_SIGNATURE} does not match")


VERIFIERS = {"github": verify_github, "stripe": verify_stripe, "hmac": verify_hmac}


class BadBody(Exception):
    """The body cannot become an event: the HTTP status and a reason naming what to fix."""

    def __init__(self, status: int, reason: str) -> None:
        super().__init__(reason)
        self.status, self.reason = status, reason


def event_value(body: bytes, path: str) -> Any:
    """The event's value: the JSON body, or the part of it a dotted ``path`` selects (``a.b.0.c``)."""
    try:
        value = json.loads(body)
    except (UnicodeDecodeError, json.JSONDecodeError) as error:
        raise BadBody(415, f"the body is not JSON ({error}): send Content-Type application/json") from None
    except RecursionError:
        raise BadBody(422, "the body's JSON is nested too deeply to read") from None
    for part in [p for p in path.split(".") if p] if path else []:
        if isinstance(value, dict) and part in value:
            value = value[part]
        elif isinstance(value, list) and part.isascii() and part.isdigit() and int(part) < len(value):
            value = value[int(part)]
        else:
            raise BadBody(422, f"path {path!r}: the body has nothing at {part!r}")
    return value
