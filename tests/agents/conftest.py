"""Fixtures of the agent-integration tests: the scripted model server, and the CLI in a subprocess.

The model server (durablerun_testbed.llmserver) is the only stand-in: it speaks
the OpenAI and Anthropic wire formats on loopback, and the real SDKs and agent
frameworks talk to it.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from durablerun import api
from durablerun_testbed.llmserver import LLMServer, Turn

HERE = Path(__file__).resolve().parent
REPO = HERE.parent.parent
WORKFLOWS = HERE / "workflows"
if str(WORKFLOWS) not in sys.path:
    sys.path.insert(0, str(WORKFLOWS))


@pytest.fixture
def llm_server() -> Iterator[Callable[..., LLMServer]]:
    """``llm_server([{"tool_calls": [...]}, {"text": "..."}], repeat_last=False)``: a started server."""
    servers: list[LLMServer] = []

    def start(turns: list[dict[str, Any]], *, repeat_last: bool = False) -> LLMServer:
        server = LLMServer([Turn.parse(t) for t in turns], repeat_last=repeat_last).start()
        servers.append(server)
        return server

    yield start
    for server in servers:
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


def sub_env(extra: dict[str, str]) -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(REPO / "runner"), str(WORKFLOWS), env.get("PYTHONPATH", "")])
    env.pop(api.Env.STORE, None)
    env.update(extra)
    return env


def launch(args: list[str], env: dict[str, str], cwd: Path) -> subprocess.Popen[str]:
    """``python -m durablerun ARGS`` in the background."""
    return subprocess.Popen([sys.executable, "-m", "durablerun", *args], env=sub_env(env), cwd=cwd,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def cli(args: list[str], env: dict[str, str], cwd: Path, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "durablerun", *args], env=sub_env(env), cwd=cwd,
                          capture_output=True, text=True, timeout=timeout, check=False)


def kill(proc: subprocess.Popen[str]) -> None:
    proc.send_signal(signal.SIGKILL)
    proc.communicate(timeout=30)
    assert proc.returncode == -signal.SIGKILL, proc.returncode


def kill_with_turn_in_flight(server: LLMServer, turn: int, args: list[str], env: dict[str, str], cwd: Path) -> None:
    """Run the CLI with model turn ``turn``'s answer held, SIGKILL it once that turn is asked, then release it:
    every earlier turn is journaled by then (each step is durable before the next starts)."""
    server.hold(turn)
    proc = launch(args, env, cwd)
    try:
        server.wait_for(lambda reqs: any(r["turn"] == turn for r in reqs), timeout=60, what=f"turn {turn} to be asked")
    finally:
        kill(proc)
    server.release()
