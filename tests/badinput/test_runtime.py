"""Bad input that only shows at run time: each ends in a clear message and condition, no restart loop,
and nothing already journaled is lost or overwritten (docs/bad-input.md has the table)."""

from __future__ import annotations

import json
import time
from typing import Any

import pytest

from durablerun_testbed import procs
from tests.faults.helpers import Ledger, PodRecorder, events, manifest, send_event, torture_input
from tests.faults.journal import list_objects, run_root
from tests.operator.conftest import Operator, RunEnv

pytestmark = pytest.mark.testbed

SETTLE = 3.0  # seconds a finished run is watched for a restart that must not come (6 operator resyncs)


def failed_once(runs: RunEnv, name: str, *, restarts: int = 0, timeout: float = 90) -> dict[str, Any]:
    """The run ends Failed with a Failed condition, and stays so: no new attempt, no restart."""
    status = runs.wait_phase(name, "Failed", "Aborted", "Succeeded", timeout=timeout)["status"]
    assert status["phase"] == "Failed", status
    conditions = {c["type"]: c for c in status["conditions"]}
    assert conditions["Failed"]["status"] == "True"
    assert conditions["Failed"]["message"] == status["message"][:1024]
    assert conditions["Progressing"]["status"] == "False"
    assert status["restarts"] == restarts
    deadline = time.monotonic() + SETTLE
    while time.monotonic() < deadline:  # an observation window: the run must not move again
        again = runs.get(name)["status"]
        assert (again["phase"], again["attempt"], again["restarts"]) == ("Failed", status["attempt"], restarts)
        time.sleep(0.25)
    assert events(runs, name)["Failed"] == 1
    return dict(status)


def root_of(runs: RunEnv, name: str) -> str:
    return run_root("runs", runs.namespace, name, runs.get(name)["metadata"]["uid"])


def objects(runs: RunEnv, name: str) -> dict[str, str]:
    assert runs.testbed.s3
    return list_objects(runs.testbed.s3.client(), runs.bucket, root_of(runs, name))


def test_unknown_module(operator: Operator, runs: RunEnv) -> None:
    runs.apply(manifest(runs, "nomod", "no_such_module:run"))
    status = failed_once(runs, "nomod")
    assert status["attempt"] == 1
    assert "no module named 'no_such_module'" in status["message"]
    assert "PYTHONPATH" in status["message"]


def test_unknown_function(operator: Operator, runs: RunEnv) -> None:
    runs.apply(manifest(runs, "nofn", "torture_flows:no_such_function"))
    status = failed_once(runs, "nofn")
    assert "module 'torture_flows' has no attribute 'no_such_function'" in status["message"]


def test_workflow_raising_at_import(operator: Operator, runs: RunEnv) -> None:
    runs.apply(manifest(runs, "broken", "broken_at_import:run"))
    status = failed_once(runs, "broken")
    assert "raised while being imported" in status["message"]
    assert "config.yaml not found" in status["message"]


@pytest.mark.parametrize(("workflow", "says"), [
    ("bad_flows:unserializable", "not JSON-serializable: builtins.object at result"),
    ("bad_flows:oversized", "over the hard limit of 67,108,864 bytes"),
])
def test_bad_step_results_fail_the_run_and_keep_what_was_journaled(operator: Operator, runs: RunEnv,
                                                                  workflow: str, says: str) -> None:
    runs.apply(manifest(runs, "result", workflow, input=torture_input("result")))
    status = failed_once(runs, "result", timeout=120)
    assert says in status["message"]
    assert "Return JSON types" in status["message"] or "Store large data elsewhere" in status["message"]
    # The step before is journaled and was not run again; the bad step ran once (no retries: non-retryable).
    ledger = Ledger.read(runs, "result")
    assert len(ledger.starts("first")) == 1
    assert len([line for line in ledger.lines if line[0] == "start"]) == 2
    assert "journal/000000000000.json" in objects(runs, "result")


def test_missing_bucket(operator: Operator, runs: RunEnv) -> None:
    body = manifest(runs, "nobucket", input=torture_input("nobucket"))
    body["spec"]["checkpoint"]["uri"] = "s3://no-such-bucket-for-durable-run/runs"
    runs.apply(body)
    status = failed_once(runs, "nobucket")
    assert "the bucket does not exist: create it or fix checkpoint.uri" in status["message"]
    assert "no-such-bucket-for-durable-run" in status["message"]
    assert Ledger.read(runs, "nobucket").lines == []


def test_wrong_credentials(operator: Operator, runs: RunEnv) -> None:
    assert runs.testbed.s3
    wrong = "wrong-" + runs.testbed.s3.secret_key[::-1]
    runs.testbed.kubectl("create", "secret", "generic", "wrong-credentials", "-n", runs.namespace,
                         f"--from-literal=AWS_ACCESS_KEY_ID={runs.testbed.s3.access_key}",
                         f"--from-literal=AWS_SECRET_ACCESS_KEY={wrong}")
    body = manifest(runs, "badcreds", input=torture_input("badcreds"))
    body["spec"]["checkpoint"]["credentialsSecret"] = "wrong-credentials"
    runs.apply(body)
    status = failed_once(runs, "badcreds")
    assert "access denied" in status["message"]
    assert "check the credentials (checkpoint.credentialsSecret" in status["message"]
    assert wrong not in json.dumps(runs.get("badcreds"))
    assert Ledger.read(runs, "badcreds").lines == []


