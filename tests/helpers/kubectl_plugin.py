"""`kubectl durablerun` as a user runs it: the real kubectl finding the plugin on PATH."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from durablerun_testbed import binaries
from durablerun_testbed.testbed import TestBed


class Plugin:
    """`kubectl [args]` with only the package's console scripts and kubectl on PATH, as a user's shell has."""

    def __init__(self, testbed: TestBed, namespace: str, home: Path) -> None:
        scripts = Path(sys.executable).parent  # where pip put kubectl-durablerun
        self.kubectl = binaries.kubectl()
        bin_dir = home / "bin"
        bin_dir.mkdir()
        (bin_dir / "kubectl").symlink_to(self.kubectl)
        for script in ("kubectl-durablerun", "kubectl_complete-durablerun"):
            (bin_dir / script).symlink_to(scripts / script)
        self.env = {"PATH": f"{bin_dir}:/usr/bin:/bin", "HOME": str(home), "KUBECONFIG": str(testbed.kubeconfig),
                    "USER": "tester"}
        self.namespace = namespace

    def __call__(self, *args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
        return subprocess.run(["kubectl", *args], env=self.env, capture_output=True, text=True, timeout=timeout,
                              check=False)

    def dr(self, *args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
        return self("durablerun", "-n", self.namespace, *args, timeout=timeout)
