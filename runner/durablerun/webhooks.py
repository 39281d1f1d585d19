"""Capability URLs: a token that lets whoever holds it send one event to one run, or read one of its output
streams, until it expires.

The token format has one definition, here: the SDK signs (``ctx.webhook_url``) and the webhook
ingress verifies (``durablerun_operator.ingress``). A token is ``<claims>.<signature>``, both
unpadded base64url: the claims are compact JSON naming the namespace, the run and its uid, the event, the
expiry (Unix seconds) and the id of the key that signed it; the signature is HMAC-SHA256 of the
encoded claims with that key. Keys live in a namespace's ``durablerun-webhook-keys`` Secret
(docs/web.md): one entry per key id and ``current`` naming the one to sign with, so a key can be
rotated by adding a new one and moving ``current``, without breaking URLs signed with the old one.

A runner never holds those keys: it signs with a key derived for its run (``derive_run_key``: HKDF of
the namespace's key over the run's namespace, name and uid), which it gets from the ingress by
presenting its pod's ServiceAccount token (docs/security.md). Its workflow can therefore sign for its
own run only; the ingress derives the same key to verify.

Two scopes, which cannot stand in for each other: an event token (``ctx.webhook_url``, POSTed to) and a
stream token (``ctx.stream_url``, read with a GET as Server-Sent Events). A stream token says so in its
claims (``"use": "stream"``, its ``ev`` naming the stream) *and* is signed with a key derived once more
from the run's key (``derive_stream_key``): an ingress that checked only the signature, as one from
before stream tokens did, still refuses it as an event token.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import json
import re
from dataclasses import dataclass
from datetime import datetime
from urllib.parse import quote

#: The Secret entry that names the key id new tokens are signed with.
CURRENT = "current"
#: The ingress's route where a runner pod gets its run's key.
KEYS_ROUTE = "/v1/run-keys"
#: A token's scopes: an event to send (no ``use`` claim, as tokens were first made), a stream to read.
USE_EVENT = "event"
USE_STREAM = "stream"
# A key id is a Secret entry's name that is not ``current``.
_KEY_ID = re.compile(r"^[A-Za-z0-9_.-]{1,63}$")


class TokenError(ValueError):
    """The token is malformed, tampered with, signed by an unknown key or expired.

    The ingress answers every case the same way: whoever holds a bad token learns nothing.
    """


@dataclass(frozen=True)
class Claims:
    namespace: str
    run: str
    uid: str  # the run's uid: a run deleted and created again under the same name is another run
    event: str
    expires: int  # Unix seconds
    key_id: str
    #: USE_EVENT (``event`` names the event) or USE_STREAM (``event`` names the stream).
    use: str = USE_EVENT

    def encode(self) -> bytes:
        fields: dict[str, str | int] = {"ns": self.namespace, "run": self.run, "uid": self.uid, "ev": self.event,
                                        "exp": self.expires, "kid": self.key_id}
        if self.use != USE_EVENT:  # an event token's bytes stay what they were before scopes
            fields["use"] = self.use
        return json.dumps(fields, separators=(",", ":"), sort_keys=True).encode()


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


def _unb64(text: str) -> bytes:
    return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))


def sign(claims: Claims, key: bytes) -> str:
    body = _b64(claims.encode())
    return body + "." + _b64(hmac.new(key, body.encode(), hashlib.sha256).digest())


def read_claims(token: str) -> Claims:
    """The token's claims, unverified: the ingress needs the namespace and key id to find the key."""
    body, dot, _ = token.partition(".")
    if not dot:
        raise TokenError("not a token")
    try:
        fields = json.loads(_unb64(body))
    except (binascii.Error, ValueError, RecursionError) as error:  # RecursionError: nested past json's stack
        raise TokenError("not a token") from error
    # Exactly the types sign() writes: anything else (an infinite or fractional expiry, a list) is no token.
    names = {"ns": str, "run": str, "uid": str, "ev": str, "exp": int, "kid": str}
    if not isinstance(fields, dict) or any(type(fields.get(name)) is not kind for name, kind in names.items()):
        raise TokenError("not a token")
    use = fields.get("use", USE_EVENT)
    if use not in (USE_EVENT, USE_STREAM):
        raise TokenError("not a token")
    return Claims(namespace=fields["ns"], run=fields["run"], uid=fields["uid"], event=fields["ev"],
                  expires=fields["exp"], key_id=fields["kid"], use=use)


def verify(token: str, keys: dict[str, bytes], now: datetime) -> Claims:
    """The claims of a token signed by one of ``keys`` (key id → key) and not expired at ``now``."""
    claims = read_claims(token)
    key = keys.get(claims.key_id)
    if key is None:
        raise TokenError("unknown key")
    body, _, signature = token.partition(".")
    expected = _b64(hmac.new(key, body.encode(), hashlib.sha256).digest())
    if not hmac.compare_digest(expected.encode(), signature.encode()):  # bytes: a caller's text may be any
        raise TokenError("bad signature")
    if now.timestamp() >= claims.expires:
        raise TokenError("expired")
    return claims


def hkdf_sha256(key: bytes, salt: bytes, info: bytes) -> bytes:
    """HKDF-SHA256 (RFC 5869) of ``key``: the first 32 bytes of output (one block of the expand step)."""
    prk = hmac.new(salt, key, hashlib.sha256).digest()  # extract
    return hmac.new(prk, info + b"\x01", hashlib.sha256).digest()  # expand


def derive_run_key(key: bytes, namespace: str, run: str, uid: str) -> bytes:
    """The run's own signing key: HKDF-SHA256 of a namespace ``key`` over the run's identity."""
    info = json.dumps([namespace, run, uid], separators=(",", ":")).encode()
    return hkdf_sha256(key, b"durablerun.dev/webhook-run-key", info)


def derive_stream_key(run_key: bytes) -> bytes:
    """The key a run's stream tokens are signed with: derived from its run key, so a stream token's signature
    never verifies as an event token's (and the other way round), whatever the claims say."""
    return hkdf_sha256(run_key, b"durablerun.dev/stream-read-key", b"stream")


def load_keys(entries: dict[str, bytes]) -> tuple[str, dict[str, bytes]]:
    """(current key id, key id → key) from a keys Secret's entries; ValueError naming what is wrong."""
    current = entries.get(CURRENT, b"").decode().strip()
    keys = {name: value for name, value in entries.items() if name != CURRENT and _KEY_ID.match(name)}
    if not current:
        raise ValueError(f"the webhook keys have no {CURRENT!r} entry naming the key to sign with")
    if current not in keys:
        raise ValueError(f"the webhook keys' {CURRENT!r} entry names key {current!r}, which they do not hold")
    if len(keys[current]) < 16:
        raise ValueError(f"webhook key {current!r} is shorter than 16 bytes: use at least 32 random bytes")
    return current, keys


def encode_key(key: bytes) -> str:
    """A run's key as the ingress's ``KEYS_ROUTE`` answers it (``{"kid": ..., "key": ...}``)."""
    return _b64(key)


def decode_key(text: str) -> bytes:
    return _unb64(text)


def url(base: str, token: str) -> str:
    """The capability URL the ingress serves for ``token``."""
    return f"{base.rstrip('/')}/v1/hooks/{quote(token, safe='.-_')}"


#: The ingress's route for a stream token (a GET answered as Server-Sent Events).
STREAMS_ROUTE = "/v1/streams/"


def stream_url(base: str, token: str) -> str:
    """The URL the ingress serves stream ``token``'s stream at."""
    return f"{base.rstrip('/')}{STREAMS_ROUTE}{quote(token, safe='.-_')}"
