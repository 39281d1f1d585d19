"""Fixtures of the install tests: helm and kubectl against the session's test bed."""

from __future__ import annotations

from pathlib import Path

import pytest

from durablerun_testbed.testbed import TestBed
from tests.helpers.clis import Helm, Kubectl


@pytest.fixture
def helm(tmp_path: Path, testbed: TestBed) -> Helm:
    """helm with a scratch home, talking to the session's test bed as its admin."""
    home = tmp_path / "helm"
    home.mkdir()
    return Helm(home, testbed.kubeconfig)


@pytest.fixture
def admin(testbed: TestBed) -> Kubectl:
    return Kubectl(testbed.kubeconfig)
