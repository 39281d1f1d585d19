"""kube-apiserver restarted in the middle of several runs: renewals retry, nobody is fenced while the lease holds.

A control plane of the test's own (so no other test loses its API server);
the server is stopped and started again on the same port, certificates and
tokens at a random moment. Runners cannot renew while it is down and keep
retrying; since the outage is shorter than the lease, no runner may be fenced,
no lease declared expired, no attempt restarted: each run finishes in its
first pod, and the journal and result invariants hold.
"""

from __future__ import annotations

import os
import time
import uuid
from pathlib import Path

import pytest

from durablerun_testbed import procs
from durablerun_testbed.s3 import S3Server
from durablerun_testbed.testbed import TestBed
from tests.faults.helpers import finished, reference, seeded, trials_of_each_kind
from tests.helpers import bed
from tests.helpers.fault_workflows import torture_flows
from tests.helpers.journal_checks import check_journal, read_journal, run_root
from tests.helpers.pods import process_of
from tests.helpers.runs import RunEnv, events
from tests.helpers.tally import Tally
from tests.helpers.torture_runs import Ledger, check_executions, manifest, torture_input

pytestmark = pytest.mark.testbed

# A trial is a run that lived through a restart (still running when the API server stopped) and kept every
# check. CI: one restart under 3 runs; FAULT_TRIALS set: restarts under 10 runs each until that many trials.
TRIALS = trials_of_each_kind(3)
RUNS = 10 if os.environ.get("FAULT_TRIALS") else 3
POLICY = {"maxRestarts": 5, "leaseDuration": "30s", "backoff": {"initial": "1s", "max": "1s"}}


def test_apiserver_restarted_mid_run(own_bed: TestBed, s3_server: S3Server, testbed_root: Path, tmp_path: Path,
                                     tally: Tally) -> None:
    namespace = "t-" + uuid.uuid4().hex[:10]
    own_bed.kubectl("create", "namespace", namespace)
    procs.wait_for(lambda: own_bed.kubectl("get", "serviceaccount", "default", "-n", namespace,
                                           check=False).returncode == 0, timeout=30, what="the default ServiceAccount")
    # The operator tests' fixtures, on this control plane.
    runs: RunEnv = bed.runs.__wrapped__(own_bed, namespace, s3_server.create_bucket(
        "t-" + uuid.uuid4().hex[:16]), tmp_path)
    operators = bed.start_operator.__wrapped__(own_bed, testbed_root, namespace)
    start_operator = next(operators)
    rng = seeded("API server restart")
    assert own_bed.controlplane
    assert own_bed.s3
    trials, failed = 0, []
    try:
        start_operator()
        restart = -1
        while trials < TRIALS:
            restart += 1
            names = [f"a{restart}-{i}" for i in range(RUNS)]
            inputs = {n: torture_input(n, rounds=4, pace=0.5) for n in names}
            expected = {n: reference(inputs[n], tmp_path) for n in names}
            for name in names:
                runs.apply(manifest(runs, name, input=inputs[name], policy=POLICY))
            procs.wait_for(lambda names=names: all(Ledger.read(runs, n).starts("r0-plan") for n in names),
                           timeout=90, what="every run to start working")
            roots = {n: run_root("runs", namespace, n, runs.get(n)["metadata"]["uid"]) for n in names}
            time.sleep(rng.uniform(0.5, 3.0))  # the random moment of the restart
            affected = [n for n in names if not finished(runs, n)]
            trials += len(affected)
            began = time.monotonic()
            own_bed.controlplane.restart_apiserver()
            print(f"API server restart {restart}: unreachable for {time.monotonic() - began:.1f}s")
            for name in names:
                try:
                    status = runs.wait_phase(name, "Succeeded", "Failed", "Aborted", timeout=180)["status"]
                    assert status["phase"] == "Succeeded", status.get("message")
                    # No false fencing: the first pod held its lease throughout and finished the run.
                    assert (status["attempt"], status["restarts"], status["epoch"]) == (1, 0, 2), status
                    seen = events(runs, name)
                    assert seen["LeaseExpired"] == 0, seen
                    assert seen["Restarting"] == 0, seen
                    entry = process_of(own_bed, namespace, f"{name}-a1")
                    assert entry, f"{name}-a1 unknown to the process node"
                    assert entry["exitCode"] == 0, entry
                    log = Path(entry["log"]).read_text(errors="replace")
                    assert "Fenced" not in log
                    print(f"{name}: {log.count('lease renewal failed')} renewals failed and were retried")
                    journal = read_journal(own_bed.s3.client(), runs.bucket, roots[name])
                    check_journal(journal)
                    assert journal.last
                    assert journal.last["value"] == expected[name][0]
                    assert len(set(journal.writers)) == 1
                    check_executions(Ledger.read(runs, name), torture_flows.step_names(inputs[name]), set())
                except AssertionError as error:
                    trials += name not in affected  # a run that failed is a trial, even one the restart missed
                    failed.append(f"{name}: {error}")
    finally:
        next(operators, None)
        own_bed.kubectl("delete", "namespace", namespace, "--wait=false", check=False)
    tally.add("API server restarted mid-run (runs affected)", trials, len(failed))
    print(f"API server restart: {restart + 1} restarts, {trials} trials, {len(failed)} failures")
    assert not failed, "\n".join(failed)
