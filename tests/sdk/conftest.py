"""Fixtures of the SDK tests: one store matrix (memory, filesystem, real MinIO)."""

from __future__ import annotations

import sys
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from durablerun._private.storage.backends import memory
from durablerun.stores import Store, open_store
from tests.helpers.local_runs import StoreSpec, s3_store_spec

from .helpers import REPO, WORKFLOWS

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
    return s3_store_spec(request.getfixturevalue("s3_server"), request.getfixturevalue("s3_bucket"))


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
