"""One real Kueue manager for the session, on the session's test bed (hack/durablerun_testbed/kueue.py); the
operator tests' fixtures (an operator per test, a namespace with a bucket and a ledger) come from tests/conftest.py."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from durablerun_testbed.kueue import Kueue
from durablerun_testbed.testbed import TestBed
from tests.helpers.session import SESSION_ID


@pytest.fixture(scope="session")
def kueue(testbed: TestBed, testbed_root: Path) -> Iterator[Kueue]:
    manager = Kueue(testbed_root / "kueue", SESSION_ID, testbed.kubeconfig).start(testbed.kubectl)
    try:
        yield manager
    finally:
        manager.stop()
