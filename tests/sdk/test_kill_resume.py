"""Kill-and-resume with real processes: SIGKILL at many points, re-run until done.

Invariants after every example:
* a step journaled before a kill never starts again in a later attempt;
* so a step runs again only if it was in flight when its attempt was killed;
* every step is journaled exactly once, and the final result equals an
  uncrashed run's;
* cost and step counters carry over (they equal the uncrashed run's).

Examples: ``DURABLERUN_KILL_EXAMPLES`` (default 20) per store; set it to 200
for a long run.
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
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from durablerun.stores import RunRef

from .conftest import StoreSpec, sub_env, wait_until
from .workflows import chaos

EXAMPLES = int(os.environ.get("DURABLERUN_KILL_EXAMPLES", "20"))

segment = st.one_of(
    st.builds(lambda n: {"kind": "steps", "n": n}, st.integers(1, 6)),
    st.builds(lambda n: {"kind": "gather", "n": n}, st.integers(2, 5)),
    st.just({"kind": "sleep"}),
    st.just({"kind": "uuid"}),
)
shapes = st.lists(segment, min_size=1, max_size=5).filter(
    lambda segs: any(s["kind"] in ("steps", "gather") for s in segs))
# A kill point: after the ledger of the current attempt has this many lines,
# plus a few hundred microseconds so kills also land inside journal writes.
kill_points = st.lists(st.tuples(st.integers(0, 14), st.integers(0, 3000)), min_size=1,
                       max_size=4)


def _ledger_lines(path: Path) -> list[str]:
    try:
        return path.read_text().splitlines()
    except FileNotFoundError:
        return []


def _launch(spec: StoreSpec, run_id: str, input_json: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "durablerun", "run", "chaos:shape", "--run-id", run_id,
         "--store", spec.uri, *spec.cli_args, "--input", input_json, "--quiet",
         "--retry-initial", "1ms"],
        env=sub_env(spec.env), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def journaled_steps(spec: StoreSpec, ref: RunRef) -> list[str]:
    rs = spec.open().run_store(ref)
    try:
        return [r.name for r in rs.load().records if r.kind == "step"]
    finally:
        rs.close()


def run_with_kills(spec: StoreSpec, tmp: Path, segments: list[dict[str, Any]],
                   kills: list[tuple[int, int]]) -> None:
    run_id = "k" + uuid.uuid4().hex[:10]
    ref = RunRef.local(run_id)
    ledger = tmp / f"{run_id}.ledger"
    input_json = json.dumps({"ledger": str(ledger), "segments": segments})
    plan = list(kills)
    journaled_at_kill: list[tuple[int, set[str]]] = []
    final = None
    for attempt_no in range(len(plan) + 3):
        base = len(_ledger_lines(ledger))
        proc = _launch(spec, run_id, input_json)
        if plan:
            lines, micros = plan.pop(0)
            wait_until(lambda proc=proc, base=base, lines=lines: proc.poll() is not None
                       or len(_ledger_lines(ledger)) - base >= lines,
                       timeout=60, what="the kill point", interval=0.0005)
            time.sleep(micros / 1e6)
            if proc.poll() is None:
                proc.send_signal(signal.SIGKILL)
                proc.wait(30)
                if os.environ.get("DURABLERUN_KILL_DEBUG"):
                    print(f"killed attempt {attempt_no} at {len(_ledger_lines(ledger))} lines", file=sys.stderr)
                journaled_at_kill.append((len(_ledger_lines(ledger)),
                                          set(journaled_steps(spec, ref))))
                continue
        out, err = proc.communicate(timeout=120)
        assert proc.returncode == 0, f"attempt {attempt_no} exited {proc.returncode}: {err}"
        final = json.loads(out)
        break
    assert final == chaos.expected(segments)

    # No journaled step started again after the kill that found it journaled.
    lines = _ledger_lines(ledger)
    for position, journaled in journaled_at_kill:
        restarted = {ln.split()[1] for ln in lines[position:] if ln.startswith("start ")}
        assert not (restarted & journaled), (restarted & journaled, segments, kills)
    # Every step journaled exactly once, each with its one result.
    names = chaos.step_names(segments)
    assert sorted(journaled_steps(spec, ref)) == sorted(names)
    # Counters carried over: exactly one charge per journaled step.
    info = spec.open().read_run(run=ref)
    assert info.totals.steps == len(names)
    assert info.totals.usd == Decimal("0.01") * len(names)
    assert info.totals.tokens == 10 * len(names)
    # Each step ran at least once and at most once per attempt that started it.
    starts = [ln.split()[1] for ln in lines if ln.startswith("start ")]
    assert set(starts) == set(names)
    assert len(starts) <= len(names) + sum(1 for _ in journaled_at_kill) * len(names)


@settings(max_examples=EXAMPLES, deadline=None, derandomize=False, database=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(segments=shapes, kills=kill_points)
def test_sigkill_at_many_points_fs(tmp_path: Path, segments: list[dict[str, Any]],
                                   kills: list[tuple[int, int]]) -> None:
    spec = StoreSpec("fs", f"file://{tmp_path / 'store'}", {}, [], {})
    run_with_kills(spec, tmp_path, segments, kills)


def test_sigkill_at_many_points_s3(s3_spec: StoreSpec, tmp_path: Path) -> None:
    rng = random.Random(int(os.environ.get("DURABLERUN_KILL_SEED", "7")))
    for _ in range(max(1, EXAMPLES // 4)):
        segments = [{"kind": "steps", "n": rng.randint(2, 5)},
                    {"kind": "gather", "n": rng.randint(2, 4)},
                    {"kind": "steps", "n": rng.randint(1, 4)}]
        kills = [(rng.randint(0, 12), rng.randint(0, 2000)) for _ in range(rng.randint(1, 3))]
        run_with_kills(s3_spec, tmp_path, segments, kills)


@pytest.mark.parametrize("segments", [[{"kind": "steps", "n": 40}]])
def test_kill_during_a_long_run_with_snapshots(tmp_path: Path,
                                               segments: list[dict[str, Any]]) -> None:
    """Kills land before, during and after snapshot writes (every 100 records by default;
    the chaos run writes ~40), and the resume still replays exactly."""
    spec = StoreSpec("fs", f"file://{tmp_path / 'store'}", {}, [], {})
    run_with_kills(spec, tmp_path, segments, [(10, 0), (25, 300), (40, 900), (60, 50)])
