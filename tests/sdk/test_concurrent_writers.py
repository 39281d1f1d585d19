"""Two processes running the same run at once: one wins every position, the other is Fenced."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from durablerun._private.model import StepRecord
from durablerun.api import Outcome
from durablerun.stores import RunRef

from .conftest import StoreSpec, sub_env, wait_until


def test_two_concurrent_writers_exactly_one_wins(durable_store_spec: StoreSpec,
                                                  tmp_path: Path) -> None:
    spec = durable_store_spec
    gate, ledger = tmp_path / "gate", tmp_path / "ledger"
    input_json = json.dumps({"gate": str(gate), "ledger": str(ledger), "steps": 4})
    procs = [
        subprocess.Popen(
            [sys.executable, "-m", "durablerun", "run", "racing:gated", "--run-id", "dup",
             "--store", spec.uri, *spec.cli_args, "--input", input_json, "--quiet"],
            env=sub_env(spec.env), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        for _ in range(2)
    ]
    # Both are inside step 0 (it waits for the gate) before either can journal it.
    def both_in_step_0() -> bool:
        lines = ledger.read_text().splitlines() if ledger.exists() else []
        return len({ln.split()[1] for ln in lines if ln.startswith("enter ")}) == 2

    wait_until(both_in_step_0, timeout=30, what="both writers to be inside step 0")
    gate.touch()
    results = [p.communicate(timeout=60) for p in procs]
    codes = sorted(p.returncode for p in procs)
    assert codes == [Outcome.COMPLETED.exit_code, Outcome.FENCED.exit_code], results
    winner = procs[[p.returncode for p in procs].index(0)]
    loser_err = results[[p.returncode for p in procs].index(5)][1]
    assert "Fenced" in loser_err
    assert "another writer" in loser_err

    rs = spec.open().run_store(RunRef.local("dup"))
    records = rs.load().records
    rs.close()
    # Every journaled position was written by one writer: the winner's attempt.
    assert [r.name for r in records if r.kind == "step"] == ["s0", "s1", "s2", "s3"]
    assert len({r.w for r in records}) == 1
    winner_pid = json.loads(results[[p.returncode for p in procs].index(0)][0])[0]["pid"]
    assert winner.pid == winner_pid
    assert all(r.value["pid"] == winner.pid for r in records if isinstance(r, StepRecord))
