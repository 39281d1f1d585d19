"""A workflow that handles a secret (tests/security/test_span_secrets.py): in its input, a step's result, a step's
error and an event's payload, and at the end in the exception it fails with."""

from __future__ import annotations

import contextlib
from typing import Any

from durablerun import DurableContext, errors


def _fails(secret: str) -> None:
    raise errors.NonRetryableError("the key was " + secret)


def _holds(secret: str) -> str:
    return secret


async def leaky(ctx: DurableContext, input: dict[str, Any]) -> Any:
    await ctx.step(input["visible"], _holds, input["secret"])
    with contextlib.suppress(errors.StepError):
        await ctx.step("fails", _fails, input["secret"])
    payload = await ctx.wait_for_event("approve")
    raise RuntimeError("gave up; the key was " + payload["note"])
