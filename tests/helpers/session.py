"""What every tier of the tests shares besides fixtures: the repository, the CRD, the session's marker."""

from __future__ import annotations

import uuid
from collections.abc import Callable
from pathlib import Path

from durablerun_testbed.prometheus import Prometheus

REPO = Path(__file__).resolve().parents[2]
#: Every process the test bed starts in this session carries it; none may outlive the session.
SESSION_ID = "pytest-" + uuid.uuid4().hex[:10]

#: Set to 1 to skip the tests that need the real node (kubelet, containerd); each skip names itself.
SKIP_REAL_NODE = "DURABLERUN_SKIP_REAL_NODE"


def skip_real_node_if_asked() -> None:
    import os

    import pytest

    if os.environ.get(SKIP_REAL_NODE) == "1":
        pytest.skip(f"the real-node tier is skipped: {SKIP_REAL_NODE}=1")


#: The ``start_prometheus`` fixture: ``start(["127.0.0.1:port"], rule_files=[...])``.
StartPrometheus = Callable[..., Prometheus]
