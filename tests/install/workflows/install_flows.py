"""The workflow the install test runs through the chart's operator.

Each execution of a step leaves a marker object in S3 naming the attempt
(epoch) that ran it: the run's namespace is `restricted`, so no hostPath
ledger; the markers show which steps a resumed attempt did not run again.
"""

from __future__ import annotations

import os
import time
import uuid
from typing import Any

import boto3

from durablerun import DurableContext, api


def work(input: dict[str, Any], name: str) -> str:
    s3 = boto3.client("s3", endpoint_url=input["endpoint"], region_name="us-east-1")
    epoch = os.environ[api.Env.EPOCH]
    s3.put_object(Bucket=input["bucket"], Key=f"executions/{name}/{epoch}-{uuid.uuid4().hex}", Body=b"")
    time.sleep(float(input["sleep"]))
    return name.upper()


async def steps(ctx: DurableContext, input: dict[str, Any]) -> dict[str, Any]:
    """``input.steps`` steps of ``input.sleep`` seconds each."""
    results = [await ctx.step(f"s{i}", work, input, f"s{i}") for i in range(int(input["steps"]))]
    return {"results": results}
