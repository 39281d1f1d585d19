"""The architecture's import rules (.importlinter, run by `make lint`) each catch what they forbid.

A contract that never fails protects nothing: each one here is broken on purpose, in a copy of the tree
(runner/, operator/ and tests/) with one planted import, and import-linter must name it broken. A contract
added to .importlinter without a planted import here fails the first test.
"""

from __future__ import annotations

import configparser
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
LINT_IMPORTS = Path(sys.executable).parent / "lint-imports"
RUNNER = "runner/durablerun/_private"
OPERATOR = "operator/durablerun_operator"

#: contract id -> (a file, an import that breaks the contract when planted in it)
PLANTED: dict[str, tuple[str, str]] = {
    "runner-not-operator": (f"{RUNNER}/engine/core.py", "import durablerun_operator.kube"),
    "operator-sees-the-contract": (f"{OPERATOR}/kube.py", "from durablerun._private.records import layout"),
    "runner-public-over-private": (f"{RUNNER}/engine/run.py", "import durablerun.stores"),
    "runner-rooms": (f"{RUNNER}/storage/journal.py", "from durablerun._private.engine import core"),
    "engine-layers": (f"{RUNNER}/engine/core.py", "from durablerun._private.engine import context"),
    "storage-layers": (f"{RUNNER}/storage/backends/base.py", "from durablerun._private.storage import journal"),
    "backends-unaware": (f"{RUNNER}/storage/backends/fs.py", "from durablerun._private.storage.backends import s3"),
    "records-layers": (f"{RUNNER}/records/codec.py", "from durablerun._private.records import model"),
    "only-s3-imports-boto": (f"{RUNNER}/storage/stores.py", "import boto3"),
    "test-folders-independent": ("tests/faults/helpers.py", "from tests.operator import run_bodies"),
    "tests-layers": ("tests/helpers/runs.py", "from tests.faults import helpers"),
    "operator-layers": (f"{OPERATOR}/kube.py", "from durablerun_operator import executor"),
    "decide-layers": (f"{OPERATOR}/decide/facts.py", "from durablerun_operator.decide import lifecycle"),
    "decisions-pure": (f"{OPERATOR}/decide/clocks.py", "import time"),
    "only-kube-talks-to-the-api-server": (f"{OPERATOR}/executor.py", "import kubernetes"),
    "only-the-wiring-imports-kopf": (f"{OPERATOR}/reconciler.py", "import kopf"),
}


def _contracts() -> list[str]:
    config = configparser.ConfigParser()
    config.read(ROOT / ".importlinter")
    prefix = "importlinter:contract:"
    return [s.removeprefix(prefix) for s in config.sections() if s.startswith(prefix)]


def _lint(tree: Path, contract: str) -> subprocess.CompletedProcess[str]:
    # The copy first on the path: its tests package, not this checkout's.
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(str(tree / part) for part in ("", "runner", "operator"))}
    return subprocess.run([str(LINT_IMPORTS), "--no-cache", "--config", str(ROOT / ".importlinter"),
                           "--contract", contract], cwd=tree, env=env, capture_output=True, text=True, timeout=120)


def test_every_contract_is_seen_to_fail() -> None:
    assert sorted(_contracts()) == sorted(PLANTED)


@pytest.mark.parametrize("contract", sorted(PLANTED))
def test_a_planted_import_breaks_the_contract(contract: str, tmp_path: Path) -> None:
    for part in ("runner", "operator", "tests"):
        shutil.copytree(ROOT / part, tmp_path / part, ignore=shutil.ignore_patterns("__pycache__", "*.egg-info"))
    target, planted = PLANTED[contract]
    clean = _lint(tmp_path, contract)
    assert clean.returncode == 0, clean.stdout + clean.stderr
    with (tmp_path / target).open("a") as f:
        f.write(f"\n{planted}  # planted by the test\n")
    broken = _lint(tmp_path, contract)
    assert broken.returncode == 1, broken.stdout + broken.stderr
    assert "BROKEN" in broken.stdout, broken.stdout
    planted_module = target.removeprefix("runner/").removeprefix("operator/").removesuffix(".py").replace("/", ".")
    assert planted_module in broken.stdout, broken.stdout
