"""The S3 server stopped for 30 s in the middle of several runs, then started again on the same port and data.

Runners retry with backoff and carry on, or end their attempt cleanly as a
crash the operator restarts (exit 70, StoreUnavailableError, never a stack of
half-written state); nothing stored before the outage is lost or changed, no
journal position is written twice, and every run ends with the uncrashed
reference's result. A MinIO of the test's own is stopped, so no other test
notices. ``FAULT_S3_OUTAGE_SECONDS`` sets the outage (default 30).
"""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

from durablerun_testbed import procs
from tests.faults.helpers import finished, reference, seeded, trials_of_each_kind
from tests.helpers.bed import StartStore
from tests.helpers.fault_workflows import torture_flows
from tests.helpers.journal_checks import check_journal, check_kept, list_objects, read_journal, run_root
from tests.helpers.pods import PodRecorder
from tests.helpers.runs import Operator, RunEnv, events
from tests.helpers.tally import Tally
from tests.helpers.torture_runs import Ledger, check_executions, manifest, torture_input

pytestmark = pytest.mark.testbed

OUTAGE = float(os.environ.get("FAULT_S3_OUTAGE_SECONDS", "30"))
# A trial is a run that lived through an outage (still running when the server stopped) and kept every
# check. CI: one outage under 3 runs; FAULT_TRIALS set: outages under 10 runs each until that many trials.
TRIALS = trials_of_each_kind(3)
RUNS = 10 if os.environ.get("FAULT_TRIALS") else 3
POLICY = {"maxRestarts": 10, "leaseDuration": "20s", "backoff": {"initial": "2s", "max": "5s"}}


def test_s3_stopped_mid_run_then_started(operator: Operator, runs: RunEnv, pods: PodRecorder,
                                        dedicated_store: StartStore, tally: Tally, tmp_path: Path) -> None:
    store = dedicated_store()
    s3 = store.server.client()
    rng = seeded("S3 outage")
    trials, failed, outage = 0, [], -1
    while trials < TRIALS:
        outage += 1
        names = [f"s{outage}-{i}" for i in range(RUNS)]
        inputs = {n: torture_input(n, rounds=4, pace=0.4) for n in names}
        expected = {n: reference(inputs[n], tmp_path) for n in names}
        for name in names:
            runs.apply(store.use(manifest(runs, name, input=inputs[name], policy=POLICY, snapshot_every=4)))
        roots = {n: run_root("runs", runs.namespace, n, runs.get(n)["metadata"]["uid"]) for n in names}
        # Mid-run: every run has journaled something, then a random moment later the server goes away.
        procs.wait_for(lambda names=names: all(Ledger.read(runs, n).starts("r0-plan") for n in names), timeout=90,
                       what="every run to start working")
        time.sleep(rng.uniform(0.5, 3.0))
        before = {n: list_objects(s3, store.bucket, roots[n]) for n in names}
        affected = [n for n in names if not finished(runs, n)]
        store.server.stop()
        stopped = time.monotonic()
        time.sleep(OUTAGE)  # the outage itself: the fault being injected, not a wait for a condition
        store.server.restart()
        print(f"S3 outage {outage}: down for {time.monotonic() - stopped:.1f}s")
        trials += len(affected)
        for name in names:
            try:
                status = runs.wait_phase(name, "Succeeded", "Failed", "Aborted", timeout=300)["status"]
                assert status["phase"] == "Succeeded", status.get("message")
                journal = read_journal(s3, store.bucket, roots[name])
                check_journal(journal)
                check_kept(before[name], journal.etags)
                assert journal.last
                assert journal.last["value"] == expected[name][0]
                # Attempts the outage ended, ended as crashes saying why; each is one restart, nothing more.
                ended = {p: pods.ending(p) or {} for p in pods.pods_of(name)}
                crashed = {p for p, e in ended.items() if e.get("exitCode") not in (0, None)}
                for pod in crashed:
                    assert ended[pod]["exitCode"] == 70, ended[pod]
                    assert "StoreUnavailableError" in (ended[pod]["message"] or ""), ended[pod]
                assert status["restarts"] == len(crashed)
                print(f"{name}: {'carried on' if not crashed else f'{len(crashed)} attempt(s) ended as crashes'}")
                assert events(runs, name)["Restarting"] == len(crashed)
                pods.check_one_pod_per_epoch(name, status["attempt"])
                check_executions(Ledger.read(runs, name), torture_flows.step_names(inputs[name]), crashed)
            except AssertionError as error:
                trials += name not in affected  # a run that failed is a trial, even one the outage missed
                failed.append(f"{name}: {error}")
    tally.add(f"S3 server stopped for {OUTAGE:g}s mid-run (runs affected)", trials, len(failed))
    print(f"S3 outage: {outage + 1} outages, {trials} trials, {len(failed)} failures")
    assert not failed, "\n".join(failed)
