"""S3 behaviour under faults, against the real MinIO (faults injected in botocore's event hooks)."""

from __future__ import annotations

import time
from typing import Any

import botocore.awsrequest
import botocore.exceptions
import pytest

from durablerun import errors
from durablerun._private.records.model import Record, StepRecord
from durablerun._private.storage.backends.options import DEFAULT_MAX_ATTEMPTS, S3Options
from durablerun._private.storage.backends.s3 import S3Backend
from durablerun.stores import RunRef, Store
from tests.helpers.local_runs import StoreSpec

REF = RunRef.local("faults")


def _store(spec: StoreSpec, **overrides: Any) -> tuple[Store, S3Backend]:
    base = spec.open().backend
    assert isinstance(base, S3Backend)
    backend = S3Backend(base.bucket, base.prefix,
                        S3Options(**{**base.options.__dict__, **overrides}))
    return Store(backend, spec.uri), backend


def _rec(seq: int) -> Record:
    return StepRecord(seq=seq, pos=str(seq), name=f"s{seq}", value=seq, w="me")


def test_a_write_whose_response_was_lost_is_not_mistaken_for_a_loss(s3_spec: StoreSpec) -> None:
    """The PUT lands, the connection drops before the response: botocore retries it, the retry gets 412
    for our own bytes, and that is success, not fencing."""
    store, backend = _store(s3_spec)
    lost = {"n": 0}

    def land_then_lose_the_response(request: Any, **kwargs: Any) -> None:
        if lost["n"] < 1:
            lost["n"] += 1
            backend._client._endpoint.http_session.send(request)  # the write lands ...
            raise botocore.exceptions.ConnectionClosedError(endpoint_url="lost response")  # ... unanswered

    backend._client.meta.events.register("before-send.s3.PutObject", land_then_lose_the_response)
    rs = store.run_store(REF)
    rs.load(for_writing=True)
    rs.append(_rec(0))  # no FencedError
    assert lost["n"] == 1
    assert [r.seq for r in rs.load().records] == [0]
    assert store.put_event(run=REF, name="e", payload=1) is True


def _sends(backend: S3Backend, fail: int | None = None) -> list[int]:
    """Counts HTTP attempts of PutObject; the first ``fail`` (all if None) cannot reach the server."""
    sent: list[int] = []

    def unreachable(**kwargs: Any) -> None:
        sent.append(1)
        if fail is None or len(sent) <= fail:
            raise botocore.exceptions.EndpointConnectionError(endpoint_url="http://down")

    backend._client.meta.events.register("before-send.s3.PutObject", unreachable)
    return sent


def test_a_briefly_unreachable_server_is_retried_by_botocore(s3_spec: StoreSpec) -> None:
    store, backend = _store(s3_spec)
    sent = _sends(backend, fail=2)
    rs = store.run_store(REF)
    rs.load(for_writing=True)
    rs.append(_rec(0))
    assert len(sent) == 3


@pytest.mark.parametrize(("env", "options", "attempts"), [
    ({}, {}, DEFAULT_MAX_ATTEMPTS),
    ({"AWS_MAX_ATTEMPTS": "2"}, {}, 2),
    ({"AWS_MAX_ATTEMPTS": "2"}, {"max_attempts": 3}, 3),
], ids=["default", "AWS_MAX_ATTEMPTS", "explicit-option-wins"])
def test_one_retry_layer_tuned_by_the_aws_configuration(
    s3_spec: StoreSpec, monkeypatch: pytest.MonkeyPatch, env: dict[str, str], options: dict[str, Any], attempts: int
) -> None:
    """A server that stays down gets exactly the configured number of HTTP attempts, then StoreUnavailable."""
    monkeypatch.delenv("AWS_MAX_ATTEMPTS", raising=False)
    monkeypatch.setenv("AWS_RETRY_MODE", "standard")
    monkeypatch.setattr(time, "sleep", lambda seconds: None)  # botocore's backoff, not what is tested
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    _, backend = _store(s3_spec, **options)
    sent = _sends(backend)
    with pytest.raises(errors.StoreUnavailableError) as e:
        backend.put("x.json", b"{}")
    assert len(sent) == attempts
    assert "could not be reached" in str(e.value)
    assert s3_spec.options["secret_key"] not in str(e.value)


