"""What the agent-integration tests share: the CLI in a subprocess, and killing it with a model turn in flight."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

from durablerun import api
from durablerun_testbed.llmserver import LLMServer

HERE = Path(__file__).resolve().parent
REPO = HERE.parent.parent
WORKFLOWS = HERE / "workflows"


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
