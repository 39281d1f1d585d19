"""Workflows the real-node tests run, from a workflow image built FROM the runner image.

Every execution of a step leaves a marker object in S3 naming the attempt
(epoch) that ran it: the runs' namespaces enforce the `restricted` Pod Security
Standard, so there is no hostPath ledger; the markers, outside every container,
show which steps a resumed attempt did not run again.
"""

from __future__ import annotations

import os
import time
import uuid
from typing import Any

import boto3

from durablerun import DurableContext, api


def _mark(input: dict[str, Any], name: str) -> None:
    s3 = boto3.client("s3", endpoint_url=input["endpoint"], region_name="us-east-1")
    epoch = os.environ[api.Env.EPOCH]
    prefix = input.get("marks", "executions")  # one per run when several runs share the bucket
    s3.put_object(Bucket=input["bucket"], Key=f"{prefix}/{name}/{epoch}-{uuid.uuid4().hex}", Body=b"")


def work(input: dict[str, Any], name: str) -> str:
    _mark(input, name)
    print(f"executing {name}", flush=True)
    time.sleep(float(input.get("sleep", 0.5)))
    return name.upper()


async def steps(ctx: DurableContext, input: dict[str, Any]) -> dict[str, Any]:
    """``input.steps`` steps of ``input.sleep`` seconds each."""
    results = [await ctx.step(f"s{i}", work, input, f"s{i}") for i in range(int(input["steps"]))]
    return {"results": results}


def hog(input: dict[str, Any], name: str) -> str:
    """In the first attempt, allocate past the container's memory limit: the kernel kills it."""
    _mark(input, name)
    if os.environ[api.Env.EPOCH] == "1":
        chunks = []
        for _ in range(int(input["mb"])):
            chunks.append(bytearray(1 << 20))  # touched pages: resident memory
    return name.upper()


async def oom(ctx: DurableContext, input: dict[str, Any]) -> dict[str, Any]:
    """A step, then one that is OOM-killed in the first attempt, then a last step."""
    first = await ctx.step("before", work, input, "before")
    hungry = await ctx.step("hungry", hog, input, "hungry")
    last = await ctx.step("after", work, input, "after")
    return {"results": [first, hungry, last]}


async def approval(ctx: DurableContext, input: dict[str, Any]) -> dict[str, Any]:
    """A step, a wait for the `go` event (no pod runs meanwhile), a step."""
    await ctx.step("draft", work, input, "draft")
    decision = await ctx.wait_for_event("go")
    await ctx.step("publish", work, input, "publish")
    return {"decision": decision}
