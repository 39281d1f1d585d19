"""The webhook ingress under load: capability-URL POSTs to many runs over loopback.

``runs`` DurableRuns (suspended: the ingress's work is the same for a waiting run, and no pod is
needed) each get ``requests / runs`` POSTs of one event with one value: the first is delivered, the
rest are duplicates, as a sender retrying would make them. A closed-loop generator of ``workers``
threads sends them as fast as the ingress answers; it reports its own CPU time per request, so a
generator that cannot keep up shows. Checked afterwards: every run holds its event, exactly one
``EventReceived`` Event per run, and no request lost (every answer 202 or 200).
"""

from __future__ import annotations

import json
import secrets
import sys
import time
import urllib.error
import urllib.request
import uuid
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from durablerun import api, webhooks
from durablerun_bench.util import percentile
from durablerun_testbed import procs
from durablerun_testbed.testbed import TestBed


def _manifest(namespace: str, name: str) -> dict[str, Any]:
    return {
        "apiVersion": api.API_VERSION, "kind": api.KIND, "metadata": {"name": name, "namespace": namespace},
        "spec": {"workflow": "durablerun_bench.dr_flows:steps", "input": {"n": 1}, "suspend": True,
                 "checkpoint": {"uri": "s3://bench/webhooks"},
                 "template": {"spec": {"containers": [{"name": "runner"}]}}},
    }


def bench(bed: TestBed, root: Path, run_id: str, *, runs: int = 100, requests: int = 1000,
          workers: int = 16) -> dict[str, Any]:
    from kubernetes import client

    namespace = "wh-" + uuid.uuid4().hex[:8]
    bed.kubectl("create", "namespace", namespace)
    key = secrets.token_bytes(32)
    bed.kubectl("create", "secret", "generic", api.WEBHOOK_KEYS_SECRET, "-n", namespace,
                "--from-literal=current=k1", f"--from-literal=k1={key.hex()}")
    custom = client.CustomObjectsApi(bed.api_client())
    names = [f"hooked-{i:04d}" for i in range(runs)]
    uids = {}
    for name in names:
        created = custom.create_namespaced_custom_object(api.GROUP, api.VERSION, namespace, api.PLURAL,
                                                         _manifest(namespace, name))
        uids[name] = created["metadata"]["uid"]

    port, metrics_port = procs.free_port(), procs.free_port()
    process = procs.ManagedProcess(
        "webhooks", [sys.executable, "-m", "durablerun_operator.ingress", "--namespace", namespace,
                     "--address", "127.0.0.1", "--port", str(port), "--metrics-port", str(metrics_port),
                     "--rate", "100000", "--burst", "100000"],
        log_path=root / f"webhooks-{run_id}.log", env=bed.env(), testbed_id=run_id)
    base = f"http://127.0.0.1:{port}"
    try:
        procs.wait_for(lambda: _up(base), timeout=30, what="the webhook ingress")
        expires = int(time.time()) + 3600
        signing_key = key.hex().encode()  # the Secret holds the hex text; the ingress reads its bytes
        urls = [webhooks.url(base, webhooks.sign(webhooks.Claims(
            namespace=namespace, run=name, uid=uids[name], event="done", expires=expires, key_id="k1"),
            signing_key)) for name in names]
        plan = [urls[i % runs] for i in range(requests)]
        body = json.dumps({"approved": True}).encode()

        def post(url: str) -> tuple[int, float]:
            started = time.perf_counter()
            request = urllib.request.Request(url, data=body, method="POST",
                                             headers={"Content-Type": "application/json"})
            try:
                with urllib.request.urlopen(request, timeout=60) as reply:
                    status = reply.status
            except urllib.error.HTTPError as error:
                status = error.code
            return status, time.perf_counter() - started

        cpu_before, wall_before = time.process_time(), time.perf_counter()
        with ThreadPoolExecutor(max_workers=workers) as pool:
            answers = list(pool.map(post, plan))
        wall = time.perf_counter() - wall_before
        generator_cpu = time.process_time() - cpu_before
    finally:
        process.stop()

    statuses: dict[int, int] = {}
    for status, _ in answers:
        statuses[status] = statuses.get(status, 0) + 1
    latencies = [seconds for _, seconds in answers]
    events = json.loads(bed.kubectl("get", "events", "-n", namespace, "-o", "json").stdout)["items"]
    received: dict[str, int] = {}
    for event in events:
        if event["reason"] == "EventReceived":
            received[event["involvedObject"]["name"]] = received.get(event["involvedObject"]["name"], 0) + 1
    listed = custom.list_namespaced_custom_object(api.GROUP, api.VERSION, namespace, api.PLURAL)["items"]
    holding = sum(1 for run in listed if (run["spec"].get("events") or {}).get("done") == {"approved": True})
    bed.kubectl("delete", "namespace", namespace, "--wait=false")
    return {
        "runs": runs, "requests": requests, "workers": workers, "wall_s": wall,
        "requests_per_s": requests / wall, "p50_ms": 1000 * percentile(latencies, 50),
        "p99_ms": 1000 * percentile(latencies, 99), "max_ms": 1000 * max(latencies),
        "statuses": {str(k): v for k, v in sorted(statuses.items())},
        "runs_holding_the_event": holding, "runs_woken_more_than_once": sum(1 for n in received.values() if n > 1),
        "runs_with_one_event_received": sum(1 for n in received.values() if n == 1),
        "generator_cpu_ms_per_request": 1000 * generator_cpu / requests,
    }


def _up(base: str) -> bool:
    try:
        with urllib.request.urlopen(base + "/healthz", timeout=2) as reply:
            return bool(reply.status == 200)
    except OSError:
        return False
