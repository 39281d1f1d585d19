"""The webhook ingress's parsers, fuzzed: whatever an outside caller puts in a token, a signature header, a body
or ``?path=``, the parser answers with its own refusal (TokenError, Refused, BadBody: a 4xx) or a value. Never
another exception, which the ingress would answer with a 500, and never a token or signature it did not sign
accepted.

Bounded in `make test` (FUZZ_EXAMPLES, 150 by default); `make faults` runs thousands.
"""

from __future__ import annotations

import base64
import contextlib
import hashlib
import hmac
import ipaddress
import json
from datetime import UTC, datetime
from typing import Any

from hypothesis import given
from hypothesis import strategies as st

from durablerun import webhooks
from durablerun_operator.ingress import auth, limits
from tests.helpers.fuzz import fuzz

FUZZ = fuzz()

KEY = b"k" * 32
NOW = datetime(2026, 11, 29, tzinfo=UTC)
CLAIMS = webhooks.Claims(namespace="team-a", run="research", uid="u-1", event="approval",
                         expires=int(NOW.timestamp()) + 3600, key_id="k1")

#: Values a hostile JSON document holds where a number or a string belongs.
hostile = st.one_of(
    st.none(), st.booleans(), st.integers(-(2**80), 2**80), st.floats(), st.text(max_size=12),
    st.sampled_from(["Infinity", "-Infinity", "NaN", "1e999999", "\u0661\u0662", "\u00b2"]),
    st.lists(st.integers(), max_size=3), st.dictionaries(st.text(max_size=4), st.integers(), max_size=2),
)
#: Text as headers and URLs carry it: ASCII mostly, with control characters and characters past ASCII.
header_text = st.text(st.characters(min_codepoint=0, max_codepoint=0x2FF), max_size=80)


def b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


def nested(depth: int) -> bytes:
    return b"[" * depth + b"]" * depth


@st.composite
def tokens(draw: st.DrawFn) -> str:
    """Near-tokens: claims of hostile types (NaN and infinite expiries, deep nesting), random text, or a real
    token with one character changed."""
    kind = draw(st.sampled_from(["claims", "nested", "text", "tampered"]))
    if kind == "claims":
        fields = {name: draw(hostile) for name in ("ns", "run", "uid", "ev", "exp", "kid")
                  if draw(st.booleans()) or name == "exp"}
        body = json.dumps(fields).encode()  # json.dumps writes NaN and Infinity, which json.loads reads back
        return b64(body) + "." + draw(st.text(max_size=50))
    if kind == "nested":
        return b64(nested(draw(st.integers(500, 4000)))) + ".x"
    if kind == "text":
        return draw(header_text)
    token = webhooks.sign(CLAIMS, KEY)
    at = draw(st.integers(0, len(token) - 1))
    changed = draw(st.characters(min_codepoint=32, max_codepoint=0x2FF).filter(lambda c: c != token[at]))
    return token[:at] + changed + token[at + 1:]


@FUZZ
@given(token=tokens())
def test_a_token_is_read_or_refused_and_none_it_did_not_sign_verifies(token: str) -> None:
    with contextlib.suppress(webhooks.TokenError):
        webhooks.read_claims(token)
    try:
        claims = webhooks.verify(token, {"k1": KEY}, NOW)
    except webhooks.TokenError:
        return
    assert token == webhooks.sign(claims, KEY), f"verified a token it did not sign: {token!r}"


def test_the_fuzzer_can_tell_a_good_token() -> None:
    assert webhooks.verify(webhooks.sign(CLAIMS, KEY), {"k1": KEY}, NOW) == CLAIMS


def signed_headers(scheme: str, body: bytes, timestamp: int) -> dict[str, str]:
    digest = hmac.new(KEY, (f"{timestamp}.".encode() if scheme != "github" else b"") + body,
                      hashlib.sha256).hexdigest()
    return {"github": {"X-Hub-Signature-256": f"sha256={digest}"},
            "stripe": {"Stripe-Signature": f"t={timestamp},v1={digest}"},
            "hmac": {auth.HMAC_TIMESTAMP: str(timestamp), auth.HMAC_SIGNATURE: f"sha256={digest}"}}[scheme]


