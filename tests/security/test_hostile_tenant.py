"""A hostile tenant: a workflow that uses everything its runner's pod has against the rest of the cluster.

The workflow (tests/helpers/workflows/optest_hostile.py) runs as any run does, with its run's ServiceAccount token
(mounted by the node, bound to its pod) and store credentials scoped to its namespace's prefix, as a per-tenant
store user or workload identity would be (here: MinIO's STS AssumeRole with a session policy). It tries to read
and write another run and its status, to finish its own run, take a newer attempt's epoch, reset its restarts,
move its pin, rewrite its active time, create pods and DurableRuns, read Secrets and Events, and read, overwrite
and list another namespace's journal. Each attempt's answer is what the workflow itself recorded, in its ledger
file; each must be refused, by the API server (RBAC, or the runner-status admission policy naming the field) or
by the store. What it may do is checked allowed, as docs/security.md's threat model says: report its own
progress, read the runs of its namespace (the namespace's runner Role), and read a journal of its own namespace
written with the same credentials.
"""

from __future__ import annotations

import json
import secrets
import uuid
from typing import Any

import boto3
import pytest

from durablerun import api
from tests.helpers.failing_runs import objects, root_of
from tests.helpers.runs import RunEnv, StartOperator

pytestmark = pytest.mark.testbed

FORBIDDEN = 403
INVALID = 422  # the runner-status admission policy: a runner's write it refuses, as a failed test op would be

#: attempt -> (allowed, HTTP status, a phrase of the refusal). Every attempt the workflow makes is listed here.
EXPECTED: dict[str, tuple[bool, int | None, str]] = {
    "read another run": (True, None, ""),  # in the namespace's access; forbidden in per-run access (below)
    "write another run's status": (False, INVALID, "only the run's current attempt"),
    "list the namespace's runs": (False, FORBIDDEN, "forbidden"),
    "change its own spec": (False, FORBIDDEN, "forbidden"),
    "finish its own run (status.phase)": (False, INVALID, "status.phase is the operator's"),
    "take a newer attempt's epoch (status.epoch)": (False, INVALID, "status.epoch is the operator's"),
    "reset its restarts (status.restarts)": (False, INVALID, "is the operator's"),
    "pin its run to other code (status.pin)": (False, INVALID, "status.pin is the operator's"),
    "rewrite its active time (status.activeSeconds)": (False, INVALID, "status.activeSeconds is the operator's"),
    "create a pod": (False, FORBIDDEN, "forbidden"),
    "create a DurableRun": (False, FORBIDDEN, "forbidden"),
    "list Secrets": (False, FORBIDDEN, "forbidden"),
    "read the store's Secret": (False, FORBIDDEN, "forbidden"),
    "read Events": (False, FORBIDDEN, "forbidden"),
    "read another namespace's journal": (False, FORBIDDEN, "AccessDenied"),
    "overwrite another namespace's journal": (False, FORBIDDEN, "AccessDenied"),
    "list another namespace's runs in the store": (False, FORBIDDEN, "AccessDenied"),
    "read a run's journal in its own namespace (same credentials)": (True, None, ""),
    "report its own progress (status.progress)": (True, None, ""),
}


def scoped_credentials(runs: RunEnv, prefix: str) -> dict[str, str]:
    """Temporary credentials that reach only ``prefix`` of the runs' bucket: STS AssumeRole with a session policy
    (MinIO's, as AWS's), what a per-tenant IAM role or store user grants."""
    s3 = runs.testbed.s3
    assert s3
    arn = f"arn:aws:s3:::{runs.bucket}"
    policy = {"Version": "2012-10-17", "Statement": [
        {"Effect": "Allow", "Action": ["s3:GetObject", "s3:PutObject", "s3:DeleteObject"],
         "Resource": [f"{arn}/{prefix}*"]},
        {"Effect": "Allow", "Action": ["s3:ListBucket"], "Resource": [arn],
         "Condition": {"StringLike": {"s3:prefix": [f"{prefix}*"]}}},
    ]}
    sts = boto3.client("sts", endpoint_url=s3.endpoint_url, region_name=s3.region,
                       aws_access_key_id=s3.access_key, aws_secret_access_key=s3.secret_key)
    granted = sts.assume_role(RoleArn="arn:aws:iam::000000000000:role/tenant", RoleSessionName="tenant",
                              Policy=json.dumps(policy), DurationSeconds=3600)["Credentials"]
    return {"AWS_ACCESS_KEY_ID": granted["AccessKeyId"], "AWS_SECRET_ACCESS_KEY": granted["SecretAccessKey"],
            "AWS_SESSION_TOKEN": granted["SessionToken"]}


