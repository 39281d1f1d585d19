"""Signing capability URLs in a runner pod (``ctx.webhook_url``, ``ctx.stream_url``): the run's own key, fetched
from the webhook ingress with the pod's ServiceAccount token, and the URL signed with it. The token format is
the contract's (:mod:`durablerun.webhooks`); this is the pod's side of it, with its file and network IO."""

from __future__ import annotations

import binascii
import json
import time
import urllib.error
import urllib.request
from collections.abc import Mapping
from datetime import datetime, timedelta
from pathlib import Path

from durablerun import api, errors
from durablerun.webhooks import (
    KEYS_ROUTE,
    USE_STREAM,
    Claims,
    decode_key,
    derive_run_key,
    derive_stream_key,
    load_keys,
    sign,
    stream_url,
    url,
)


def read_key_dir(directory: Path) -> tuple[str, dict[str, bytes]]:
    """The keys as the kubelet mounts the Secret: one file per entry."""
    entries = {p.name: p.read_bytes().strip() for p in directory.iterdir()
               if p.is_file() and not p.name.startswith(".")}
    return load_keys(entries)


def fetch_run_key(base: str, token: str, run: str, timeout: float = 5.0) -> tuple[str, bytes]:
    """(key id, key) of ``run``, from the ingress at ``base``, for the pod whose ServiceAccount ``token`` this
    is; WorkflowError naming why not."""
    request = urllib.request.Request(
        f"{base.rstrip('/')}{KEYS_ROUTE}", data=json.dumps({"run": run}).encode(), method="POST",
        headers={"Authorization": f"Bearer {token}", "Content-Type": "application/json"})
    last: Exception | None = None
    for pause in (0.5, 1.0, 2.0, 0.0):  # a restarting ingress: a few tries before the workflow sees it
        try:
            with urllib.request.urlopen(request, timeout=timeout) as reply:
                answer = json.loads(reply.read())
            return str(answer["kid"]), decode_key(str(answer["key"]))
        except urllib.error.HTTPError as error:
            if error.code < 500 and error.code != 429:
                raise errors.WorkflowError(
                    f"ctx.webhook_url: the webhook ingress at {base} refused this pod its run's key "
                    f"(HTTP {error.code}); its log says why") from None
            last = error
        except (OSError, ValueError, KeyError, binascii.Error) as error:
            last = error
        time.sleep(pause)
    raise errors.WorkflowError(f"ctx.webhook_url: the webhook ingress at {base} did not give this pod its "
                               f"run's key: {last}")


def _run_key(what: str, environ: Mapping[str, str]) -> tuple[str, str, str, str, str, bytes]:
    """(base URL, namespace, run, uid, key id, run key) of the run this pod runs, for ``what`` (the call that
    signs); ``WorkflowError`` saying what to set when the webhook ingress is not configured here."""
    base = environ.get(api.Env.WEBHOOK_URL, "")
    namespace, run = environ.get(api.Env.NAMESPACE, ""), environ.get(api.Env.NAME, "")
    uid = environ.get(api.Env.UID, "")
    if not base or not namespace or not run or not uid:
        raise errors.WorkflowError(
            f"{what} needs the webhook ingress: run the workflow as a DurableRun with the chart's "
            f"webhooks.enabled=true and webhooks.url set (the operator then sets {api.Env.WEBHOOK_URL})")
    token_path, keys_dir = Path(api.WEBHOOK_TOKEN_PATH), Path(api.WEBHOOK_KEYS_PATH)
    if token_path.is_file():
        key_id, key = fetch_run_key(base, token_path.read_text().strip(), run)
    elif keys_dir.is_dir():  # a pod of an older operator, which mounted the namespace's keys
        try:
            key_id, keys = read_key_dir(keys_dir)
        except ValueError as error:
            raise errors.WorkflowError(f"{what}: Secret {api.WEBHOOK_KEYS_SECRET!r}: {error}") from None
        key = keys[key_id]
        if what != "ctx.webhook_url":  # stream tokens have no namespace-key fallback: sign as the ingress derives
            key = derive_run_key(key, namespace, run, uid)
    else:
        raise errors.WorkflowError(
            f"{what}: no ServiceAccount token for the webhook ingress at {token_path}: this pod was not "
            "made by the durable-run operator with the chart's webhooks.enabled=true")
    return base, namespace, run, uid, key_id, key


def capability_url(event: str, lifetime: timedelta, environ: Mapping[str, str], now: datetime) -> str:
    """A capability URL for ``event`` of the run this pod runs, signed with the run's own key.

    Raises ``WorkflowError`` saying what to set when the webhook ingress is not configured here.
    """
    base, namespace, run, uid, key_id, key = _run_key("ctx.webhook_url", environ)
    claims = Claims(namespace=namespace, run=run, uid=uid, event=event, expires=int((now + lifetime).timestamp()),
                    key_id=key_id)
    return url(base, sign(claims, key))


def stream_capability_url(stream: str, lifetime: timedelta, environ: Mapping[str, str], now: datetime) -> str:
    """A URL that reads output stream ``stream`` of the run this pod runs (Server-Sent Events), signed with the
    run's stream key: it reads that stream only, and sends no event."""
    base, namespace, run, uid, key_id, key = _run_key("ctx.stream_url", environ)
    claims = Claims(namespace=namespace, run=run, uid=uid, event=stream, expires=int((now + lifetime).timestamp()),
                    key_id=key_id, use=USE_STREAM)
    return stream_url(base, sign(claims, derive_stream_key(key)))