@st.composite
def signed_requests(draw: st.DrawFn) -> tuple[str, bytes, dict[str, str], bool]:
    """(scheme, body, headers, authentic): headers of hostile text, or a real signature with the body, a
    header or the timestamp changed (then not authentic), or left alone (authentic)."""
    scheme = draw(st.sampled_from(sorted(auth.VERIFIERS)))
    body = draw(st.binary(max_size=200))
    now = int(NOW.timestamp())
    if draw(st.booleans()):
        names = ["X-Hub-Signature-256", "Stripe-Signature", auth.HMAC_TIMESTAMP, auth.HMAC_SIGNATURE, "X-Other"]
        headers = draw(st.dictionaries(st.sampled_from(names), header_text, max_size=4))
        return scheme, body, headers, False
    headers = signed_headers(scheme, body, now + draw(st.integers(-1000, 1000)))
    fresh = scheme == "github" or abs(int(headers.get(auth.HMAC_TIMESTAMP) or
                                          headers.get("Stripe-Signature", "t=0,").split(",")[0][2:]) - now) \
        <= auth.REPLAY_WINDOW_SECONDS
    change = draw(st.sampled_from(["none", "body", "header"]))
    if change == "body":
        body = body + draw(st.binary(min_size=1, max_size=4))
    elif change == "header":
        name = draw(st.sampled_from(sorted(headers)))
        value = headers[name]
        at = draw(st.integers(0, len(value) - 1))
        new = draw(st.characters(min_codepoint=32, max_codepoint=0x2FF).filter(lambda c: c != value[at]))
        headers = {**headers, name: value[:at] + new + value[at + 1:]}
    return scheme, body, headers, fresh and change == "none"


@FUZZ
@given(request=signed_requests())
def test_a_signature_is_checked_or_refused_and_only_an_authentic_one_passes(
        request: tuple[str, bytes, dict[str, str], bool]) -> None:
    scheme, body, headers, authentic = request
    try:
        auth.VERIFIERS[scheme](KEY, body, headers, NOW.timestamp())
    except auth.Refused:
        assert not authentic, f"refused an authentic {scheme} request: {headers!r}"
        return
    assert authentic, f"accepted a {scheme} request it should refuse: {headers!r}, body {body!r}"


json_bodies = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=10),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=5), inner, max_size=3),
    max_leaves=10,
)


@st.composite
def bodies(draw: st.DrawFn) -> bytes:
    kind = draw(st.sampled_from(["json", "bytes", "nested", "object-nested"]))
    if kind == "json":
        return json.dumps(draw(json_bodies)).encode()
    if kind == "nested":
        return nested(draw(st.integers(500, 200_000)))
    if kind == "object-nested":
        depth = draw(st.integers(500, 50_000))
        return b'{"a":' * depth + b"1" + b"}" * depth
    return draw(st.binary(max_size=300))


@FUZZ
@given(body=bodies(), path=st.one_of(header_text, st.lists(
    st.sampled_from(["a", "0", "1", "\u00b2", "\u0661", "-1", "", "99999999999999999999"]), max_size=4).map(".".join)))
def test_an_events_body_and_path_give_a_value_or_a_4xx(body: bytes, path: str) -> None:
    status = 200
    try:
        auth.event_value(body, path)
    except auth.BadBody as refused:
        status = refused.status
    assert 200 <= status < 500


@FUZZ
@given(peer=st.one_of(st.none(), header_text, st.ip_addresses().map(str)),
       forwarded=st.lists(st.one_of(header_text, st.ip_addresses().map(str)), max_size=4))
def test_a_client_is_an_address_a_network_or_unknown(peer: str | None, forwarded: list[str]) -> None:
    trusted = limits.parse_networks(["10.0.0.0/8", "::1/128", "127.0.0.1"])
    key = limits.client_key(peer, {"X-Forwarded-For": ", ".join(forwarded)}, trusted)
    if key != "unknown":
        ipaddress.ip_network(key, strict=False)


def test_the_fuzzer_reaches_each_answer() -> None:
    """The strategies above are not all refusals: an authentic request passes, a path selects."""
    body = b'{"a": [1, {"b": 2}]}'
    for scheme in auth.VERIFIERS:
        auth.VERIFIERS[scheme](KEY, body, signed_headers(scheme, body, int(NOW.timestamp())), NOW.timestamp())
    assert auth.event_value(body, "a.1.b") == 2
    any_value: Any = auth.event_value(body, "")
    assert any_value == {"a": [1, {"b": 2}]}
