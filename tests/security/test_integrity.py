"""Every stored object is integrity-checked: a flipped byte is a loud error, never a fresh start.

tests/badinput/test_runtime.py damages journal records, snapshot chunks, the
snapshot pointer and the manifest; here the two other kinds of object a
resume reads: a step result stored as its own object (a blob) and an event.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from durablerun.stores import RunRef, open_store
from tests.helpers.failing_runs import check_all, failed, flip, journal, objects, root_of, stay_failed
from tests.helpers.runs import Operator, RunEnv, send_event
from tests.helpers.torture_runs import Ledger, manifest, torture_input

pytestmark = pytest.mark.testbed

TARGETS = ("blob", "event")


def test_a_flipped_byte_in_a_blob_or_an_event_is_a_loud_error(operator: Operator, runs: RunEnv) -> None:
    assert runs.testbed.s3
    s3 = runs.testbed.s3
    for target in TARGETS:
        runs.apply(manifest(runs, target, "bad_flows:big_then_wait", input=torture_input(target)))
    damaged: dict[str, tuple[str, bytes, dict[str, str]]] = {}
    for target in TARGETS:
        runs.wait_phase(target, "Waiting", timeout=90)
        root = root_of(runs, target)
        if target == "blob":
            key = root + next(k for k in objects(runs, target) if k.startswith("blobs/"))
        else:
            # The event is in the store (as `durablerun send-event` or a runner puts it) before a runner reads it.
            store = open_store(f"s3://{runs.bucket}/runs", endpoint_url=s3.endpoint_url, region=s3.region,
                               access_key=s3.access_key, secret_key=s3.secret_key)
            ref = RunRef.kubernetes(runs.namespace, target, runs.get(target)["metadata"]["uid"])
            assert store.put_event(run=ref, name="go", payload={"by": "someone"})
            key = root + "events/go.json"
        damaged[target] = (key, flip(runs, key, "flipped"), objects(runs, target))
        send_event(runs, target, "go", {"by": "someone"})
    statuses: dict[str, dict[str, Any]] = {}

    def loud(target: str) -> Callable[[], None]:
        def check() -> None:
            key, data, before = damaged[target]
            statuses[target] = status = failed(runs, target)
            assert "checksum mismatch" in status["message"], status["message"]
            assert key.rsplit("/", 1)[1] in status["message"], status["message"]
            # Only the event we sent may be new (unless it was there already, damaged: it is never replaced).
            after = journal(objects(runs, target))
            assert {k: v for k, v in after.items() if k != "events/go.json"} == \
                   {k: v for k, v in journal(before).items() if k != "events/go.json"}, \
                "an object was written, replaced or removed"
            stored = s3.client().get_object(Bucket=runs.bucket, Key=key)["Body"].read()
            assert stored == data, "the damaged object was replaced"
            assert len(Ledger.read(runs, target).starts("big")) == 1, "the run started over"
            assert not Ledger.read(runs, target).starts("after")
        return check

    check_all({f"a flipped byte in the {t}": loud(t) for t in TARGETS})
    stay_failed(runs, statuses)
