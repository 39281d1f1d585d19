"""The operator tests' own fixture: ``kubectl durablerun`` as a user runs it (the test bed's shared fixtures come
from tests/conftest.py)."""

from __future__ import annotations

from pathlib import Path

import pytest

from durablerun_testbed.testbed import TestBed
from tests.helpers.kubectl_plugin import Plugin


@pytest.fixture
def plugin(testbed: TestBed, namespace: str, tmp_path: Path) -> Plugin:
    home = tmp_path / "home"
    home.mkdir()
    return Plugin(testbed, namespace, home)
