"""Fixtures of the agent-integration tests: the scripted model server, and the CLI in a subprocess.

The model server (durablerun_testbed.llmserver) is the only stand-in: it speaks
the OpenAI and Anthropic wire formats on loopback, and the real SDKs and agent
frameworks talk to it.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from durablerun_testbed.llmserver import LLMServer, Turn
from durablerun_testbed.redis import RedisServer
from tests.agents.helpers import WORKFLOWS
from tests.helpers.session import SESSION_ID

if str(WORKFLOWS) not in sys.path:
    sys.path.insert(0, str(WORKFLOWS))


@pytest.fixture
def llm_server() -> Iterator[Callable[..., LLMServer]]:
    """``llm_server([{"tool_calls": [...]}, {"text": "..."}], repeat_last=False)``: a started server."""
    servers: list[LLMServer] = []

    def start(turns: list[dict[str, Any]], *, repeat_last: bool = False,
              tokens_per_minute: int | None = None) -> LLMServer:
        server = LLMServer([Turn.parse(t) for t in turns], repeat_last=repeat_last,
                           tokens_per_minute=tokens_per_minute).start()
        servers.append(server)
        return server

    yield start
    for server in servers:
        server.stop()


@pytest.fixture(scope="module")
def redis_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RedisServer]:
    """A real redis-server on loopback: the quota windows a fleet shares."""
    server = RedisServer(tmp_path_factory.mktemp("redis"), SESSION_ID).start()
    yield server
    server.stop()


@pytest.fixture(params=["fs", "s3"])
def store(request: pytest.FixtureRequest, tmp_path: Path) -> tuple[list[str], dict[str, str]]:
    """CLI arguments and environment for a store a subprocess can share: the filesystem, or S3 on the
    test bed's real MinIO."""
    if request.param == "fs":
        return ["--store", f"file://{tmp_path / 'store'}"], {}
    server = request.getfixturevalue("s3_server")
    bucket = request.getfixturevalue("s3_bucket")
    env = {"AWS_ACCESS_KEY_ID": server.access_key, "AWS_SECRET_ACCESS_KEY": server.secret_key,
           "AWS_REGION": server.region}
    return ["--store", f"s3://{bucket}/runs", "--endpoint-url", server.endpoint_url], env
