"""The fault suite: the test bed's shared fixtures (tests/conftest.py: the operator tests' fixtures, a pod
recorder, a MinIO of the test's own, and a tally of trials and failures, printed at the end of the session),
and a control plane of the test's own.

``FAULT_TRIALS`` scales the suite (CI runs the default, ``make faults`` the long
version); ``FAULT_SEED`` replays a run of random timings.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from durablerun_testbed.s3 import S3Server
from durablerun_testbed.testbed import TestBed
from tests.helpers.session import SESSION_ID


@pytest.fixture
def own_bed(request: pytest.FixtureRequest, testbed_root: Path, s3_server: S3Server) -> Iterator[TestBed]:
    """A test bed of the test's own, with the CRD (so restarting its API server disturbs no other test).

    It has the process node unless the test asks for none, with
    ``@pytest.mark.parametrize("own_bed", [{"node": False}], indirect=True, ids=["no-node"])``.
    """
    options = getattr(request, "param", {})
    bed = TestBed(testbed_root / f"k8s-{uuid.uuid4().hex[:6]}", id=SESSION_ID).start(
        s3=s3_server, node=options.get("node", True))
    try:
        bed.install_crds(timeout=30)
        yield bed
    finally:
        bed.stop()
