"""Version 2 of ../workflows/upgrade_flows.py: ``kept`` replays version 1's journals, ``renamed`` diverges."""

from __future__ import annotations

import os
import uuid
from typing import Any

import boto3

from durablerun import DurableContext, api

CODE = "v2"


def work(input: dict[str, Any], name: str) -> str:
    """As version 1's (realnode_flows.work): a marker in S3 per execution, naming the attempt."""
    s3 = boto3.client("s3", endpoint_url=input["endpoint"], region_name="us-east-1")
    key = f"{input.get('marks', 'executions')}/{name}/{os.environ[api.Env.EPOCH]}-{uuid.uuid4().hex}"
    s3.put_object(Bucket=input["bucket"], Key=key, Body=b"")
    return name.upper()


async def kept(ctx: DurableContext, input: dict[str, Any]) -> dict[str, Any]:
    await ctx.step("draft", work, input, "draft")
    await ctx.wait_for_event("go")
    await ctx.step("publish", work, input, "publish")
    return {"code": CODE}


async def renamed(ctx: DurableContext, input: dict[str, Any]) -> dict[str, Any]:
    """Its first step renamed: a run that journaled version 1's `draft` cannot continue with this code."""
    await ctx.step("outline", work, input, "outline")
    await ctx.wait_for_event("go")
    await ctx.step("publish", work, input, "publish")
    return {"code": CODE}
