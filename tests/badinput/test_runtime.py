"""Bad input that only shows at run time: each ends in a clear message and condition, no restart loop,
and nothing already journaled is lost or overwritten (docs/bad-input.md has the table).

Cases run side by side in one namespace (one operator), then are watched
together for a restart that must not come; a failure names its case.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import pytest

from durablerun_testbed import procs
from tests.helpers.failing_runs import check_all, failed, flip, journal, objects, root_of, stay_failed
from tests.helpers.pods import PodRecorder
from tests.helpers.runs import Operator, RunEnv, send_event
from tests.helpers.torture_runs import Ledger, manifest, torture_input

pytestmark = pytest.mark.testbed

# Runs that end by their own exit, started eight at once: on a loaded machine a runner can take longer than the
# bed's 6 s lease to start, and its restart (attempt 2) is not what these cases are about.
LONG_LEASE = {"leaseDuration": "60s"}

def test_runs_that_cannot_start_or_finish_fail_once(operator: Operator, runs: RunEnv) -> None:
    assert runs.testbed.s3
    wrong = "wrong-" + runs.testbed.s3.secret_key[::-1]
    runs.testbed.kubectl("create", "secret", "generic", "wrong-credentials", "-n", runs.namespace,
                         f"--from-literal=AWS_ACCESS_KEY_ID={runs.testbed.s3.access_key}",
                         f"--from-literal=AWS_SECRET_ACCESS_KEY={wrong}")
    nobucket = manifest(runs, "nobucket", policy=LONG_LEASE, input=torture_input("nobucket"))
    nobucket["spec"]["checkpoint"]["uri"] = "s3://no-such-bucket-for-durable-run/runs"
    badcreds = manifest(runs, "badcreds", policy=LONG_LEASE, input=torture_input("badcreds"))
    badcreds["spec"]["checkpoint"]["credentialsSecret"] = "wrong-credentials"
    # No Secret and no workload identity: the runner finds no credentials at all.
    nocreds = manifest(runs, "nocreds", policy=LONG_LEASE, input=torture_input("nocreds"))
    del nocreds["spec"]["checkpoint"]["credentialsSecret"]
    nocreds["spec"]["template"]["spec"]["containers"][0]["env"].append(
        {"name": "AWS_EC2_METADATA_DISABLED", "value": "true"})  # no instance metadata on loopback
    for body in (manifest(runs, "nomod", "no_such_module:run", policy=LONG_LEASE),
                 manifest(runs, "nofn", "torture_flows:no_such_function", policy=LONG_LEASE),
                 manifest(runs, "broken", "broken_at_import:run", policy=LONG_LEASE),
                 manifest(runs, "opaque", "bad_flows:unserializable", policy=LONG_LEASE, input=torture_input("opaque")),
                 manifest(runs, "huge", "bad_flows:oversized", policy=LONG_LEASE, input=torture_input("huge")),
                 nobucket, badcreds, nocreds):
        runs.apply(body)
    statuses: dict[str, dict[str, Any]] = {}

    def ends(name: str, *says: str) -> Callable[[], None]:
        def check() -> None:
            statuses[name] = status = failed(runs, name)
            assert status["attempt"] == 1
            for phrase in says:
                assert phrase in status["message"], status["message"]
        return check

    def kept_what_was_journaled(name: str) -> None:
        # The step before is journaled and was not run again; the bad step ran once (non-retryable).
        ledger = Ledger.read(runs, name)
        assert len(ledger.starts("first")) == 1
        assert len([line for line in ledger.lines if line[0] == "start"]) == 2
        assert "journal/000000000000.json" in objects(runs, name)

    def wrong_secret_not_shown() -> None:
        assert wrong not in json.dumps(runs.get("badcreds"))

    def nothing_ran_without_a_store() -> None:
        assert not Ledger.read(runs, "nobucket").lines
        assert not Ledger.read(runs, "badcreds").lines
        assert not Ledger.read(runs, "nocreds").lines

    check_all({
        "unknown module": ends("nomod", "no module named 'no_such_module'", "PYTHONPATH"),
        "unknown function": ends("nofn", "module 'torture_flows' has no attribute 'no_such_function'"),
        "raising at import": ends("broken", "raised while being imported", "config.yaml not found"),
        "non-serializable result": ends("opaque", "not JSON-serializable: builtins.object at result",
                                        "Return JSON types"),
        "non-serializable result keeps the journal": lambda: kept_what_was_journaled("opaque"),
        "oversized result": ends("huge", "over the hard limit of 67,108,864 bytes", "Store large data elsewhere"),
        "oversized result keeps the journal": lambda: kept_what_was_journaled("huge"),
        "missing bucket": ends("nobucket", "the bucket does not exist: create it or fix checkpoint.uri",
                               "no-such-bucket-for-durable-run"),
        "wrong credentials": ends("badcreds", "access denied",
                                  "check the credentials (checkpoint.credentialsSecret",
                                  f"credentials come from Secret {runs.namespace}/wrong-credentials"),
        "wrong credentials are not shown": wrong_secret_not_shown,
        "no credentials": ends("nocreds", "no usable S3 credentials", "spec.checkpoint.credentialsSecret is not set"),
        "nothing ran without a store": nothing_ran_without_a_store,
    })
    stay_failed(runs, statuses)


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
    # The kubelet's reason, where kubectl get -o wide (REASON) and kubectl wait read it.
    assert status["reason"] == conditions["Progressing"]["reason"] == "CreateContainerConfigError", status
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
    assert "reason" not in status, status  # the pod started: nothing wrong any more
    assert pods.pods_of("nosecret") == ["nosecret-a1"]


def test_input_change_of_a_running_run_is_refused(operator: Operator, runs: RunEnv) -> None:
    """The API server refuses it, so the run finishes on the input it started with, whatever restarts happen."""
    original = torture_input("fixed")
    runs.apply(manifest(runs, "fixed", "bad_flows:approval", input=original))
    runs.wait_phase("fixed", "Waiting", timeout=60)
    refused = runs.testbed.kubectl("patch", "dr", "fixed", "-n", runs.namespace, "--type=merge",
                                   "-p", json.dumps({"spec": {"input": {"ledger": "/tmp/ledger/other.txt"}}}),
                                   check=False)
    assert refused.returncode != 0
    assert "spec.input is immutable" in refused.stderr
    assert "create a new DurableRun" in refused.stderr
    assert runs.get("fixed")["spec"]["input"] == original
    send_event(runs, "fixed", "go", {"ok": True})
    assert runs.wait_phase("fixed", "Succeeded", "Failed", timeout=60)["status"]["phase"] == "Succeeded"


DAMAGE = [("record", "flipped"), ("record", "truncated"), ("chunk", "flipped"), ("snapshot", "truncated"),
          ("manifest", "flipped")]


def test_damaged_journal_objects_fail_loudly_and_nothing_is_overwritten(operator: Operator, runs: RunEnv) -> None:
    """A damaged object is a loud error naming the object, never a fresh start; every object stays as it is."""
    assert runs.testbed.s3
    node = runs.testbed.node
    assert node
    for target, how in DAMAGE:
        name = f"{target}-{how}"
        runs.apply(manifest(runs, name, "bad_flows:approval",
                            input=torture_input(name, slow=30 if target == "record" else 0.3),
                            policy={"backoff": {"initial": "4s", "max": "4s"}}))
    damaged: dict[str, tuple[str, bytes, dict[str, str], int]] = {}
    for target, how in DAMAGE:
        name = f"{target}-{how}"
        root = root_of(runs, name)
        if target == "record":
            # A record after the last snapshot: crash the runner mid-run (no final snapshot), damage it in Backoff.
            procs.wait_for(lambda name=name: Ledger.read(runs, name).starts("s2"), timeout=60, what="step s2")
            node.kill(runs.namespace, runs.get(name)["status"]["pod"])
            runs.wait_phase(name, "Backoff", timeout=30)
            assert "snapshot.json" not in objects(runs, name), "the record to damage is covered by a snapshot"
            key, restarts = root + "journal/000000000001.json", 1
        else:
            # At the wait the attempt ends cleanly with a snapshot: damage it, or the manifest.
            runs.wait_phase(name, "Waiting", timeout=60)
            rel = {"chunk": "", "snapshot": "snapshot.json", "manifest": "manifest.json"}[target]
            key = root + (rel or next(k for k in objects(runs, name) if k.startswith("chunks/")))
            restarts = 0
        damaged[name] = (key, flip(runs, key, how), objects(runs, name), restarts)
    for name in damaged:
        if not name.startswith("record"):
            send_event(runs, name, "go", {"ok": True})
    statuses: dict[str, dict[str, Any]] = {}

    def loud(name: str, how: str) -> Callable[[], None]:
        def check() -> None:
            key, data, before, restarts = damaged[name]
            statuses[name] = status = failed(runs, name, restarts=restarts)
            reason = "checksum mismatch" if how == "flipped" else "not a sealed durable-run envelope"
            assert reason in status["message"], status["message"]
            assert key.rsplit("/", 1)[1] in status["message"], status["message"]
            # Only the event we sent may be new (the runner stores spec.events before it loads the journal).
            after = journal(objects(runs, name))
            assert {k: v for k, v in after.items() if k != "events/go.json"} == journal(before), \
                "an object was written or removed"
            assert runs.testbed.s3
            stored = runs.testbed.s3.client().get_object(Bucket=runs.bucket, Key=key)["Body"].read()
            assert stored == data, "the damaged object was replaced"
            assert len(Ledger.read(runs, name).starts("s0")) == 1, "the run started over"
        return check

    check_all({f"{target} {how}": loud(f"{target}-{how}", how) for target, how in DAMAGE})
    stay_failed(runs, statuses)
