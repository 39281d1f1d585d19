"""Fixtures of the SDK tests: one store matrix (memory, filesystem, real MinIO)."""

from __future__ import annotations

import sys
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from durablerun._private.backends import memory
from durablerun.stores import Store, open_store

from .helpers import REPO, WORKFLOWS, StoreSpec

# Test workflows and the examples import by their own names, as `durablerun run` does.
for _path in (str(WORKFLOWS), str(REPO / "examples")):
    if _path not in sys.path:
        sys.path.insert(0, _path)


@pytest.fixture
def mem() -> Iterator[Store]:
    """A fresh in-memory store, dropped after the test."""
    name = uuid.uuid4().hex
    yield open_store(f"memory://{name}")
    memory.reset(name)


def _s3_spec(request: pytest.FixtureRequest) -> StoreSpec:
    server = request.getfixturevalue("s3_server")
    bucket = request.getfixturevalue("s3_bucket")
    env = {
        "AWS_ACCESS_KEY_ID": server.access_key,
        "AWS_SECRET_ACCESS_KEY": server.secret_key,
        "AWS_REGION": server.region,
        "AWS_ENDPOINT_URL_S3": server.endpoint_url,
    }
    options = {
        "endpoint_url": server.endpoint_url,
        "region": server.region,
        "access_key": server.access_key,
        "secret_key": server.secret_key,
    }
    return StoreSpec("s3", f"s3://{bucket}/runs", env, ["--endpoint-url", server.endpoint_url],
                     options)


@pytest.fixture(params=["memory", "fs", "s3"])
def store_spec(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[StoreSpec]:
    """The same test against every store: in-memory, filesystem, and S3 on real MinIO."""
    kind = request.param
    if kind == "memory":
        name = uuid.uuid4().hex
        yield StoreSpec("memory", f"memory://{name}", {}, [], {})
        memory.reset(name)
    elif kind == "fs":
        yield StoreSpec("fs", f"file://{tmp_path / 'store'}", {}, [], {})
    else:
        yield _s3_spec(request)


@pytest.fixture(params=["fs", "s3"])
def durable_store_spec(request: pytest.FixtureRequest, tmp_path: Path) -> StoreSpec:
    """Stores another process can share (for subprocess tests)."""
    if request.param == "fs":
        return StoreSpec("fs", f"file://{tmp_path / 'store'}", {}, [], {})
    return _s3_spec(request)


@pytest.fixture
def s3_spec(request: pytest.FixtureRequest) -> StoreSpec:
    return _s3_spec(request)