def test_missing_secret_waits_with_a_clear_message_then_runs(operator: Operator, runs: RunEnv,
                                                             pods: PodRecorder) -> None:
    assert runs.testbed.s3
    body = manifest(runs, "nosecret", input=torture_input("nosecret", rounds=1))
    body["spec"]["checkpoint"]["credentialsSecret"] = "not-created-yet"
    runs.apply(body)
    run = procs.wait_for(lambda: "CreateContainerConfigError" in (runs.get("nosecret")["status"].get("message") or "")
                         and runs.get("nosecret"), timeout=60, what="the missing Secret in the run's status")
    status = run["status"]
    assert 'secret "not-created-yet" not found' in status["message"]
    conditions = {c["type"]: c for c in status["conditions"]}
    assert conditions["Progressing"]["message"] == status["message"]
    assert status["restarts"] == 0
    assert status["attempt"] == 1
    warnings = [e for e in runs.events("nosecret") if e["reason"] == "CreateContainerConfigError"]
    assert warnings
    assert warnings[0]["type"] == "Warning"
    # No restart loop while it waits; and once the Secret exists, the same attempt starts and finishes.
    runs.testbed.kubectl("create", "secret", "generic", "not-created-yet", "-n", runs.namespace,
                         f"--from-literal=AWS_ACCESS_KEY_ID={runs.testbed.s3.access_key}",
                         f"--from-literal=AWS_SECRET_ACCESS_KEY={runs.testbed.s3.secret_key}")
    status = runs.wait_phase("nosecret", "Succeeded", timeout=120)["status"]
    assert status["attempt"] == 1
    assert status["restarts"] == 0
    assert pods.pods_of("nosecret") == ["nosecret-a1"]


def test_input_changed_after_the_first_attempt(operator: Operator, runs: RunEnv) -> None:
    runs.apply(manifest(runs, "fixed", "bad_flows:approval", input=torture_input("fixed")))
    runs.wait_phase("fixed", "Waiting", timeout=60)
    before = objects(runs, "fixed")
    runs.testbed.kubectl("patch", "dr", "fixed", "-n", runs.namespace, "--type=merge",
                         "-p", json.dumps({"spec": {"input": {"ledger": "/tmp/ledger/other.txt"}}}))
    send_event(runs, "fixed", "go", {"ok": True})
    status = failed_once(runs, "fixed")
    assert "InputMismatch: spec.input changed after the first attempt" in status["message"]
    assert "restore it, or create a new DurableRun" in status["message"]
    assert objects(runs, "fixed") == before, "the journal changed"
    assert len(Ledger.read(runs, "fixed").starts("s3")) == 0


def flip(runs: RunEnv, key: str, how: str) -> bytes:
    """Damage one stored object in place: flip one byte of its body, or cut it short."""
    assert runs.testbed.s3
    s3 = runs.testbed.s3.client()
    data = s3.get_object(Bucket=runs.bucket, Key=key)["Body"].read()
    if how == "flipped":
        index = data.index(b'"body":') + len(b'"body":') + 3
        data = data[:index] + bytes([data[index] ^ 0x01]) + data[index + 1:]
    else:
        data = data[: len(data) // 2]
    s3.put_object(Bucket=runs.bucket, Key=key, Body=data)
    return bytes(data)


@pytest.mark.parametrize(("target", "how"), [
    ("record", "flipped"), ("record", "truncated"), ("chunk", "flipped"), ("snapshot", "truncated"),
    ("manifest", "flipped"),
])
def test_damaged_journal_objects_fail_loudly_and_nothing_is_overwritten(
        operator: Operator, runs: RunEnv, target: str, how: str) -> None:
    """A damaged object is a loud error naming the object, never a fresh start; every object stays as it is."""
    assert runs.testbed.s3
    node = runs.testbed.node
    assert node
    name = f"{target}-{how}"
    body = manifest(runs, name, "bad_flows:approval", input=torture_input(name, slow=20 if target == "record" else 0.3),
                    policy={"backoff": {"initial": "4s", "max": "4s"}})
    runs.apply(body)
    root = root_of(runs, name)
    if target == "record":
        # A record after the last snapshot: crash the runner mid-run (no final snapshot), damage it in Backoff.
        procs.wait_for(lambda: Ledger.read(runs, name).starts("s2"), timeout=60, what="step s2 to start")
        node.kill(runs.namespace, runs.get(name)["status"]["pod"])
        runs.wait_phase(name, "Backoff", timeout=30)
        assert "snapshot.json" not in objects(runs, name), "the record to damage is covered by a snapshot"
        key, restarts = root + "journal/000000000001.json", 1
    else:
        # At the wait the attempt ends cleanly with a snapshot: damage it, or the manifest, then send the event.
        runs.wait_phase(name, "Waiting", timeout=60)
        key, restarts = root + {"chunk": "", "snapshot": "snapshot.json", "manifest": "manifest.json"}[target], 0
        if target == "chunk":
            key = root + next(k for k in objects(runs, name) if k.startswith("chunks/"))
    damaged = flip(runs, key, how)
    before = objects(runs, name)
    if target != "record":
        send_event(runs, name, "go", {"ok": True})
    status = failed_once(runs, name, restarts=restarts)
    reason = "checksum mismatch" if how == "flipped" else "not a sealed durable-run envelope"
    assert reason in status["message"], status["message"]
    assert key in status["message"] or key.rsplit("/", 1)[1] in status["message"], status["message"]
    # Only the event we sent may be new (the runner stores spec.events before it loads the journal).
    after = objects(runs, name)
    assert {k: v for k, v in after.items() if k not in ("status.json", "events/go.json")} == \
           {k: v for k, v in before.items() if k != "status.json"}, "an object was written, replaced or removed"
    s3 = runs.testbed.s3.client()
    assert s3.get_object(Bucket=runs.bucket, Key=key)["Body"].read() == damaged
    assert len(Ledger.read(runs, name).starts("s0")) == 1, "the run started over"
