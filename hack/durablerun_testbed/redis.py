"""A real redis-server (Debian's package) on loopback: the shared quota windows' store for the tests.

It listens on 127.0.0.1 on a free port only, asks for a password (as the chart's will), and keeps an
append-only file in its work directory so that a restart (``restart``) finds the windows it held.
"""

from __future__ import annotations

import secrets
import socket
from dataclasses import dataclass, field
from pathlib import Path

from durablerun_testbed import binaries, procs


@dataclass
class RedisServer:
    workdir: Path
    testbed_id: str
    port: int = 0
    password: str = field(default_factory=lambda: secrets.token_hex(16))
    process: procs.ManagedProcess | None = None

    @property
    def url(self) -> str:
        """The URL runners are given (DURABLERUN_LLM_QUOTA_REDIS); the password travels apart from it."""
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self) -> RedisServer:
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.port = self.port or procs.free_port()
        config = self.workdir / "redis.conf"
        config.write_text("\n".join([
            "bind 127.0.0.1", f"port {self.port}", "protected-mode yes", f"requirepass {self.password}",
            f"dir {self.workdir}", "appendonly yes", "appendfsync always", 'save ""', "daemonize no",
            "loglevel notice", ""]))
        config.chmod(0o600)  # it holds the password
        self.process = procs.ManagedProcess(
            "redis", [str(binaries.find("redis-server")), str(config)],
            log_path=self.workdir / "redis.log", testbed_id=self.testbed_id)
        procs.wait_for(self._ready, timeout=30, what=f"redis-server on 127.0.0.1:{self.port}")
        return self

    def _ready(self) -> bool:
        assert self.process
        self.process.check_alive()
        try:
            with socket.create_connection(("127.0.0.1", self.port), timeout=1) as conn:
                conn.sendall(f"AUTH {self.password}\r\nPING\r\n".encode())
                return conn.recv(64).startswith(b"+OK\r\n+PONG")
        except OSError:
            return False

    def stop(self) -> None:
        if self.process is not None:
            self.process.stop()
            self.process = None

    def restart(self) -> RedisServer:
        """Stopped and started again on the same port, from its append-only file."""
        self.stop()
        return self.start()
