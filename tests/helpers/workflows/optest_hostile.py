"""A hostile workflow (tests/security/test_hostile_tenant.py): with everything its runner's pod has, it tries what
a tenant must not do, and writes what each attempt got to its ledger file, one JSON line each.

Each attempt is a call any workflow can make: the in-cluster ServiceAccount token and the store credentials are
in its pod, as they are in every runner's. Nothing here goes through durable-run's own code.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from typing import Any

from durablerun import DurableContext, api

GROUP, VERSION, PLURAL = api.GROUP, api.VERSION, api.PLURAL


def _attempt(what: str, call: Callable[[], Any]) -> dict[str, Any]:
    """What one attempt got: allowed, or refused with the HTTP status and the server's reason."""
    from botocore.exceptions import ClientError
    from kubernetes.client.rest import ApiException

    try:
        call()
    except ApiException as error:
        try:
            message = json.loads(error.body or "{}").get("message", "")
        except ValueError:
            message = str(error.body)
        return {"attempt": what, "allowed": False, "status": error.status, "message": message[:500]}
    except ClientError as error:
        return {"attempt": what, "allowed": False, "status": error.response["ResponseMetadata"]["HTTPStatusCode"],
                "message": error.response["Error"].get("Code", "")}
    return {"attempt": what, "allowed": True}


def _attacks(input: dict[str, Any]) -> list[dict[str, Any]]:
    import boto3
    from kubernetes import client, config

    config.load_incluster_config()
    custom, core = client.CustomObjectsApi(), client.CoreV1Api()
    ns, me, victim = os.environ[api.Env.NAMESPACE], os.environ[api.Env.NAME], input["victim"]
    s3 = boto3.client("s3", endpoint_url=input["endpoint"], region_name="us-east-1")
    bucket, theirs, neighbour = input["bucket"], input["their_journal"], input["neighbour_journal"]

    def my_status(patch: dict[str, Any]) -> Callable[[], Any]:
        return lambda: custom.patch_namespaced_custom_object_status(GROUP, VERSION, ns, PLURAL, me, patch)

    mine = custom.get_namespaced_custom_object(GROUP, VERSION, ns, PLURAL, me)["status"]
    pod = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "hostile-pod"},
           "spec": {"containers": [{"name": "c", "image": "busybox"}]}}
    run = {"apiVersion": f"{GROUP}/{VERSION}", "kind": "DurableRun", "metadata": {"name": "hostile-child"},
           "spec": {"workflow": "m:f", "checkpoint": {"uri": f"s3://{bucket}/runs"}}}
    return [
        _attempt("read another run", lambda: custom.get_namespaced_custom_object(GROUP, VERSION, ns, PLURAL, victim)),
        _attempt("write another run's status", lambda: custom.patch_namespaced_custom_object_status(
            GROUP, VERSION, ns, PLURAL, victim, {"status": {"phase": "Succeeded"}})),
        _attempt("list the namespace's runs", lambda: custom.list_namespaced_custom_object(GROUP, VERSION, ns, PLURAL)),
        _attempt("change its own spec", lambda: custom.patch_namespaced_custom_object(
            GROUP, VERSION, ns, PLURAL, me, {"spec": {"suspend": True}})),
        _attempt("finish its own run (status.phase)", my_status({"status": {"phase": "Succeeded"}})),
        _attempt("take a newer attempt's epoch (status.epoch)", my_status({"status": {"epoch": mine["epoch"] + 1}})),
        _attempt("reset its restarts (status.restarts)", my_status({"status": {"restarts": 0, "attempt": 0}})),
        _attempt("pin its run to other code (status.pin)", my_status(
            {"status": {"pin": {"image": "evil@sha256:" + "e" * 64}}})),
        # Its active time is 0 in its first attempt: any write of it is the attack (later, lowering it would be).
        _attempt("rewrite its active time (status.activeSeconds)", my_status(
            {"status": {"activeSeconds": mine.get("activeSeconds", 0) + 3600}})),
        _attempt("create a pod", lambda: core.create_namespaced_pod(ns, pod)),
        _attempt("create a DurableRun", lambda: custom.create_namespaced_custom_object(
            GROUP, VERSION, ns, PLURAL, run)),
        _attempt("list Secrets", lambda: core.list_namespaced_secret(ns)),
        _attempt("read the store's Secret", lambda: core.read_namespaced_secret(input["secret"], ns)),
        _attempt("read Events", lambda: core.list_namespaced_event(ns)),
        _attempt("read another namespace's journal", lambda: s3.get_object(Bucket=bucket, Key=theirs)),
        _attempt("overwrite another namespace's journal", lambda: s3.put_object(Bucket=bucket, Key=theirs, Body=b"x")),
        _attempt("list another namespace's runs in the store", lambda: s3.list_objects_v2(
            Bucket=bucket, Prefix=theirs.rsplit("/", 3)[0] + "/")),
        _attempt("read a run's journal in its own namespace (same credentials)",
                 lambda: s3.get_object(Bucket=bucket, Key=neighbour)),
        # What it may do: its own run's status fields a runner writes.
        _attempt("report its own progress (status.progress)", my_status(
            {"status": {"progress": {**mine.get("progress", {}), "summary": "hostile"}}})),
    ]


def _record(path: str, tried: list[dict[str, Any]]) -> None:
    with open(path, "w") as out:
        out.writelines(json.dumps(line) + "\n" for line in tried)


async def attacks(ctx: DurableContext, input: dict[str, Any]) -> int:
    tried = await ctx.step("attack", _attacks, input)
    _record(input["ledger"], tried)
    return len(tried)