def test_the_region_comes_from_boto3s_chain(s3_spec: StoreSpec, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("AWS_REGION", raising=False)
    monkeypatch.setenv("AWS_DEFAULT_REGION", "eu-west-3")  # boto3's own variable
    _, backend = _store(s3_spec, region=None)
    assert backend._client.meta.region_name == "eu-west-3"
    _, explicit = _store(s3_spec, region="ap-south-1")
    assert explicit._client.meta.region_name == "ap-south-1"


def test_a_conditional_write_that_gets_409_is_retried(s3_spec: StoreSpec) -> None:
    """409 ConditionalRequestConflict (a concurrent conditional write): retried by the store, not by botocore."""
    store, backend = _store(s3_spec)
    conflicts = {"n": 0}

    class Raw:
        def stream(self, **kwargs: Any) -> Any:
            yield (b"<Error><Code>ConditionalRequestConflict</Code>"
                   b"<Message>A conflicting conditional operation is in progress.</Message></Error>")

    def conflict(request: Any, **kwargs: Any) -> Any:
        if conflicts["n"] < 2:
            conflicts["n"] += 1
            return botocore.awsrequest.AWSResponse(request.url, 409, {}, Raw())
        return None

    backend._client.meta.events.register("before-send.s3.PutObject", conflict)
    rs = store.run_store(REF)
    rs.load(for_writing=True)
    rs.append(_rec(0))
    assert conflicts["n"] == 2
    assert [r.seq for r in rs.load().records] == [0]


@pytest.mark.parametrize(("status", "code"), [(499, "ClientDisconnected"), (429, "SlowDown"),
                                            (408, "RequestTimeout")])
def test_a_server_that_drops_or_throttles_a_write_is_unavailable_not_a_failure(
        s3_spec: StoreSpec, status: int, code: str) -> None:
    """MinIO answers 499 ClientDisconnected to a request cut off as it goes down: the attempt must crash and be
    restarted (StoreUnavailableError), not fail the run for good."""
    store, backend = _store(s3_spec, max_attempts=1)

    class Raw:
        def stream(self, **kwargs: Any) -> Any:
            yield f"<Error><Code>{code}</Code><Message>cut off</Message></Error>".encode()

    def refuse(request: Any, **kwargs: Any) -> Any:
        return botocore.awsrequest.AWSResponse(request.url, status, {}, Raw())

    rs = store.run_store(REF)
    rs.load(for_writing=True)
    backend._client.meta.events.register("before-send.s3.PutObject", refuse)
    with pytest.raises(errors.StoreUnavailableError, match=code):
        rs.append(_rec(0))


def test_server_side_encryption_is_requested_on_every_write(s3_spec: StoreSpec) -> None:
    _, backend = _store(s3_spec, server_side_encryption="aws:kms", kms_key_id="key-1", max_attempts=1)
    seen: list[dict[str, str]] = []

    def capture(request: Any, **kwargs: Any) -> None:
        seen.append(dict(request.headers))
        raise botocore.exceptions.EndpointConnectionError(endpoint_url="stop here")

    backend._client.meta.events.register("before-send.s3.PutObject", capture)
    with pytest.raises(errors.StoreUnavailableError):
        backend.put("x.json", b"{}")
    assert seen
    headers = {k.lower(): v.decode() if isinstance(v, bytes) else v for k, v in seen[0].items()}
    assert headers["x-amz-server-side-encryption"] == "aws:kms"
    assert headers["x-amz-server-side-encryption-aws-kms-key-id"] == "key-1"
