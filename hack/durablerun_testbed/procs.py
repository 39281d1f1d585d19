"""Processes the test bed starts: logged, marked, and stopped with their children."""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import TypeVar

MARKER_ENV = "DURABLERUN_TESTBED_ID"

T = TypeVar("T")


class Timeout(AssertionError):
    pass


def wait_for(
    condition: Callable[[], T | None],
    *,
    timeout: float,
    what: str,
    interval: float = 0.05,
) -> T:
    """Poll ``condition`` until it returns a truthy value; fail after ``timeout`` seconds.

    The failure message says what was awaited and the last value or error seen.
    """
    deadline = time.monotonic() + timeout
    last: object = None
    while True:
        try:
            value = condition()
        except Exception as error:  # the condition may fail while a part starts
            value, last = None, error
        else:
            last = value
        if value:
            return value
        if time.monotonic() > deadline:
            raise Timeout(f"timed out after {timeout:g}s waiting for {what} (last: {last!r})")
        time.sleep(interval)


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


class ManagedProcess:
    """A child in its own process group, logging to a file, carrying the marker env."""

    def __init__(
        self,
        name: str,
        argv: Sequence[str],
        *,
        log_path: Path,
        env: Mapping[str, str] | None = None,
        cwd: Path | None = None,
        testbed_id: str,
    ) -> None:
        self.name = name
        self.log_path = log_path
        log_path.parent.mkdir(parents=True, exist_ok=True)
        full_env = dict(os.environ if env is None else env)
        full_env[MARKER_ENV] = testbed_id
        self._log = log_path.open("ab")
        self.popen = subprocess.Popen(
            list(argv),
            stdout=self._log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            env=full_env,
            cwd=cwd,
            start_new_session=True,
        )

    @property
    def pid(self) -> int:
        return self.popen.pid

    def alive(self) -> bool:
        return self.popen.poll() is None

    def log_tail(self, lines: int = 40) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except FileNotFoundError:
            return ""

    def check_alive(self) -> None:
        if not self.alive():
            raise RuntimeError(
                f"{self.name} exited with {self.popen.returncode}; log {self.log_path}:\n"
                f"{self.log_tail()}"
            )

    def signal_group(self, sig: signal.Signals) -> None:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.popen.pid, sig)

    def stop(self, timeout: float = 10.0) -> None:
        """SIGTERM the process group, then SIGKILL what is left after ``timeout``."""
        if self.alive():
            self.signal_group(signal.SIGTERM)
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.popen.wait(timeout)
        # Children may outlive the leader: the group gets SIGKILL regardless.
        self.signal_group(signal.SIGKILL)
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.popen.wait(timeout)
        self._log.close()


def processes_with_marker(testbed_id: str, *, id_prefix: bool = False) -> list[tuple[int, str]]:
    """(pid, command line) of every live process whose environment carries the marker; ``id_prefix``: the
    marker of any bed whose id starts with ``testbed_id`` (a test session's beds)."""
    needle = f"{MARKER_ENV}={testbed_id}".encode()
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            environ = (entry / "environ").read_bytes().split(b"\0")
            if not any(var == needle or (id_prefix and var.startswith(needle)) for var in environ):
                continue
            cmdline = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            status = (entry / "status").read_text()
        except (FileNotFoundError, ProcessLookupError, PermissionError):
            continue
        if "\nState:\tZ" in status:  # a zombie has already exited
            continue
        found.append((int(entry.name), cmdline.strip()))
    return found


def pid_alive(pid: int) -> bool:
    """True while ``pid`` exists and is not a zombie."""
    try:
        return "\nState:\tZ" not in Path(f"/proc/{pid}/status").read_text()
    except FileNotFoundError:
        return False
