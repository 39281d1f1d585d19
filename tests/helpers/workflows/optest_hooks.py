"""A workflow that hands out a capability URL and waits for an outside system to call it."""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

from optest_flows import _record

from durablerun import DurableContext, api, errors, webhooks
from durablerun._private.engine import webhook_urls


async def hooked(ctx: DurableContext, input: dict[str, Any]) -> Any:
    url = ctx.webhook_url("done", ttl=600)
    _record("url " + url)  # what a workflow would post to the outside system, in a step
    return await ctx.wait_for_event("done")


def _probe(victim: str, uid: str) -> None:
    base, namespace, name = (os.environ[k] for k in (api.Env.WEBHOOK_URL, api.Env.NAMESPACE, api.Env.NAME))
    token = Path(api.WEBHOOK_TOKEN_PATH).read_text().strip()
    key_id, key = webhook_urls.fetch_run_key(base, token, name)
    claims = webhooks.Claims(namespace=namespace, run=victim, uid=uid, event="done", expires=int(time.time()) + 600,
                             key_id=key_id)
    _record("forged " + webhooks.url(base, webhooks.sign(claims, key)))
    try:
        webhook_urls.fetch_run_key(base, token, victim)
        _record("victim key given")
    except errors.WorkflowError as error:
        _record(f"victim key refused: {error}")
    _record("namespace keys " + ("mounted" if Path(api.WEBHOOK_KEYS_PATH).exists() else "absent"))


async def forger(ctx: DurableContext, input: dict[str, Any]) -> Any:
    """A hostile workflow: it takes its own run's key and signs a URL for another run with it, asks the ingress
    for the other run's key, and looks for the namespace's keys where older operators mounted them."""
    _record("url " + ctx.webhook_url("done", ttl=600))
    await ctx.step("probe", _probe, input["victim"], input["uid"])
    return await ctx.wait_for_event("done")


async def streamed(ctx: DurableContext, input: dict[str, Any]) -> Any:
    """Hands out a URL that reads its stream ``notes``, writes one two-line chunk a step, and waits for event
    ``more`` after step ``pause_at`` (its pod ends: the rest is written by the next attempt's)."""
    _record("stream " + ctx.stream_url("notes", ttl=600))
    notes = ctx.stream("notes")

    def say(i: int) -> int:
        notes.write(f"note {i}\n  indented line of note {i}\n")
        return i

    for i in range(int(input["steps"])):
        await ctx.step(f"say-{i}", say, i)
        if i == int(input["pause_at"]):
            await ctx.wait_for_event("more")
    return "done"


async def flood(ctx: DurableContext, input: dict[str, Any]) -> Any:
    """Writes ``chunks`` chunks of ``size`` bytes to stream ``bulk`` in one step, then waits for event
    ``done`` (so the run is live while a reader is tested against it)."""
    _record("stream " + ctx.stream_url("bulk", ttl=600))
    bulk = ctx.stream("bulk")

    def pour() -> None:
        for i in range(int(input["chunks"])):
            bulk.write(f"{i:08d}".ljust(int(input["size"]), "x"))

    await ctx.step("pour", pour)
    return await ctx.wait_for_event("done")
