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


def sub_env(extra: dict[str, str]) -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(REPO / "runner"), str(WORKFLOWS), env.get("PYTHONPATH", "")])
    env.pop("DURABLERUN_STORE", None)
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
