"""What every tier of the tests shares besides fixtures: the repository, the CRD, the session's marker."""

from __future__ import annotations

import uuid
from collections.abc import Callable
from pathlib import Path

from durablerun_testbed.prometheus import Prometheus

REPO = Path(__file__).resolve().parent.parent
CRD_PATH = REPO / "deploy" / "crd" / "durableruns.durablerun.dev.yaml"
#: Every process the test bed starts in this session carries it; none may outlive the session.
SESSION_ID = "pytest-" + uuid.uuid4().hex[:10]

#: The ``start_prometheus`` fixture: ``start(["127.0.0.1:port"], rule_files=[...])``.
StartPrometheus = Callable[..., Prometheus]
