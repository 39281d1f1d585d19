"""Resume anywhere: two clusters (two test-bed control planes, each with its own process node and operator:
the test's own bed and the session's) share one MinIO. A run with spec.checkpoint.runId continues in whichever
cluster holds the store's owner record, and only there: the other waits and says for whom; a holder that comes
back late is fenced.
"""

from __future__ import annotations

import json
import sys
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from durablerun import api
from durablerun._private.records.model import Record, StepRecord
from durablerun._private.storage import owner as owner_record
from durablerun.stores import RunRef, open_store
from durablerun_testbed import procs
from durablerun_testbed.s3 import S3Server
from durablerun_testbed.testbed import TestBed
from tests.helpers.runs import RunEnv, without_logs
from tests.helpers.session import SESSION_ID

pytestmark = pytest.mark.testbed

STEPS = 8
LEASE = 6.0  # spec.policy.leaseDuration of RunEnv.manifest: the status lease and the store lease


@dataclass
class Cluster:
    name: str
    bed: TestBed
    runs: RunEnv
    logs: Path
    operator: procs.ManagedProcess | None = None

    def start_operator(self) -> None:
        self.operator = procs.ManagedProcess(
            f"operator-{self.name}",
            [sys.executable, "-m", "durablerun_operator", "--namespace", self.runs.namespace],
            log_path=self.logs / f"operator-{self.name}-{uuid.uuid4().hex[:6]}.log",
            env={**self.bed.env(), api.OperatorEnv.CLUSTER: self.name, api.OperatorEnv.RESYNC_SECONDS: "0.5",
                 api.OperatorEnv.METRICS_PORT: "0", api.OperatorEnv.HEALTH_PORT: str(procs.free_port()),
                 api.OperatorEnv.STUCK_TERMINATING_SECONDS: "10"},
            testbed_id=SESSION_ID,
        )

    def stop_operator(self) -> None:
        if self.operator is not None:
            self.operator.stop()
            self.operator = None

    def condition(self, run: dict[str, Any], kind: str) -> dict[str, Any]:
        return next(c for c in run["status"]["conditions"] if c["type"] == kind)


def prepare_namespace(bed: TestBed, name: str, s3: S3Server, namespace: str) -> None:
    bed.kubectl("create", "namespace", namespace)
    procs.wait_for(
        lambda: bed.kubectl("get", "serviceaccount", "default", "-n", namespace, check=False).returncode == 0,
        timeout=30, what=f"the default ServiceAccount in {namespace} of cluster {name}")
    bed.kubectl("create", "secret", "generic", "s3-credentials", "-n", namespace,
                f"--from-literal=AWS_ACCESS_KEY_ID={s3.access_key}",
                f"--from-literal=AWS_SECRET_ACCESS_KEY={s3.secret_key}")


@pytest.fixture
def clusters(tmp_path: Path, testbed: TestBed, s3_server: S3Server,
             s3_bucket: str) -> Iterator[tuple[Cluster, Cluster]]:
    """Clusters A and B: the same namespace in each, one bucket, one ledger of step executions.

    A is a bed of the test's own (the tests lose it); B is the session's bed, which stays up throughout."""
    ledger = tmp_path / "ledger"
    ledger.mkdir()
    ledger.chmod(0o777)
    namespace = "t-" + uuid.uuid4().hex[:10]
    own = TestBed(tmp_path / "beds" / "cluster-a", id=SESSION_ID).start(s3=s3_server)
    started: list[Cluster] = []
    try:
        own.install_crds()
        for name, bed in (("cluster-a", own), ("cluster-b", testbed)):
            prepare_namespace(bed, name, s3_server, namespace)
            cluster = Cluster(name, bed, RunEnv(bed, namespace, s3_bucket, ledger), tmp_path / "logs")
            cluster.start_operator()
            started.append(cluster)
        yield started[0], started[1]
    finally:
        for cluster in started:
            cluster.stop_operator()
        own.stop()
        testbed.kubectl("delete", "namespace", namespace, "--wait=false", check=False)


def manifest(runs: RunEnv, run_id: str, steps: int = STEPS) -> dict[str, Any]:
    body = runs.manifest("mover", "optest_flows:steps", {"steps": steps, "sleep": 1.0})
    body["spec"]["checkpoint"]["runId"] = run_id
    return body


