"""Runs in this process and in `python -m durablerun` subprocesses, against the store matrix's stores: what the SDK
tests and the fault suite's local generated-workflow tests share."""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from durablerun import api
from durablerun.stores import Store, open_store
from tests.helpers.session import REPO

if TYPE_CHECKING:
    from durablerun_testbed.s3 import S3Server


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


def s3_store_spec(server: S3Server, bucket: str) -> StoreSpec:
    """A bucket on a MinIO of the test bed, as a store spec."""
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
    return StoreSpec("s3", f"s3://{bucket}/runs", env, ["--endpoint-url", server.endpoint_url], options)


def sub_env(extra: dict[str, str] | None = None, *, workflows: Sequence[Path] = ()) -> dict[str, str]:
    """This process's environment for a ``python -m durablerun`` subprocess: the runner, ``workflows`` and the
    examples importable, no store from the environment, then ``extra``."""
    env = dict(os.environ)
    paths = [str(REPO / "runner"), *map(str, workflows), str(REPO / "examples")]
    if env.get("PYTHONPATH"):
        paths.append(env["PYTHONPATH"])
    env["PYTHONPATH"] = os.pathsep.join(paths)
    env.pop(api.Env.STORE, None)
    env.update(extra or {})
    return env


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
