"""Server-side encryption: spec.checkpoint.serverSideEncryption / kmsKeyId reach every object the runner writes.

Against a MinIO with a KMS key (MINIO_KMS_SECRET_KEY), SSE-S3 (AES256) and
SSE-KMS (aws:kms with a key id) are applied to every object, as S3 reports on
HeadObject. Against a server that cannot encrypt, the run fails once with a
message saying so, never a restart loop (docs/security.md).
"""

from __future__ import annotations

import base64
import os

import pytest

from tests.helpers.bed import StartStore
from tests.helpers.runs import Operator, RunEnv
from tests.helpers.torture_runs import manifest, torture_input

pytestmark = pytest.mark.testbed

KEY_ID = "durablerun-key"


CASES = {"sse-s3": ("AES256", None), "sse-kms": ("aws:kms", KEY_ID)}


def test_every_object_is_encrypted_as_asked(operator: Operator, runs: RunEnv, dedicated_store: StartStore) -> None:
    store = dedicated_store(MINIO_KMS_SECRET_KEY=f"{KEY_ID}:{base64.b64encode(os.urandom(32)).decode()}")
    for name, (sse, key) in CASES.items():
        body = store.use(manifest(runs, name, input=torture_input(name, rounds=1, pace=0.05),
                                  policy={"backoff": {"initial": "1s", "max": "1s"}}))
        body["spec"]["checkpoint"]["serverSideEncryption"] = sse
        if key:
            body["spec"]["checkpoint"]["kmsKeyId"] = key
        body["spec"]["checkpoint"]["snapshotEvery"] = 3  # chunks and the pointer too
        runs.apply(body)
    s3 = store.server.client()
    for name, (sse, key) in CASES.items():
        status = runs.wait_phase(name, "Succeeded", "Failed", "Aborted", timeout=90)["status"]
        assert status["phase"] == "Succeeded", status.get("message")
        keys = [o["Key"] for o in s3.list_objects_v2(Bucket=store.bucket, Prefix=f"runs/{runs.namespace}/{name}/")
                ["Contents"]]
        kinds = {k.split("/")[-2] if k.count("/") > 4 else k.rsplit("/", 1)[1] for k in keys}
        assert {"journal", "chunks", "manifest.json", "snapshot.json", "status.json"} <= kinds, kinds
        for k in keys:
            head = s3.head_object(Bucket=store.bucket, Key=k)
            assert head.get("ServerSideEncryption") == sse, (k, head.get("ServerSideEncryption"))
            if key:
                assert key in str(head.get("SSEKMSKeyId")), (k, head.get("SSEKMSKeyId"))


def test_encryption_the_server_cannot_do_fails_once_and_says_so(operator: Operator, runs: RunEnv) -> None:
    body = manifest(runs, "nokms", input=torture_input("nokms", rounds=1))
    body["spec"]["checkpoint"]["serverSideEncryption"] = "AES256"  # the shared MinIO has no KMS
    runs.apply(body)
    status = runs.wait_phase("nokms", "Succeeded", "Failed", "Aborted", timeout=90)["status"]
    assert status["phase"] == "Failed", status
    assert status["restarts"] == 0
    assert status["attempt"] == 1
    assert "KMS is not configured" in status["message"]
    assert "serverSideEncryption" in status["message"]
