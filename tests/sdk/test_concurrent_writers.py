"""Two processes running the same run at once: one wins every position, the other is Fenced.

`durablerun run` takes the run id's owner record first, so a second one never starts a step (the last test);
the first test drives two engines directly, as writers that ignore the record would, to prove the journal's
write-once positions, the last line of defence.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from durablerun._private.records.model import StepRecord
from durablerun.api import Outcome
from durablerun.stores import RunRef
from tests.helpers.local_runs import StoreSpec, wait_until

from .helpers import cli, sub_env

# The engine alone, without the CLI's owner record: `python -c ENGINE_ONLY STORE_URI INPUT_JSON`.
ENGINE_ONLY = """
import json, sys
from durablerun.engine import Run
from durablerun.stores import RunRef, open_store
run = Run(store=open_store(sys.argv[1]), run=RunRef.local("dup"), workflow="racing:gated",
          input=json.loads(sys.argv[2]))
result = run.run_attempt()
print(f"durablerun: {result.outcome.value}: {result.message}", file=sys.stderr)
if result.outcome.value == "Completed":
    print(json.dumps(result.result))
sys.exit(result.exit_code)
"""


def test_two_concurrent_writers_exactly_one_wins(durable_store_spec: StoreSpec,
                                                  tmp_path: Path) -> None:
    spec = durable_store_spec
    gate, ledger = tmp_path / "gate", tmp_path / "ledger"
    input_json = json.dumps({"gate": str(gate), "ledger": str(ledger), "steps": 4})
    procs = [
        subprocess.Popen([sys.executable, "-c", ENGINE_ONLY, spec.uri, input_json],
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


def test_a_second_durablerun_run_waits_for_the_first_and_writes_nothing(durable_store_spec: StoreSpec,
                                                                        tmp_path: Path) -> None:
    spec = durable_store_spec
    gate, ledger = tmp_path / "gate", tmp_path / "ledger"
    argv = ["run", "racing:gated", "--run-id", "dup", "--store", spec.uri, *spec.cli_args,
            "--input", json.dumps({"gate": str(gate), "ledger": str(ledger), "steps": 2}), "--quiet"]
    first = subprocess.Popen([sys.executable, "-m", "durablerun", *argv], env=sub_env(spec.env),
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    wait_until(lambda: ledger.exists() and "enter" in ledger.read_text(), timeout=30,
               what="the first run to be inside step 0")
    second = cli(argv, env=spec.env)
    assert second.returncode == Outcome.WAITING.exit_code, second.stderr
    assert "held by `durablerun run` on host" in second.stderr, second.stderr
    assert f"(pid {first.pid})" in second.stderr, second.stderr
    assert len([ln for ln in ledger.read_text().splitlines() if ln.startswith("enter ")]) == 1, "it ran a step"
    gate.touch()
    _, err = first.communicate(timeout=60)
    assert first.returncode == Outcome.COMPLETED.exit_code, err
    again = cli(argv, env=spec.env)  # released: taken at once, the run is already complete
    assert again.returncode == Outcome.COMPLETED.exit_code, again.stderr
