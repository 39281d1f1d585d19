"""Kill-and-resume with real processes: SIGKILL at many points, re-run until done.

Invariants after every example:
* a step journaled before a kill never starts again in a later attempt;
* so a step runs again only if it was in flight when its attempt was killed;
* every step is journaled exactly once, and the final result equals an
  uncrashed run's;
* cost and step counters carry over (they equal the uncrashed run's);
* with ``continue`` segments (ctx.continue_as_new) all of the above holds
  across generations, also for kills right before and right after a
  continuation is journaled.

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

from durablerun._private.records.model import ContinueRecord
from durablerun.stores import RunRef
from tests.helpers.local_runs import StoreSpec, wait_until

from .helpers import sub_env
from .workflows import chaos

#: Random kill plans per test: 8 in `make test`, 60 in `make faults`.
EXAMPLES = int(os.environ.get("DURABLERUN_KILL_EXAMPLES", "8"))

segment = st.one_of(
    st.builds(lambda n: {"kind": "steps", "n": n}, st.integers(1, 6)),
    st.builds(lambda n: {"kind": "gather", "n": n}, st.integers(2, 5)),
    st.just({"kind": "sleep"}),
    st.just({"kind": "uuid"}),
    st.just({"kind": "continue"}),
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


def journal(spec: StoreSpec, ref: RunRef) -> list[Any]:
    """Every journal record, of every generation."""
    rs = spec.open().run_store(ref)
    try:
        return rs.read_all()
    finally:
        rs.close()


def journaled_steps(spec: StoreSpec, ref: RunRef) -> list[str]:
    return [r.name for r in journal(spec, ref) if r.kind == "step"]


def die_points(segments: list[dict[str, Any]], flags: list[str | None]) -> list[str]:
    """Self-kills right before / right after the continuations the flags pick."""
    conts = [i for i, s in enumerate(segments) if s["kind"] == "continue"]
    return [f"{flag}-continue-{i}" for i, flag in zip(conts, flags, strict=False) if flag]


def _check_self_kill(spec: StoreSpec, ref: RunRef, segments: list[dict[str, Any]],
                     point: str) -> None:
    """A self-kill landed where it says: right after its continuation was journaled (the
    journal ends with it), or right before (the continuations before it, and no more)."""
    when, _, index = point.split("-")
    before = sum(1 for s in segments[: int(index)] if s["kind"] == "continue")
    records = journal(spec, ref)
    conts = [r for r in records if r.kind == "continue"]
    if when == "after":
        assert records[-1].kind == "continue", (point, records[-1])
        assert len(conts) == before + 1, point
    else:
        assert len(conts) == before, point


def run_with_kills(spec: StoreSpec, tmp: Path, segments: list[dict[str, Any]],
                   kills: list[tuple[int, int]], die: list[str] | None = None) -> None:
    run_id = "k" + uuid.uuid4().hex[:10]
    ref = RunRef.local(run_id)
    ledger = tmp / f"{run_id}.ledger"
    input_json = json.dumps({"ledger": str(ledger), "segments": segments, "die": die or []})
    plan = list(kills)
    journaled_at_kill: list[tuple[int, set[str]]] = []
    final = None
    for attempt_no in range(len(plan) + len(die or []) + 3):
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
        died = [ln.split()[1] for ln in _ledger_lines(ledger)[base:] if ln.startswith("die ")]
        if proc.returncode == -signal.SIGKILL and died:
            _check_self_kill(spec, ref, segments, died[-1])
            journaled_at_kill.append((len(_ledger_lines(ledger)), set(journaled_steps(spec, ref))))
            continue
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
    # Every planned self-kill happened (each once), and each generation started once.
    assert sorted(ln.split()[1] for ln in lines if ln.startswith("die ")) == sorted(die or [])
    records = journal(spec, ref)
    assert [r.gen for r in records if isinstance(r, ContinueRecord)] == list(
        range(1, 1 + sum(1 for s in segments if s["kind"] == "continue")))
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
@given(segments=shapes, kills=kill_points,
       flags=st.lists(st.sampled_from(["before", "after", None]), min_size=5, max_size=5))
def test_sigkill_at_many_points_fs(tmp_path: Path, segments: list[dict[str, Any]],
                                   kills: list[tuple[int, int]], flags: list[str | None]) -> None:
    spec = StoreSpec("fs", f"file://{tmp_path / 'store'}", {}, [], {})
    run_with_kills(spec, tmp_path, segments, kills, die_points(segments, flags))


CONTINUING = [{"kind": "steps", "n": 3}, {"kind": "continue"}, {"kind": "gather", "n": 3},
              {"kind": "uuid"}, {"kind": "continue"}, {"kind": "steps", "n": 4},
              {"kind": "continue"}, {"kind": "steps", "n": 2}]


def test_sigkill_right_before_and_after_each_continuation(durable_store_spec: StoreSpec,
                                                          tmp_path: Path) -> None:
    """Kills right at the continuations (random ones land in every generation above)."""
    die = ["before-continue-1", "after-continue-1", "after-continue-4", "before-continue-6",
           "after-continue-6"]
    run_with_kills(durable_store_spec, tmp_path, CONTINUING, [(9, 500)], die)


def test_sigkill_at_many_points_s3(s3_spec: StoreSpec, tmp_path: Path) -> None:
    rng = random.Random(int(os.environ.get("DURABLERUN_KILL_SEED", "7")))
    for _ in range(max(1, EXAMPLES // 4)):
        segments = [{"kind": "steps", "n": rng.randint(2, 5)},
                    {"kind": "gather", "n": rng.randint(2, 4)},
                    {"kind": "continue"},
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
