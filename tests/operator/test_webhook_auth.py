"""Capability tokens and per-source signatures: pure checks, one table per scheme."""

from __future__ import annotations

import asyncio
import hashlib
import hmac
from datetime import UTC, datetime, timedelta

import pytest

from durablerun import webhooks
from durablerun._private.engine import webhook_urls
from durablerun_operator.ingress import auth

NOW = datetime(2026, 11, 25, 12, 0, tzinfo=UTC)
KEY = b"k" * 32
KEYS = {"k1": KEY, "k0": b"o" * 32}
CLAIMS = webhooks.Claims(namespace="team-a", run="review", uid="u-1", event="approved",
                         expires=int((NOW + timedelta(hours=1)).timestamp()), key_id="k1")


def test_a_token_round_trips_and_names_its_run() -> None:
    token = webhooks.sign(CLAIMS, KEY)
    assert webhooks.verify(token, KEYS, NOW) == CLAIMS


def _other(**change: object) -> str:
    fields = {**CLAIMS.__dict__, **change}
    return webhooks.sign(webhooks.Claims(**fields), KEY)  # type: ignore[arg-type]


def _retarget(token: str, **change: object) -> str:
    """The claims changed, the signature kept: what a tamperer can do."""
    fields = {**CLAIMS.__dict__, **change}
    body = webhooks.sign(webhooks.Claims(**fields), b"x" * 32).split(".")[0]  # type: ignore[arg-type]
    return body + "." + token.split(".")[1]


@pytest.mark.parametrize(("token", "why"), [
    (_retarget(webhooks.sign(CLAIMS, KEY), run="payroll"), "bad signature"),
    (_retarget(webhooks.sign(CLAIMS, KEY), event="other"), "bad signature"),
    (_retarget(webhooks.sign(CLAIMS, KEY), expires=2**40), "bad signature"),
    (_other(expires=int(NOW.timestamp())), "expired"),
    (_other(key_id="k9"), "unknown key"),
    (webhooks.sign(CLAIMS, b"z" * 32), "bad signature"),
    ("not-a-token", "not a token"),
    ("e30.", "not a token"),  # {} : no claims
])
def test_a_bad_token_is_refused(token: str, why: str) -> None:
    with pytest.raises(webhooks.TokenError, match=why):
        webhooks.verify(token, KEYS, NOW)


def test_a_rotated_key_still_verifies_what_it_signed() -> None:
    old = webhooks.sign(webhooks.Claims(**{**CLAIMS.__dict__, "key_id": "k0"}), KEYS["k0"])
    assert webhooks.verify(old, KEYS, NOW).key_id == "k0"


def test_run_keys_are_hkdf_of_the_namespace_key_and_differ_per_run() -> None:
    # RFC 5869, test case 1 (SHA-256), the first 32 bytes of its output.
    okm = webhooks.hkdf_sha256(b"\x0b" * 22, bytes(range(13)), bytes(range(0xf0, 0xfa)))
    assert okm.hex() == "3cb25f25faacd57a90434f64d0362f2a2d2d0a90cf1a5a4c5db02d56ecc4c5bf"
    keys = {webhooks.derive_run_key(KEY, *run) for run in [
        ("team-a", "review", "u-1"), ("team-a", "review", "u-2"), ("team-a", "other", "u-1"),
        ("team-b", "review", "u-1"), ("team-a/review", "", "u-1")]}
    assert len(keys) == 5  # another namespace, name or uid: another key
    assert KEY not in keys


