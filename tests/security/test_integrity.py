"""Every stored object is integrity-checked: a flipped byte is a loud error, never a fresh start.

tests/badinput/test_runtime.py damages journal records, snapshot chunks, the
snapshot pointer and the manifest; here the two other kinds of object a
resume reads: a step result stored as its own object (a blob) and an event.
"""

from __future__ import annotations

import pytest

from durablerun.stores import RunRef, open_store
from tests.badinput.test_runtime import failed_once, flip, objects, root_of
from tests.faults.helpers import Ledger, manifest, send_event, torture_input
from tests.operator.conftest import Operator, RunEnv

pytestmark = pytest.mark.testbed


@pytest.mark.parametrize("target", ["blob", "event"])
def test_a_flipped_byte_is_a_loud_error(operator: Operator, runs: RunEnv, target: str) -> None:
    assert runs.testbed.s3
    name = f"flipped-{target}"
    runs.apply(manifest(runs, name, "bad_flows:big_then_wait", input=torture_input(name)))
    runs.wait_phase(name, "Waiting", timeout=90)
    root = root_of(runs, name)
    if target == "blob":
        key = root + next(k for k in objects(runs, name) if k.startswith("blobs/"))
    else:
        # The event is in the store (as `durablerun send-event` or a runner puts it) before any runner reads it.
        run = runs.get(name)
        store = open_store(f"s3://{runs.bucket}/runs", endpoint_url=runs.testbed.s3.endpoint_url,
                           region=runs.testbed.s3.region, access_key=runs.testbed.s3.access_key,
                           secret_key=runs.testbed.s3.secret_key)
        ref = RunRef.kubernetes(runs.namespace, name, run["metadata"]["uid"])
        assert store.put_event(run=ref, name="go", payload={"by": "someone"})
        key = root + "events/go.json"
    damaged = flip(runs, key, "flipped")
    before = objects(runs, name)
    send_event(runs, name, "go", {"by": "someone"})
    status = failed_once(runs, name)
    assert "checksum mismatch" in status["message"], status["message"]
    assert key.rsplit("/", 1)[1] in status["message"], status["message"]
    after = objects(runs, name)
    # Only the event we sent may be new (unless it was there already, damaged: it is never replaced).
    kept = ("status.json", "events/go.json")
    assert {k: v for k, v in after.items() if k not in kept} == {k: v for k, v in before.items() if k not in kept}, \
        "an object was written, replaced or removed"
    s3 = runs.testbed.s3.client()
    assert s3.get_object(Bucket=runs.bucket, Key=key)["Body"].read() == damaged, "the damaged object was replaced"
    assert len(Ledger.read(runs, name).starts("big")) == 1, "the run started over"
    assert not Ledger.read(runs, name).starts("after")