def owner(runs: RunEnv, run_id: str) -> dict[str, Any]:
    s3 = runs.testbed.s3
    assert s3
    store = open_store(f"s3://{runs.bucket}/runs", endpoint_url=s3.endpoint_url, region=s3.region,
                       access_key=s3.access_key, secret_key=s3.secret_key)
    record = owner_record.read_owner(store.backend, RunRef.local(run_id))
    assert record is not None, "no owner record in the store"
    return record


def journal(runs: RunEnv, run_id: str) -> list[Record]:
    """Every record of the run id's journal, in order."""
    s3 = runs.testbed.s3
    assert s3
    store = open_store(f"s3://{runs.bucket}/runs", endpoint_url=s3.endpoint_url, region=s3.region,
                       access_key=s3.access_key, secret_key=s3.secret_key)
    rs = store.run_store(RunRef.local(run_id))
    try:
        return list(rs.read_all())
    finally:
        rs.close()


def writers(runs: RunEnv, run_id: str) -> set[str]:
    """The attempt ids that wrote the journal."""
    return {record.w for record in journal(runs, run_id)}


def journaled_steps(runs: RunEnv, run_id: str) -> list[str]:
    return [record.name for record in journal(runs, run_id) if isinstance(record, StepRecord)]


def assert_no_completed_step_ran_again(runs: RunEnv, completed: list[str], steps: int = STEPS) -> None:
    ledger = runs.ledger()
    reference = [f"S{i}" for i in range(steps)]
    assert f"result {json.dumps(reference)}" in ledger, ledger
    counts = {f"s{i}": runs.executions(f"s{i}") for i in range(steps)}
    assert all(counts[step] == 1 for step in completed), f"a completed step ran again: {counts}"
    assert sum(counts.values()) <= steps + 1, f"more than the one in-flight step ran twice: {counts}"


def takeover_seconds(before: dict[str, Any], after: dict[str, Any]) -> float:
    """From the old holder's last renewal to the new holder's acquisition (one machine's clock here)."""
    return (api.parse_time(after["acquireTime"]) - api.parse_time(before["renewTime"])).total_seconds()


def test_a_run_moves_to_another_cluster_when_its_own_is_lost(clusters: tuple[Cluster, Cluster]) -> None:
    a, b = clusters
    run_id = "mover-" + uuid.uuid4().hex[:6]
    a.runs.apply(manifest(a.runs, run_id))
    procs.wait_for(lambda: "done s1" in a.runs.ledger(), timeout=90, what="step s1 to finish in cluster A")

    # Cluster A is lost for good: control plane, node (and so its runner) and operator.
    a.stop_operator()
    a.bed.stop()
    lost = time.time()
    completed = journaled_steps(a.runs, run_id)
    held = owner(a.runs, run_id)
    assert held["holder"]["cluster"] == "cluster-a"
    assert not held["released"]

    # The same manifest, applied to cluster B, continues the journal.
    b.runs.apply(manifest(b.runs, run_id))
    run = b.runs.wait_phase("mover", "Succeeded", "Failed", "Aborted", timeout=120)
    finished = time.time()
    assert run["status"]["phase"] == "Succeeded", run["status"].get("message")
    assert_no_completed_step_ran_again(b.runs, completed)
    assert run["status"]["progress"]["completedSteps"] == STEPS
    wide = b.bed.kubectl("get", "dr", "mover", "-n", b.runs.namespace, "-o", "wide").stdout
    assert "RUN ID" in wide, wide
    assert run_id in wide, wide

    taken = owner(b.runs, run_id)
    assert taken["holder"]["cluster"] == "cluster-b", taken
    assert taken["released"], taken
    lag = takeover_seconds(held, taken)
    # Never before the old holder's lease could have lapsed; then soon (the margin, a poll, a pod start).
    assert LEASE <= lag < LEASE + owner_record.MARGIN_SECONDS + 20, lag
    print(f"\ntakeover after cluster A was lost: {lag:.1f}s from A's last store renewal to B's acquisition "
          f"(store lease {LEASE:g}s + margin {owner_record.MARGIN_SECONDS:g}s); A lost -> B finished "
          f"{finished - lost:.1f}s")