@pytest.mark.parametrize(("entries", "message"), [
    ({"k1": KEY}, "no 'current' entry"),
    ({"current": b"k2", "k1": KEY}, "names key 'k2'"),
    ({"current": b"k1", "k1": b"short"}, "shorter than 16 bytes"),
])
def test_a_broken_keys_secret_says_what_to_fix(entries: dict[str, bytes], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        webhooks.load_keys(entries)


def test_webhook_url_outside_a_pod_says_what_to_configure() -> None:
    from durablerun import errors
    with pytest.raises(errors.WorkflowError, match=r"webhooks\.enabled"):
        webhook_urls.capability_url("done", timedelta(hours=1), {}, NOW)


SECRET = b"whsec_test"
BODY = b'{"action": "completed", "workflow_run": {"conclusion": "success"}}'
T = int(NOW.timestamp())


def _hex(message: bytes) -> str:
    return hmac.new(SECRET, message, hashlib.sha256).hexdigest()


@pytest.mark.parametrize(("scheme", "headers", "ok"), [
    ("github", {"X-Hub-Signature-256": "sha256=" + _hex(BODY)}, True),
    ("github", {"x-hub-signature-256": "sha256=" + _hex(BODY)}, True),  # header names are case-insensitive
    ("github", {"X-Hub-Signature-256": "sha256=" + _hex(BODY + b" ")}, False),
    ("github", {}, False),
    ("stripe", {"Stripe-Signature": f"t={T},v1={_hex(f'{T}.'.encode() + BODY)}"}, True),
    ("stripe", {"Stripe-Signature": f"t={T},v1=00,v1={_hex(f'{T}.'.encode() + BODY)}"}, True),
    ("stripe", {"Stripe-Signature": f"t={T - 301},v1={_hex(f'{T - 301}.'.encode() + BODY)}"}, False),  # replayed
    ("stripe", {"Stripe-Signature": f"t={T},v1={_hex(BODY)}"}, False),
    ("hmac", {auth.HMAC_TIMESTAMP: str(T), auth.HMAC_SIGNATURE: "sha256=" + _hex(f"{T}.".encode() + BODY)}, True),
    ("hmac", {auth.HMAC_TIMESTAMP: str(T + 400),
              auth.HMAC_SIGNATURE: "sha256=" + _hex(f"{T + 400}.".encode() + BODY)}, False),  # from the future
    ("hmac", {auth.HMAC_TIMESTAMP: "yesterday", auth.HMAC_SIGNATURE: "sha256=00"}, False),
    ("hmac", {auth.HMAC_SIGNATURE: "sha256=" + _hex(BODY)}, False),
])
def test_source_signatures(scheme: str, headers: dict[str, str], ok: bool) -> None:
    verify = auth.VERIFIERS[scheme]
    if ok:
        verify(SECRET, BODY, headers, float(T))
    else:
        with pytest.raises(auth.Refused):
            verify(SECRET, BODY, headers, float(T))


@pytest.mark.parametrize(("source", "scheme"), [
    ("github.ci", "github"), ("stripe.billing", "stripe"), ("hmac.ocr", "hmac")])
def test_source_names_carry_their_scheme(source: str, scheme: str) -> None:
    assert auth.check_source_name(source) == scheme


@pytest.mark.parametrize("source", ["github", "slack.x", "hmac.", "hmac.a/b", ""])
def test_a_bad_source_name_says_the_rule(source: str) -> None:
    with pytest.raises(ValueError, match=r"<scheme>\.<name>"):
        auth.check_source_name(source)


@pytest.mark.parametrize(("body", "path", "value"), [
    (BODY, "", {"action": "completed", "workflow_run": {"conclusion": "success"}}),
    (BODY, "workflow_run.conclusion", "success"),
    (b'{"items": [{"id": 7}]}', "items.0.id", 7),
])
def test_the_event_value_is_the_body_or_the_part_the_path_selects(body: bytes, path: str, value: object) -> None:
    assert auth.event_value(body, path) == value


@pytest.mark.parametrize(("body", "path", "status", "message"), [
    (b"<xml/>", "", 415, "not JSON"),
    (b"\xff\xfe", "", 415, "not JSON"),
    (BODY, "workflow_run.status", 422, "nothing at 'status'"),
    (b'{"items": []}', "items.0", 422, "nothing at '0'"),
])
def test_a_body_that_cannot_be_an_event_names_why(body: bytes, path: str, status: int, message: str) -> None:
    with pytest.raises(auth.BadBody) as caught:
        auth.event_value(body, path)
    assert caught.value.status == status
    assert message in caught.value.reason


def test_a_runs_source_scheme_is_one_the_ingress_checks() -> None:
    """spec.webhook.scheme (the CRD's enum, refused at apply time otherwise) is exactly the ingress's schemes."""
    from typing import get_args

    from durablerun import resource

    assert set(get_args(resource.WebhookSource.model_fields["scheme"].annotation)) == set(auth.VERIFIERS)


def test_signed_requests_naming_ever_other_runs_are_limited_per_namespace() -> None:
    """Each signed request reads the run it names before its signature can be checked; a caller that names a
    new run every time is held to the namespace's share, so it cannot make the ingress read at will."""
    from aiohttp.test_utils import TestClient, TestServer

    from durablerun_operator.ingress.server import Ingress, Settings

    class Runs:  # the one call the route makes before answering 401: no run has a source of its own
        reads = 0

        def get_run(self, namespace: str, name: str) -> None:
            Runs.reads += 1

    settings = Settings(namespaces=frozenset({"team"}), rate=0.001, burst=2, namespace_share=3)
    ingress = Ingress(Runs(), settings)  # type: ignore[arg-type]

    async def post_to_many_runs() -> list[int]:
        async with TestClient(TestServer(ingress.app(), host="127.0.0.1")) as client:
            answers = []
            for i in range(20):
                reply = await client.post(f"/v1/namespaces/team/runs/run-{i}/events/done", data=b"{}")
                answers.append(reply.status)
            return answers

    answers = asyncio.run(post_to_many_runs())
    assert answers == [401] * 6 + [429] * 14, answers
    assert Runs.reads == 6


def test_a_stream_token_is_no_event_token_and_the_other_way_round() -> None:
    """The scope is in the claims and in the key: a stream token is signed with a key derived from the run's,
    so even a verifier that looks at the signature only (an ingress from before stream tokens) refuses it."""
    run_key = webhooks.derive_run_key(KEY, "team-a", "review", "u-1")
    stream_key = webhooks.derive_stream_key(run_key)
    assert stream_key not in (KEY, run_key)
    stream = webhooks.Claims(**{**CLAIMS.__dict__, "event": "notes", "use": webhooks.USE_STREAM})
    token = webhooks.sign(stream, stream_key)
    assert webhooks.verify(token, {"k1": stream_key}, NOW) == stream
    assert webhooks.read_claims(token).use == webhooks.USE_STREAM
    with pytest.raises(webhooks.TokenError, match="bad signature"):
        webhooks.verify(token, {"k1": run_key}, NOW)
    # An event token's bytes are what they were before scopes (no "use" claim), and read as an event token.
    event = webhooks.sign(CLAIMS, run_key)
    assert b"use" not in webhooks._unb64(event.split(".")[0])
    assert webhooks.read_claims(event).use == webhooks.USE_EVENT
    with pytest.raises(webhooks.TokenError, match="not a token"):
        webhooks.read_claims(_other(use="admin"))


def test_stream_url_outside_a_pod_says_what_to_configure() -> None:
    from durablerun import errors
    with pytest.raises(errors.WorkflowError, match=r"ctx\.stream_url needs the webhook ingress"):
        webhook_urls.stream_capability_url("notes", timedelta(hours=1), {}, NOW)


@pytest.mark.parametrize(("text", "wire"), [
    ("hello", b"id: 7\ndata: hello\n\n"),
    ("two\nlines\n", b"id: 7\ndata: two\ndata: lines\ndata: \n\n"),
    ("crlf\r\nand cr\rend", b"id: 7\ndata: crlf\ndata: and cr\ndata: end\n\n"),
    ("  indented", b"id: 7\ndata:   indented\n\n"),  # the one space after the colon is the format's
    ("", b"id: 7\ndata: \n\n"),
])
def test_a_chunk_is_one_event_with_a_data_line_per_line(text: str, wire: bytes) -> None:
    from durablerun_operator.ingress import sse
    assert sse.event(7, text) == wire
    assert sse.event(7, text, "superseded") == wire.replace(b"id: 7\n", b"id: 7\nevent: superseded\n")


@pytest.mark.parametrize(("header", "start"), [(None, 0), ("", 0), ("0", 1), (" 41 ", 42), ("999999999999", 10**12)])
def test_a_reader_resumes_after_its_last_event_id(header: str | None, start: int) -> None:
    from durablerun_operator.ingress import sse
    assert sse.start_after(header) == start


@pytest.mark.parametrize("header", ["-1", "1.5", "x", "1e3", "9" * 13, "0x10"])
def test_a_last_event_id_the_stream_never_sent_is_refused_naming_the_header(header: str) -> None:
    from durablerun_operator.ingress import sse
    with pytest.raises(sse.BadLastEventId, match="Last-Event-ID"):
        sse.start_after(header)
