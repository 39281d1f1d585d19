"""Secret values never appear in logs, Events, status, metrics, pods or the journal.

Runs go through the paths most likely to print a credential: a crash and
resume with DEBUG logging (botocore and the Kubernetes client log requests),
wrong credentials, an unknown workflow, a step failing with retries, a wait
for an event; the runner also gets a canary Secret in its env, as a user's
API key would be. Then every log of the test bed (operators, runners under
the process node's state directory, MinIO, the control plane), every Event,
the DurableRuns, the pods, the operator's metrics and every stored object are
scanned for each secret value, raw and base64-encoded. Only the stores that
must hold them (etcd's data and MinIO's own data) are not scanned, and the
scan is shown to find a secret where one is (the Secret object itself).
"""

from __future__ import annotations

import json
import os
import secrets
from pathlib import Path
from typing import Any

import pytest

from durablerun import api
from durablerun_testbed import procs
from tests.helpers.bed import StartStore
from tests.helpers.metrics import scrape
from tests.helpers.runs import RunEnv, StartOperator, send_event
from tests.helpers.torture_runs import Ledger, manifest, torture_input
from tests.security.secret_scan import leaks

pytestmark = pytest.mark.testbed


def scan_files(root: Path, values: dict[str, str]) -> tuple[dict[str, list[str]], list[Path]]:
    """The values found in the files under ``root``, by file, and the files scanned."""
    found, scanned = {}, []
    # os.walk, not rglob: the real node's containerd removes snapshots of other tests' pods meanwhile, and a
    # directory gone while it is walked holds nothing to find.
    for directory, _, names in os.walk(root):
        for name in names:
            path = Path(directory, name)
            parts = path.parts
            # etcd's data holds the Secrets and MinIO's data dirs hold its own credentials: they must.
            if not path.is_file() or "etcd" in parts or ("data" in parts and any(p.startswith("s3") for p in parts)):
                continue
            try:
                hit = leaks(path.read_bytes(), values)
            except OSError:
                continue
            scanned.append(path)
            if hit:
                found[str(path)] = hit
    return found, scanned


def test_secret_values_never_leak(start_operator: StartOperator, runs: RunEnv, dedicated_store: StartStore,
                                  testbed_root: Path) -> None:
    store = dedicated_store()
    wrong, canary = "wrong-" + secrets.token_hex(16), "canary-" + secrets.token_hex(16)
    values = {"the S3 secret key": store.server.secret_key, "a wrong S3 secret key": wrong,
              "a canary API key": canary}
    ns = runs.namespace
    kubectl = runs.testbed.kubectl
    kubectl("create", "secret", "generic", "wrong-credentials", "-n", ns,
            f"--from-literal=AWS_ACCESS_KEY_ID={store.server.access_key}",
            f"--from-literal=AWS_SECRET_ACCESS_KEY={wrong}")
    kubectl("create", "secret", "generic", "llm", "-n", ns, f"--from-literal=API_KEY={canary}")
    operator = start_operator()

    def with_canary(body: dict[str, Any], *, debug: bool = False) -> dict[str, Any]:
        container = body["spec"]["template"]["spec"]["containers"][0]
        key = {"secretKeyRef": {"name": "llm", "key": "API_KEY"}}
        container["env"].append({"name": "LLM_API_KEY", "valueFrom": key})
        if debug:
            container["env"].append({"name": api.Env.LOG_LEVEL, "value": "DEBUG"})
        return body

    runs.apply(with_canary(store.use(manifest(runs, "resumed", input=torture_input("resumed", rounds=2, pace=0.3))),
                           debug=True))
    bad = store.use(manifest(runs, "badcreds", input=torture_input("badcreds")))
    bad["spec"]["checkpoint"]["credentialsSecret"] = "wrong-credentials"
    runs.apply(with_canary(bad))
    runs.apply(with_canary(store.use(manifest(runs, "typo", "no_such_module:run"))))
    runs.apply(with_canary(store.use(manifest(runs, "approval", "bad_flows:approval",
                                              input=torture_input("approval", pace=0.05)))))
    runs.apply(with_canary(store.use(manifest(runs, "raising", "bad_flows:unserializable",
                                              input=torture_input("raising")))))
    # A crash and resume, an event, and every run to its end.
    procs.wait_for(lambda: Ledger.read(runs, "resumed").starts("r0-plan"), timeout=60, what="the run to work")
    assert runs.testbed.node
    runs.testbed.node.kill(ns, runs.get("resumed")["status"]["pod"])
    runs.wait_phase("approval", "Waiting", timeout=60)
    send_event(runs, "approval", "go", {"by": "security"})
    expected = {"resumed": "Succeeded", "badcreds": "Failed", "typo": "Failed", "approval": "Succeeded",
                "raising": "Failed"}
    for name, phase in expected.items():
        assert runs.wait_phase(name, "Succeeded", "Failed", "Aborted", timeout=120)["status"]["phase"] == phase
    assert runs.get("resumed")["status"]["restarts"] == 1

    # The scan finds a secret where one is: the Secret object holds it (base64).
    assert leaks(kubectl("get", "secret", "llm", "-n", ns, "-o", "json").stdout.encode(), values) == \
        ["a canary API key"]
    found: dict[str, list[str]] = {}
    for what, args in {"Events": ["get", "events"], "DurableRuns": ["get", "dr"], "pods": ["get", "pods"]}.items():
        hit = leaks(kubectl(*args, "-n", ns, "-o", "json").stdout.encode(), values)
        if hit:
            found[what] = hit
    metrics = json.dumps(sorted((k[0], sorted(k[1]), v) for k, v in scrape(operator).items())).encode()
    if hit := leaks(metrics, values):
        found["metrics"] = hit
    s3 = store.server.client()
    for obj in s3.list_objects_v2(Bucket=store.bucket).get("Contents", []):
        if hit := leaks(s3.get_object(Bucket=store.bucket, Key=obj["Key"])["Body"].read(), values):
            found[f"s3://{store.bucket}/{obj['Key']}"] = hit
    in_files, scanned = scan_files(testbed_root, values)
    found.update(in_files)
    assert not found, f"secret values leaked: {found}"
    # The logs that were scanned are the real ones: the runners' (DEBUG) and the operator's.
    runner_logs = [p for p in scanned if p.name == "runner.log" and p.parent.name.startswith(f"{ns}_resumed-a1_")]
    assert runner_logs
    assert "DEBUG" in runner_logs[0].read_text(errors="replace")
    assert operator.process.log_path in scanned
    assert operator.process.log_path.stat().st_size > 0
