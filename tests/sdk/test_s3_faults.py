"""S3 behaviour under faults, against the real MinIO (faults injected in botocore's event hooks)."""

from __future__ import annotations

from typing import Any

import botocore.exceptions
import pytest

from durablerun import errors
from durablerun._private.backends.options import S3Options
from durablerun._private.backends.s3 import S3Backend
from durablerun._private.journal import Record
from durablerun.stores import RunRef, Store

from .conftest import StoreSpec

REF = RunRef.local("faults")


def _store(spec: StoreSpec, **overrides: Any) -> tuple[Store, S3Backend]:
    base = spec.open().backend
    assert isinstance(base, S3Backend)
    backend = S3Backend(base.bucket, base.prefix,
                        S3Options(**{**base.options.__dict__, **overrides}))
    return Store(backend, spec.uri), backend


def _rec(seq: int) -> Record:
    return Record(seq, {"seq": seq, "pos": str(seq), "kind": "step", "name": f"s{seq}",
                        "ok": True, "value": seq, "w": "me"})


def test_a_write_whose_response_was_lost_is_not_mistaken_for_a_loss(s3_spec: StoreSpec) -> None:
    """The PUT lands, the response is lost, the retry gets 412 for our own bytes:
    that is success, not fencing."""
    store, backend = _store(s3_spec, unreachable_retries=3)
    lost = {"n": 0}

    def lose_response(**kwargs: Any) -> None:
        if lost["n"] < 1:
            lost["n"] += 1
            raise botocore.exceptions.ConnectionClosedError(endpoint_url="lost response")

    backend._client.meta.events.register("after-call.s3.PutObject", lose_response)
    rs = store.run_store(REF)
    rs.load(for_writing=True)
    rs.append(_rec(0))  # no FencedError
    assert lost["n"] == 1
    assert [r.seq for r in rs.load().records] == [0]
    assert store.put_event(run=REF, name="e", payload=1) is True


def test_a_briefly_unreachable_server_is_retried_with_backoff(s3_spec: StoreSpec) -> None:
    store, backend = _store(s3_spec, unreachable_retries=4)
    failures = {"n": 0}

    def unreachable(**kwargs: Any) -> None:
        if failures["n"] < 2:
            failures["n"] += 1
            raise botocore.exceptions.EndpointConnectionError(endpoint_url="http://down")

    backend._client.meta.events.register("before-send.s3.PutObject", unreachable)
    rs = store.run_store(REF)
    rs.load(for_writing=True)
    rs.append(_rec(0))
    assert failures["n"] == 2


def test_a_server_that_stays_down_is_store_unavailable(s3_spec: StoreSpec) -> None:
    store, backend = _store(s3_spec, unreachable_retries=1, max_attempts=1)

    def down(**kwargs: Any) -> None:
        raise botocore.exceptions.EndpointConnectionError(endpoint_url="http://down")

    backend._client.meta.events.register("before-send.s3", down)
    with pytest.raises(errors.StoreUnavailableError) as e:
        store.run_store(REF).load()
    assert "could not be reached" in str(e.value)
    assert s3_spec.options["secret_key"] not in str(e.value)


def test_server_side_encryption_is_requested_on_every_write(s3_spec: StoreSpec) -> None:
    _, backend = _store(s3_spec, server_side_encryption="aws:kms", kms_key_id="key-1",
                        unreachable_retries=0, max_attempts=1)
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
