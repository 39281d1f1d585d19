"""Generated workflows under random SIGKILLs of the runner process, checked against the oracle.

Each program (tests/faults/generated.py: sequential and gathered steps, nested gathers, retries with
failures, sleeps, waits with events sent early and late, a Saga with compensations, ``continue_as_new``)
runs under ``durablerun run`` on the filesystem store and on S3 (the bed's MinIO); the driver kills the
runner at random moments (after a random number of step calls, plus up to 3 ms, so kills also land inside
journal writes), sends each late event once the run stops to wait for it, and relaunches until the run
completes. Then the result must be the oracle's, the ledger must match the oracle's execution counts as
exactly as the design permits (``generated.check_ledger``), every step journaled once, and the totals those
of an uncrashed run of the same program on a memory store.

Child runs need the operator: tests/faults/test_generated_faults.py runs them on the test bed.
``GEN_PROGRAMS`` programs per store (default: ``FAULT_TRIALS``, so ``make faults`` runs 120 per store);
any mismatch names the program's seed, which ``GEN_SEED=<seed>`` replays.
"""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path
from typing import Any

import pytest

from durablerun import api
from durablerun.engine import Run
from durablerun.stores import RunRef, Store, open_store
from tests.faults import generated
from tests.helpers.fault_workflows import generated_flows
from tests.helpers.local_runs import StoreSpec, s3_store_spec, sub_env, wait_until
from tests.helpers.tally import TALLY
from tests.helpers.torture_runs import WORKFLOWS

PROGRAMS = int(os.environ.get("GEN_PROGRAMS") or os.environ.get("FAULT_TRIALS") or "2")
MAX_KILLS = 3


def _launch(spec: StoreSpec, run_id: str, input: dict[str, Any]) -> subprocess.Popen[str]:
    env = sub_env(spec.env)
    env["PYTHONPATH"] = os.pathsep.join([str(WORKFLOWS), env["PYTHONPATH"]])
    return subprocess.Popen(
        [sys.executable, "-m", "durablerun", "run", "generated_flows:program", "--run-id", run_id,
         "--store", spec.uri, *spec.cli_args, "--input", json.dumps(input), "--quiet", "--retry-initial", "1ms"],
        env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def _lines(path: Path) -> list[str]:
    return path.read_text().splitlines() if path.exists() else []


def _journaled(store: Store, ref: RunRef) -> list[str]:
    rs = store.run_store(ref)
    try:
        return [r.name for r in rs.read_all() if r.kind == "step"]
    finally:
        rs.close()


def reference_totals(program: generated.Program, tmp: Path) -> Any:
    """The totals of the program run once, uncrashed, in this process."""
    store = open_store(f"memory://gen-{uuid.uuid4().hex}")
    ref = RunRef.local("reference")
    for event in generated.early_events(program) + generated.late_events(program):
        store.put_event(run=ref, name=event, payload=generated.payload(event))
    result = Run(store=store, run=ref, workflow=generated_flows.program,
                 input={"ledger": str(tmp / f"ref-{uuid.uuid4().hex}"), "program": program}).run_attempt()
    assert result.outcome == api.Outcome.COMPLETED, result.message
    return result.totals


def run_program(spec: StoreSpec, tmp: Path, seed: int) -> list[str]:
    """Run program ``seed`` under random kills; what it broke of the oracle (empty: nothing)."""
    program = generated.generate(seed)
    rng = random.Random(seed ^ 0x5EED)
    run_id = f"g{seed}"
    ref = RunRef.local(run_id)
    ledger = tmp / f"{run_id}.ledger"
    store = spec.open()
    for event in generated.early_events(program):
        store.put_event(run=ref, name=event, payload=generated.payload(event))
    late = generated.late_events(program)
    calls = sum(generated.expected_steps(program).values())
    kills = rng.randint(0, MAX_KILLS)
    attempts: list[generated.Attempt] = []
    input = {"ledger": str(ledger), "program": program}
    out = None
    for _ in range(kills + len(late) + 3):
        base = len(_lines(ledger))
        proc = _launch(spec, run_id, input)
        killed = False
        if len([a for a in attempts if a.killed]) < kills:
            lines, micros = rng.randint(0, calls), rng.randint(0, 3000)
            wait_until(lambda proc=proc, base=base, lines=lines: proc.poll() is not None
                       or len(_lines(ledger)) - base >= lines, timeout=120, what="the kill point", interval=0.001)
            time.sleep(micros / 1e6)
            if proc.poll() is None:
                proc.send_signal(signal.SIGKILL)
                killed = True
        stdout, stderr = proc.communicate(timeout=120)
        attempts.append(generated.Attempt(str(proc.pid), killed, set(_journaled(store, ref))))
        if killed:
            continue
        if proc.returncode == api.Outcome.WAITING.exit_code:
            if not late:
                return [f"the run waited with no late event left to send: {stderr[-1500:]}"]
            event = late.pop(0)
            store.put_event(run=ref, name=event, payload=generated.payload(event))
            continue
        if proc.returncode != 0:
            return [f"attempt {len(attempts)} exited {proc.returncode}: {stderr[-1500:]}"]
        out = json.loads(stdout)
        break
    problems = []
    if out != generated.expected_result(program):
        problems.append(f"result {out} != the oracle's {generated.expected_result(program)}")
    problems += generated.check_ledger(program, _lines(ledger), attempts)
    steps = sorted(n for n in generated.expected_steps(program))
    if sorted(attempts[-1].journaled) != steps:
        problems.append(f"journaled steps {sorted(attempts[-1].journaled)} != {steps}")
    totals = store.read_run(run=ref).totals
    want = reference_totals(program, tmp)
    if (totals.steps, totals.usd, totals.tokens) != (want.steps, want.usd, want.tokens):
        problems.append(f"totals {totals} != an uncrashed run's {want}")
    return problems


@pytest.mark.parametrize("kind", ["fs", "s3"])
def test_generated_workflows_under_random_kills(kind: str, request: pytest.FixtureRequest, tmp_path: Path) -> None:
    if kind == "fs":
        spec = StoreSpec("fs", f"file://{tmp_path / 'store'}", {}, [], {})
    else:
        spec = s3_store_spec(request.getfixturevalue("s3_server"), request.getfixturevalue("s3_bucket"))
    failed = []
    seeds = generated.seeds(PROGRAMS, f"generated workflows ({kind})")
    for seed in seeds:
        try:
            problems = run_program(spec, tmp_path, seed)
        except Exception as error:  # a timeout or a crash of the driver: still name the seed
            problems = [f"{type(error).__name__}: {error}"]
        if problems:
            failed.append(f"GEN_SEED={seed}: " + "; ".join(problems))
    TALLY.add(f"generated workflows, SIGKILL ({kind})", len(seeds), len(failed))
    assert not failed, "\n".join(failed)
