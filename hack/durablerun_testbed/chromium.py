"""Headless Chromium from Debian, driven through its chromedriver, for the run browser's tests.

Playwright's browser download is not reachable here, so the browser is Debian's ``chromium`` and
``chromium-driver``, installed on first use (``ensure_installed``: idempotent, seconds once done) rather than
by hack/setup.sh, which keeps a cold ``make demo`` short. chromedriver runs as a managed process (it and the
Chromium it starts carry the session's marker, so the leak check sees them) on a free loopback port; Chromium
listens only on loopback (its DevTools port), which :func:`listening` lets a test check.
"""

from __future__ import annotations

import ipaddress
import os
import shutil
import subprocess
import urllib.request
import uuid
from dataclasses import dataclass, field
from pathlib import Path

from durablerun_testbed import procs

PACKAGES = ("chromium", "chromium-driver")
CHROMIUM, CHROMEDRIVER = Path("/usr/bin/chromium"), Path("/usr/bin/chromedriver")


def ensure_installed() -> None:
    """Install Debian's chromium and chromium-driver unless they are there (needs root and Debian's mirror)."""
    if CHROMIUM.exists() and CHROMEDRIVER.exists():
        return
    if os.geteuid() != 0 or not shutil.which("apt-get"):
        raise RuntimeError(f"the browser tests need {' and '.join(map(str, (CHROMIUM, CHROMEDRIVER)))}: "
                           f"apt-get install {' '.join(PACKAGES)}")
    subprocess.run(["apt-get", "-o", "DPkg::Lock::Timeout=600", "install", "-y", "-q", "--no-install-recommends",
                    *PACKAGES], check=True, capture_output=True, timeout=900,
                   env={**os.environ, "DEBIAN_FRONTEND": "noninteractive"})


def chromium_arguments(profile: Path) -> list[str]:
    """Headless, quiet, and confined to loopback: no background fetches to Google's services."""
    return [
        "--headless=new",
        # As root Chromium refuses to start its sandbox (its setuid and user-namespace sandboxes are meant to drop
        # an ordinary user's privileges, and root has nothing to drop); the pages it loads are our own, on loopback.
        "--no-sandbox",
        "--disable-dev-shm-usage",  # /dev/shm is small in containers
        "--disable-gpu",
        f"--user-data-dir={profile}",
        "--window-size=1400,1000",
        "--no-first-run",
        "--no-default-browser-check",
        "--disable-background-networking",
        "--disable-component-update",
        "--disable-sync",
        "--disable-extensions",
        "--remote-debugging-address=127.0.0.1",
    ]


@dataclass
class Chromedriver:
    """A chromedriver on 127.0.0.1; ``url`` is its WebDriver endpoint."""

    workdir: Path
    testbed_id: str
    port: int = 0
    process: procs.ManagedProcess | None = None
    profiles: list[Path] = field(default_factory=list)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> Chromedriver:
        ensure_installed()
        self.port = procs.free_port()
        # --allowed-ips empty and --allowed-origins unset: chromedriver answers local connections only.
        self.process = procs.ManagedProcess(
            "chromedriver", [str(CHROMEDRIVER), f"--port={self.port}", "--log-level=WARNING"],
            log_path=self.workdir / f"chromedriver-{uuid.uuid4().hex[:6]}.log", testbed_id=self.testbed_id)
        procs.wait_for(lambda: self._ready(), timeout=30, what="chromedriver's /status")
        return self

    def _ready(self) -> bool:
        assert self.process
        self.process.check_alive()
        try:
            with urllib.request.urlopen(f"{self.url}/status", timeout=2) as response:
                return bool(response.status == 200)
        except OSError:
            return False

    def new_profile(self) -> Path:
        profile = self.workdir / f"profile-{uuid.uuid4().hex[:6]}"
        profile.mkdir(parents=True)
        self.profiles.append(profile)
        return profile

    def pids(self) -> list[int]:
        """chromedriver and every process under it (Chromium's browser, renderer, GPU and utility processes)."""
        assert self.process
        found, todo = [], [self.process.pid]
        while todo:
            pid = todo.pop()
            found.append(pid)
            children = Path(f"/proc/{pid}/task/{pid}/children")
            if children.exists():
                todo.extend(int(c) for c in children.read_text().split())
        return found

    def stop(self) -> None:
        if self.process:
            self.process.stop()
        for profile in self.profiles:
            shutil.rmtree(profile, ignore_errors=True)


def listening(pids: list[int]) -> set[str]:
    """The addresses (``ip:port``) on which any of ``pids`` has a listening TCP socket."""
    inodes: set[str] = set()
    for pid in pids:
        try:
            for fd in Path(f"/proc/{pid}/fd").iterdir():
                target = os.readlink(fd)
                if target.startswith("socket:["):
                    inodes.add(target[len("socket:["):-1])
        except (FileNotFoundError, PermissionError):
            continue  # the process ended meanwhile
    found = set()
    for table, width in (("/proc/net/tcp", 8), ("/proc/net/tcp6", 32)):
        for line in Path(table).read_text().splitlines()[1:]:
            fields = line.split()
            local, state, inode = fields[1], fields[3], fields[9]
            if state == "0A" and inode in inodes:  # 0A: LISTEN
                address, port = local.split(":")
                found.add(f"{_address(address, width)}:{int(port, 16)}")
    return found


def _address(hex_address: str, width: int) -> str:
    """/proc/net/tcp's little-endian hex address as text."""
    raw = bytes.fromhex(hex_address)
    if width == 8:
        return str(ipaddress.IPv4Address(raw[::-1]))
    return str(ipaddress.IPv6Address(b"".join(raw[i:i + 4][::-1] for i in range(0, 16, 4))))