@pytest.mark.parametrize("access", [api.RUNNER_ACCESS_NAMESPACE, api.RUNNER_ACCESS_RUN])
def test_a_hostile_workflow_is_refused_everything_beyond_its_own_run(
    start_operator: StartOperator, runs: RunEnv, access: str
) -> None:
    # The namespace's runner account may read its neighbours (the namespace is the tenant boundary); a run's own
    # account (runnerAccess: run) may not even do that. Everything else is refused alike.
    expected = dict(EXPECTED)
    if access == api.RUNNER_ACCESS_RUN:  # RBAC refuses both before the runner-status policy is asked
        expected["read another run"] = expected["write another run's status"] = (False, FORBIDDEN, "forbidden")
    start_operator(**{api.OperatorEnv.RUNNER_ACCESS: access})
    assert runs.testbed.s3
    ns, admin = runs.namespace, runs.testbed.s3.client()
    # Another tenant's journal in the same bucket, and a neighbour run of this namespace (waiting, with a journal).
    theirs = f"runs/other-{ns}/victim/{uuid.uuid4()}/journal/000000000000.json"
    secret_journal = secrets.token_hex(16).encode()
    admin.put_object(Bucket=runs.bucket, Key=theirs, Body=secret_journal)
    runs.apply(runs.manifest("victim", "optest_flows:approval"))
    runs.wait_phase("victim", "Waiting", timeout=120)
    neighbour = next(root_of(runs, "victim") + key for key in objects(runs, "victim") if key.startswith("journal/"))

    scoped = scoped_credentials(runs, f"runs/{ns}/")
    runs.testbed.kubectl("create", "secret", "generic", "tenant-store", "-n", ns,
                         *(f"--from-literal={k}={v}" for k, v in scoped.items()))
    ledger = "/tmp/ledger/hostile.json"  # the workflow's own record, in a directory the test reads
    body = runs.manifest("hostile", "optest_hostile:attacks", input={
        "victim": "victim", "bucket": runs.bucket, "endpoint": runs.testbed.s3.endpoint_url,
        "their_journal": theirs, "neighbour_journal": neighbour, "secret": "s3-credentials", "ledger": ledger})
    body["spec"]["checkpoint"]["credentialsSecret"] = "tenant-store"
    runs.apply(body)
    status = runs.wait_phase("hostile", "Succeeded", "Failed", "Aborted", timeout=120)["status"]
    assert status["phase"] == "Succeeded", status.get("message")  # its own journal works with scoped credentials

    tried = [json.loads(line) for line in (runs.ledger_dir / "hostile.json").read_text().splitlines()]
    got: dict[str, dict[str, Any]] = {t["attempt"]: t for t in tried}
    assert set(got) == set(expected), set(got) ^ set(expected)
    wrong = {}
    for what, (allowed, code, phrase) in expected.items():
        answer = got[what]
        if answer["allowed"] != allowed or (not allowed and (answer["status"] != code
                                                             or phrase.lower() not in answer["message"].lower())):
            wrong[what] = answer
    assert not wrong, json.dumps(wrong, indent=1)
    print("\n".join(f"{t['attempt']}: " + ("allowed" if t["allowed"] else f"refused {t['status']} {t['message'][:90]}")
                    for t in tried))

    # Nothing it was refused happened after all.
    assert admin.get_object(Bucket=runs.bucket, Key=theirs)["Body"].read() == secret_journal
    victim = runs.get("victim")
    assert victim["status"]["phase"] == "Waiting"
    hostile = runs.get("hostile")
    assert hostile["spec"].get("suspend") is not True
    assert (hostile["status"]["attempt"], hostile["status"]["restarts"]) == (1, 0)
    assert "pin" not in hostile["status"]
    assert runs.testbed.kubectl("get", "pod", "hostile-pod", "-n", ns, check=False).returncode != 0
    assert runs.testbed.kubectl("get", "dr", "hostile-child", "-n", ns, check=False).returncode != 0
