"""How big a DurableRun gets: a parent with N children, a run that received N events.

Both are built on the real API server through the writes a real run makes
(the runner's guarded JSON patches of status.childRequests, the operator's
status.childrenCreated and each child's outcome as the parent's event, a
user's spec.events patches), in batches; the size is the stored object's JSON as a
GET returns it, managedFields included (etcd holds the same JSON).
"""

from __future__ import annotations

import json
import uuid
from typing import Any

from durablerun import api, relations
from durablerun_bench import writecost
from durablerun_operator import decide
from durablerun_operator.decide import family
from durablerun_testbed.testbed import TestBed

JSON_PATCH = "application/json-patch+json"
BATCH = 50


def _size(custom: Any, namespace: str, name: str) -> int:
    run = custom.get_namespaced_custom_object(api.GROUP, api.VERSION, namespace, api.PLURAL, name)
    return len(json.dumps(run, separators=(",", ":")))


def _run(name: str) -> dict[str, Any]:
    body = writecost.run_manifest(api.GROUP, name)
    del body["spec"]["events"]
    return body


def _finished_child(parent: str, child: str) -> decide.RunView:
    """A child that Succeeded with a small result, as its own DurableRun holds it."""
    return decide.RunView.from_body({
        "metadata": {"namespace": "bench", "name": f"{parent}-{child}", "uid": str(uuid.uuid4())},
        "spec": {"workflow": "agents.review:one", "checkpoint": {"uri": "s3://bench/objsize"}},
        "status": {"phase": api.Phase.SUCCEEDED.value, "cost": {"usd": "0.0123", "tokens": 1234},
                   "result": {"ref": "journal/00000007", "size": 33, "sha256": "0" * 64,
                              "inline": json.dumps({"verdict": "ok", "score": 0.87})}}})


def parent_with_children(bed: TestBed, namespace: str, children: int) -> dict[str, Any]:
    """A parent that started ``children`` child runs, every one of them finished and reported back."""
    from kubernetes import client

    custom = client.CustomObjectsApi(bed.api_client())
    name = "parent"
    custom.create_namespaced_custom_object(api.GROUP, api.VERSION, namespace, api.PLURAL, _run(name))
    custom.patch_namespaced_custom_object_status(api.GROUP, api.VERSION, namespace, api.PLURAL, name,
                                                 {"status": {**writecost.running_status(name), "childRequests": {}}})
    out: dict[str, Any] = {"children": children, "bytes_before": _size(custom, namespace, name)}
    for start in range(0, children, BATCH):
        batch = [f"c{i:04d}" for i in range(start, min(children, start + BATCH))]
        # The runner: ctx.start_child writes a request into its own status, guarded by its epoch.
        custom.patch_namespaced_custom_object_status(
            api.GROUP, api.VERSION, namespace, api.PLURAL, name,
            [{"op": "test", "path": "/status/epoch", "value": 1},
             *({"op": "add", "path": f"/status/childRequests/{child}",
                "value": {"workflow": "agents.review:one", "input": {"item": i}, "policy": {}}}
               for i, child in enumerate(batch, start))],
            _content_type=JSON_PATCH)
        # The operator: the names of the children it created (their states are their own DurableRuns), each
        # finished child's outcome as the parent's event (built by the operator's own function), then the
        # names again without the reported ones.
        custom.patch_namespaced_custom_object_status(
            api.GROUP, api.VERSION, namespace, api.PLURAL, name,
            [{"op": "add", "path": "/status/childrenCreated", "value": batch}], _content_type=JSON_PATCH)
        custom.patch_namespaced_custom_object(
            api.GROUP, api.VERSION, namespace, api.PLURAL, name,
            {"spec": {"events": {relations.child_event(child): family.child_outcome(_finished_child(name, child))
                                 for child in batch}}})
        custom.patch_namespaced_custom_object_status(
            api.GROUP, api.VERSION, namespace, api.PLURAL, name,
            [{"op": "remove", "path": "/status/childrenCreated"}], _content_type=JSON_PATCH)
    custom.patch_namespaced_custom_object_status(
        api.GROUP, api.VERSION, namespace, api.PLURAL, name,
        {"status": {"childrenTotal": {"runs": children, "finished": children, "summary": f"{children}/{children}",
                                      "usd": "12.30", "tokens": 1234000}}})
    out["bytes"] = _size(custom, namespace, name)
    return out


def run_with_events(bed: TestBed, namespace: str, events: int) -> dict[str, Any]:
    """A run that was sent ``events`` events (an approval each, ~100 bytes of JSON), one patch per event."""
    from kubernetes import client

    custom = client.CustomObjectsApi(bed.api_client())
    name = "events"
    custom.create_namespaced_custom_object(api.GROUP, api.VERSION, namespace, api.PLURAL, _run(name))
    custom.patch_namespaced_custom_object_status(api.GROUP, api.VERSION, namespace, api.PLURAL, name,
                                                 {"status": writecost.running_status(name)})
    for i in range(events):
        custom.patch_namespaced_custom_object(
            api.GROUP, api.VERSION, namespace, api.PLURAL, name,
            {"spec": {"events": {f"approval-{i:04d}": {"approved": True, "by": "reviewer@example.com",
                                                         "comment": "looks right to me"}}}})
    return {"events": events, "bytes": _size(custom, namespace, name)}


def bench(bed: TestBed, *, children: int, events: int, log: Any = print) -> dict[str, Any]:
    namespace = f"bench-objsize-{uuid.uuid4().hex[:4]}"
    bed.kubectl("create", "namespace", namespace)
    out = {"parent": parent_with_children(bed, namespace, children), "events": run_with_events(bed, namespace, events)}
    log(f"  a parent of {children} children: {out['parent']['bytes'] / 1024:.0f} KiB; a run sent {events} events: "
        f"{out['events']['bytes'] / 1024:.0f} KiB")
    bed.kubectl("delete", "namespace", namespace, "--wait=false")
    return out