def test_with_both_alive_one_writes_the_other_waits_and_a_late_holder_is_fenced(
        clusters: tuple[Cluster, Cluster]) -> None:
    a, b = clusters
    run_id = "shared-" + uuid.uuid4().hex[:6]
    steps = 30  # A is still writing when B has reported whom it waits for
    a.runs.apply(manifest(a.runs, run_id, steps))
    procs.wait_for(lambda: "done s1" in a.runs.ledger(), timeout=90, what="step s1 to finish in cluster A")

    # B gets the same run while A writes it: B waits, naming A, and writes nothing.
    b.runs.apply(manifest(b.runs, run_id, steps))
    waiting = b.runs.wait_phase("mover", "Waiting", timeout=60)["status"]
    holder = waiting["waitingFor"]["holder"]
    assert "cluster cluster-a" in holder, holder
    assert f"DurableRun {a.runs.namespace}/mover" in holder, holder
    progressing = b.condition(b.runs.get("mover"), "Progressing")
    assert progressing["reason"] == "JournalHeld", progressing
    assert "cluster cluster-a" in progressing["message"], progressing
    assert len(writers(a.runs, run_id)) == 1, "a second writer wrote the journal"
    assert a.runs.get("mover")["status"]["phase"] == "Running"

    # A is partitioned: its runner stops (SIGSTOP) and its operator is gone. B takes over once A's store
    # lease has lapsed, and finishes the run.
    pod_a = str(a.runs.get("mover")["status"]["pod"])
    assert a.bed.node
    a.bed.node.pause(a.runs.namespace, pod_a)
    a.stop_operator()
    completed = journaled_steps(a.runs, run_id)
    held = owner(a.runs, run_id)
    run = b.runs.wait_phase("mover", "Succeeded", "Failed", "Aborted", timeout=150)
    assert run["status"]["phase"] == "Succeeded", run["status"].get("message")
    assert_no_completed_step_ran_again(b.runs, completed, steps)
    taken = owner(b.runs, run_id)
    lag = takeover_seconds(held, taken)
    assert lag >= LEASE, f"B took the journal {lag:.1f}s after A's last renewal, inside A's lease"
    print(f"\ntakeover from a partitioned cluster A: {lag:.1f}s from A's last store renewal to B's acquisition "
          f"(store lease {LEASE:g}s; B's waiting attempt retries once per lease)")

    # A's runner comes back: it must stop, Fenced, writing nothing.
    objects, ledger = b.runs.store_objects(), b.runs.ledger()
    a.bed.node.cont(a.runs.namespace, pod_a)

    def ended() -> dict[str, Any] | None:
        pod = json.loads(a.bed.kubectl("get", "pod", pod_a, "-n", a.runs.namespace, "-o", "json").stdout)
        state = ((pod["status"].get("containerStatuses") or [{}])[0].get("state") or {})
        return state.get("terminated")

    terminated = procs.wait_for(ended, timeout=60, what=f"A's runner {pod_a} to exit after it is continued")
    assert terminated["exitCode"] == 5, terminated
    assert json.loads(terminated["message"])["outcome"] == "Fenced", terminated
    assert without_logs(b.runs.store_objects()) == without_logs(objects), "the fenced runner wrote to the store"
    assert not [line for line in b.runs.ledger()[len(ledger):] if line.startswith("start")]
    assert owner(b.runs, run_id) == taken

    # Deleting the run in A with retention Delete keeps the journal: it has moved on to B.
    namespace = a.runs.namespace
    a.bed.kubectl("patch", "dr", "mover", "-n", namespace, "--type=merge",
                  "-p", json.dumps({"spec": {"checkpoint": {"retention": "Delete"}}}))
    a.bed.kubectl("delete", "dr", "mover", "-n", namespace, "--wait=false")
    a.start_operator()
    kept = procs.wait_for(
        lambda: [e for e in a.runs.events("mover") if e["reason"] in ("JournalKept", "JournalDeleted")],
        timeout=90, what="A's purge of the deleted run to report")
    assert kept[0]["reason"] == "JournalKept", kept
    assert "last held by DurableRun" in kept[0]["message"], kept
    assert "cluster cluster-b" in kept[0]["message"], kept
    assert without_logs(b.runs.store_objects()) == without_logs(objects), \
        "deleting the run in A touched the journal B continued"
