"""The two S3 facts the journal's fencing rests on, shown on the real MinIO."""

from __future__ import annotations

import pytest
from botocore.exceptions import ClientError

from durablerun_testbed.s3 import S3Server


def _status(error: ClientError) -> int:
    return int(error.response["ResponseMetadata"]["HTTPStatusCode"])


def test_if_none_match_refuses_an_existing_key(s3_server: S3Server, s3_bucket: str) -> None:
    s3 = s3_server.client()
    s3.put_object(Bucket=s3_bucket, Key="journal/0.json", Body=b"first", IfNoneMatch="*")
    with pytest.raises(ClientError) as caught:
        s3.put_object(Bucket=s3_bucket, Key="journal/0.json", Body=b"second", IfNoneMatch="*")
    assert _status(caught.value) == 412
    assert s3.get_object(Bucket=s3_bucket, Key="journal/0.json")["Body"].read() == b"first"


def test_if_match_refuses_a_stale_etag(s3_server: S3Server, s3_bucket: str) -> None:
    s3 = s3_server.client()
    first = s3.put_object(Bucket=s3_bucket, Key="snapshot", Body=b"v1")["ETag"]
    second = s3.put_object(Bucket=s3_bucket, Key="snapshot", Body=b"v2", IfMatch=first)["ETag"]
    with pytest.raises(ClientError) as caught:
        s3.put_object(Bucket=s3_bucket, Key="snapshot", Body=b"v3", IfMatch=first)
    assert _status(caught.value) == 412
    assert s3.head_object(Bucket=s3_bucket, Key="snapshot")["ETag"] == second
    assert s3.get_object(Bucket=s3_bucket, Key="snapshot")["Body"].read() == b"v2"
