"""A throwaway PostgreSQL cluster from Debian's server, on loopback, in a temp dir.

Durable as shipped: ``fsync=on``, ``synchronous_commit=on``, ``full_page_writes=on``,
``wal_sync_method`` the platform default (fdatasync on Linux): a commit returns
after its WAL is flushed. The cluster runs as the ``postgres`` system user when
the benchmark runs as root (initdb refuses root).
"""

from __future__ import annotations

import contextlib
import os
import pwd
import shutil
import subprocess
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from durablerun_testbed import procs


def _bindir() -> Path:
    for candidate in sorted(Path("/usr/lib/postgresql").glob("*/bin"), reverse=True):
        if (candidate / "postgres").exists():
            return candidate
    raise RuntimeError("PostgreSQL server binaries not found under /usr/lib/postgresql: run bench/setup.sh")


@dataclass
class Postgres:
    root: Path
    port: int
    bindir: Path
    version: str

    def dsn(self, database: str = "postgres") -> str:
        return f"postgresql://postgres@127.0.0.1:{self.port}/{database}"

    def sqlalchemy_url(self, database: str) -> str:
        return f"postgresql+psycopg://postgres@127.0.0.1:{self.port}/{database}"

    def create_database(self, name: str) -> str:
        import psycopg

        with psycopg.connect(self.dsn(), autocommit=True) as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{name}"')
            conn.execute(f'CREATE DATABASE "{name}"')
        return name


def _as_postgres(argv: list[str]) -> list[str]:
    if os.geteuid() == 0:
        return ["runuser", "-u", "postgres", "--", *argv]
    return argv


@contextlib.contextmanager
def cluster() -> Iterator[Postgres]:
    """Start a fresh cluster; stop it and delete its files afterwards."""
    bindir = _bindir()
    root = Path(tempfile.mkdtemp(prefix="durablerun-bench-pg-"))
    data = root / "data"
    if os.geteuid() == 0:
        user = pwd.getpwnam("postgres")
        os.chown(root, user.pw_uid, user.pw_gid)
    port = procs.free_port()
    try:
        subprocess.run(_as_postgres([str(bindir / "initdb"), "-D", str(data), "-U", "postgres", "--auth=trust",
                                     "--no-instructions", "-E", "UTF8"]),
                       check=True, capture_output=True, text=True)
        with (data / "postgresql.conf").open("a") as conf:
            conf.write("\n# durable-run bench: loopback only, durable defaults stated explicitly\n"
                       f"listen_addresses = '127.0.0.1'\nport = {port}\nunix_socket_directories = '{root}'\n"
                       "fsync = on\nsynchronous_commit = on\nfull_page_writes = on\nmax_connections = 100\n")
        subprocess.run(_as_postgres([str(bindir / "pg_ctl"), "-D", str(data), "-l", str(root / "postgres.log"),
                                     "-w", "-t", "60", "start"]), check=True, capture_output=True, text=True)
        version = subprocess.run([str(bindir / "postgres"), "--version"], capture_output=True, text=True).stdout
        server = Postgres(root, port, bindir, version.strip())
        _wait_ready(server)
        yield server
    finally:
        with contextlib.suppress(subprocess.SubprocessError, OSError):
            subprocess.run(_as_postgres([str(bindir / "pg_ctl"), "-D", str(data), "-m", "immediate", "-w", "stop"]),
                           capture_output=True, timeout=60)
        shutil.rmtree(root, ignore_errors=True)


def _wait_ready(server: Postgres) -> None:
    import psycopg

    deadline = time.monotonic() + 30
    while True:
        try:
            with psycopg.connect(server.dsn(), connect_timeout=2) as conn:
                conn.execute("SELECT 1")
            return
        except psycopg.OperationalError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.2)
