"""A crash during every write: the runner SIGKILLed at each point of a step's journal append, then resumed.

The storage layer's fault hook (``backends.base.CRASH_ENV``, docs/faults.md) kills the runner the n-th time
a journal append reaches a point: before the record is written, after it is written but before it is durable
(the filesystem's ``fdatasync``; S3's PUT answered, the answer not acted on), and after the append is durable,
before the step's result is handed back. Against the filesystem and S3 (real MinIO) stores, every point in
turn; a second runner resumes the run. What must hold, exactly (a SIGKILL ends the process, not the machine,
so a written record survives it whether or not it was synced):

* killed before the write, the step's record was never stored: the step runs again, twice in all;
* killed after the write, the record is there: the step never runs again, once in all;
* never lost: every step journaled exactly once, the result and totals equal an uncrashed run's.

On S3 the steps of a gather that finish while a write is in flight are committed together, in one object
(group commit); the same three points of that group write are killed in turn: before it, no record of the
group is stored and each of its steps runs again; after it, all are, and none does.
"""

from __future__ import annotations

import json
import signal
import uuid
from decimal import Decimal
from pathlib import Path

import pytest

from durablerun._private.records import layout
from durablerun._private.storage.backends.base import CRASH_ENV, CRASH_POINTS, GROUP_CRASH_POINTS
from durablerun.stores import RunRef
from tests.helpers.local_runs import StoreSpec

from .helpers import cli
from .workflows import chaos

#: Two steps in sequence, then a gather: the crash hits the second step's record (nth 2), whose step is
#: known, with a journaled step before it and steps of both kinds after it.
SEGMENTS = [{"kind": "steps", "n": 2}, {"kind": "gather", "n": 3}]
NTH = 2
CRASHED_STEP = "s0-1"


def _run(spec: StoreSpec, run_id: str, ledger: Path, env: dict[str, str],
         segments: list[dict[str, object]] = SEGMENTS) -> tuple[int, str, str]:
    done = cli(["run", "chaos:shape", "--run-id", run_id, "--store", spec.uri, *spec.cli_args,
                "--input", json.dumps({"ledger": str(ledger), "segments": segments}), "--quiet",
                "--retry-initial", "1ms"], env={**spec.env, **env}, timeout=120)
    return done.returncode, done.stdout, done.stderr


def _journaled_steps(spec: StoreSpec, ref: RunRef) -> list[str]:
    rs = spec.open().run_store(ref)
    try:
        return [r.name for r in rs.read_all() if r.kind == "step"]
    finally:
        rs.close()


@pytest.mark.parametrize("point", CRASH_POINTS)
def test_a_crash_at_each_point_of_a_journal_write(durable_store_spec: StoreSpec, tmp_path: Path,
                                                  point: str) -> None:
    spec = durable_store_spec
    run_id = "w" + uuid.uuid4().hex[:10]
    ref = RunRef.local(run_id)
    ledger = tmp_path / f"{run_id}.ledger"

    code, _, err = _run(spec, run_id, ledger, {CRASH_ENV: f"{point}:{NTH}"})
    assert code == -signal.SIGKILL, f"the hook did not kill the runner at {point}: exit {code}\n{err[-2000:]}"
    stored = _journaled_steps(spec, ref)
    written = point != "before-write"
    assert stored == (["s0-0", CRASHED_STEP] if written else ["s0-0"]), (point, stored)

    code, out, err = _run(spec, run_id, ledger, {})
    assert code == 0, f"the resumed runner exited {code}\n{err[-2000:]}"
    assert json.loads(out) == chaos.expected(SEGMENTS)

    starts = [line.split()[1] for line in ledger.read_text().splitlines() if line.startswith("start ")]
    names = chaos.step_names(SEGMENTS)
    expected = {name: 1 for name in names}
    expected[CRASHED_STEP] = 1 if written else 2
    assert {name: starts.count(name) for name in names} == expected, (point, starts)
    assert sorted(_journaled_steps(spec, ref)) == sorted(names)
    totals = spec.open().read_run(run=ref).totals
    assert (totals.steps, totals.usd, totals.tokens) == (len(names), Decimal("0.01") * len(names), 10 * len(names))


#: One step, then a gather of steps finishing within a few ms of each other: the first write of the gather is
#: in flight while the others finish, so they go out together.
GROUP_SEGMENTS: list[dict[str, object]] = [{"kind": "steps", "n": 1}, {"kind": "gather", "n": 12}]


def _groups(spec: StoreSpec, ref: RunRef) -> list[list[int]]:
    """The positions each journal object of more than one record holds."""
    backend = spec.open().backend
    root = f"{ref.path}/"
    out = []
    for key in backend.list_keys(root + layout.JOURNAL_DIR):
        seq = layout.seq_of_journal_key(key[len(root):])
        body = backend.get(key)
        assert seq is not None
        assert body is not None
        held = layout.unpack_journal_object(seq, body, key=key)
        if len(held) > 1:
            out.append([s for s, _ in held])
    return out


@pytest.mark.parametrize("point", GROUP_CRASH_POINTS)
def test_a_crash_at_each_point_of_a_group_write(s3_spec: StoreSpec, tmp_path: Path, point: str) -> None:
    spec = s3_spec
    run_id = "g" + uuid.uuid4().hex[:10]
    ref = RunRef.local(run_id)
    ledger = tmp_path / f"{run_id}.ledger"

    code, _, err = _run(spec, run_id, ledger, {CRASH_ENV: f"{point}:1"}, GROUP_SEGMENTS)
    assert code == -signal.SIGKILL, f"no group write reached {point}: exit {code}\n{err[-2000:]}"
    stored = set(_journaled_steps(spec, ref))
    groups = _groups(spec, ref)
    if point == "group-before-write":
        assert groups == [], groups
    else:
        assert len(groups) == 1, groups
        assert len(groups[0]) > 1, groups
        assert len(stored) >= len(groups[0]) + 1, (stored, groups)  # the step before and the whole group

    code, out, err = _run(spec, run_id, ledger, {}, GROUP_SEGMENTS)
    assert code == 0, f"the resumed runner exited {code}\n{err[-2000:]}"
    assert json.loads(out) == chaos.expected(GROUP_SEGMENTS)
    starts = [line.split()[1] for line in ledger.read_text().splitlines() if line.startswith("start ")]
    names = chaos.step_names(GROUP_SEGMENTS)
    counts = {name: starts.count(name) for name in names}
    # Journaled before the kill: never again. The rest ran again if they had started (a gather's steps all
    # start together, so at least the killed group's steps, which had finished, ran twice).
    assert all(counts[n] == 1 for n in stored), (point, stored, counts)
    assert all(counts[n] in (1, 2) for n in names), (point, counts)
    if point == "group-before-write":
        assert sum(counts[n] == 2 for n in names) >= 2, counts
    assert sorted(_journaled_steps(spec, ref)) == sorted(names)
    totals = spec.open().read_run(run=ref).totals
    assert (totals.steps, totals.usd, totals.tokens) == (len(names), Decimal("0.01") * len(names), 10 * len(names))


def test_the_hook_refuses_a_point_it_does_not_know(tmp_path: Path) -> None:
    code, _, err = _run(StoreSpec("fs", f"file://{tmp_path / 'store'}", {}, [], {}), "bad", tmp_path / "ledger",
                        {CRASH_ENV: "during-write:1"})
    assert code != 0
    assert CRASH_ENV in err
    assert "before-write" in err
