"""Fixtures of the SDK tests: one store matrix (memory, filesystem, real MinIO)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from durablerun import api
from durablerun._private.backends import memory
from durablerun.stores import Store, open_store

HERE = Path(__file__).resolve().parent
REPO = HERE.parent.parent
WORKFLOWS = HERE / "workflows"
# Test workflows and the examples import by their own names, as `durablerun run` does.
for _path in (str(WORKFLOWS), str(REPO / "examples")):
    if _path not in sys.path:
        sys.path.insert(0, _path)


@dataclass
class StoreSpec:
    """How to open one store from this process and from a subprocess."""

    kind: str
    uri: str
    env: dict[str, str]
    cli_args: list[str]
    options: dict[str, Any]

    def open(self) -> Store:
        return open_store(self.uri, **self.options)


@pytest.fixture
def fs_uri(tmp_path: Path) -> str:
    return f"file://{tmp_path / 'store'}"


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


def sub_env(extra: dict[str, str] | None = None) -> dict[str, str]:
    env = dict(os.environ)
    paths = [str(REPO / "runner"), str(WORKFLOWS), str(REPO / "examples")]
    if env.get("PYTHONPATH"):
        paths.append(env["PYTHONPATH"])
    env["PYTHONPATH"] = os.pathsep.join(paths)
    env.pop(api.Env.STORE, None)
    env.update(extra or {})
    return env


def cli(args: list[str], *, env: dict[str, str] | None = None, cwd: Path | None = None,
        timeout: float = 60) -> subprocess.CompletedProcess[str]:
    """Run ``python -m durablerun ARGS`` and wait for it."""
    return subprocess.run(
        [sys.executable, "-m", "durablerun", *args], capture_output=True, text=True,
        env=sub_env(env), cwd=cwd, timeout=timeout, check=False)


def wait_until(condition: Callable[[], Any], *, timeout: float, what: str,
               interval: float = 0.005) -> Any:
    """Poll ``condition`` until it is truthy; fail after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while True:
        value = condition()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}")
        time.sleep(interval)


@pytest.fixture
def tmp_store_dir(tmp_path: Path) -> Iterator[Path]:
    d = tmp_path / "store"
    yield d
    shutil.rmtree(d, ignore_errors=True)
