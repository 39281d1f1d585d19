"""What the numbers were measured on: the machine, its load, and every version involved."""

from __future__ import annotations

import os
import platform
import subprocess
from importlib import metadata
from pathlib import Path
from typing import Any


def _first(path: str, prefix: str, sep: str = ":") -> str | None:
    try:
        for line in Path(path).read_text().splitlines():
            if line.startswith(prefix):
                return line.split(sep, 1)[1].strip().strip('"')
    except OSError:
        pass
    return None


def _version(package: str) -> str | None:
    try:
        return metadata.version(package)
    except metadata.PackageNotFoundError:
        return None


def _filesystem(path: str) -> str:
    best = ("", "?", "?")
    try:
        for line in Path("/proc/mounts").read_text().splitlines():
            device, mount, fstype, *_ = line.split()
            if path.startswith(mount) and len(mount) > len(best[0]):
                best = (mount, fstype, device)
    except OSError:
        pass
    return f"{best[1]} on {best[2]} (mounted at {best[0]})"


def _git(*args: str) -> str | None:
    try:
        return subprocess.run(["git", *args], capture_output=True, text=True, check=True,
                              cwd=Path(__file__).resolve().parent).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return None


def load() -> list[float]:
    return [round(x, 2) for x in os.getloadavg()]


def info(tmp: str) -> dict[str, Any]:
    mem_kb = _first("/proc/meminfo", "MemTotal")
    return {
        "cpu": _first("/proc/cpuinfo", "model name"),
        "cores": os.cpu_count(),
        "memory": f"{int(mem_kb.split()[0]) / 1024 / 1024:.1f} GiB" if mem_kb else None,
        "kernel": platform.release(),
        "os": _first("/etc/os-release", "PRETTY_NAME=", "=") or platform.platform(),
        "python": platform.python_version(),
        "tmp_filesystem": _filesystem(tmp),
        "commit": _git("rev-parse", "--short", "HEAD"),
        "dirty": bool(_git("status", "--porcelain", "--", "runner", "operator")),
        "versions": {name: _version(name) for name in (
            "durable-run", "dbos", "langgraph", "langgraph-checkpoint", "langgraph-checkpoint-sqlite",
            "langgraph-checkpoint-postgres", "psycopg", "SQLAlchemy", "boto3", "kopf", "kubernetes")},
    }
