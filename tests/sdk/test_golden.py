"""The layout-v1 journal format is a promise: journals written by earlier code replay, and the
records written today are byte for byte the ones layout v1 wrote.

``tests/sdk/golden/`` was written once by the layout-v1 code (``python tests/sdk/test_golden.py``
from before typed records) and is never regenerated: a change that makes these tests fail
changes the wire format, and needs a new layout version instead.

* ``golden/v1-fs/``: a filesystem store holding run ``_local/kinds`` of
  ``workflows/golden_kinds.py`` (every record kind: step with inline value, model,
  blob reference, error and cost; value; sleep; wait; event with payload and with
  timeout; patch; continue; and, after the test sends ``finish``, complete), with
  its manifest, journal segment, snapshot pointer, chunks, blob, events and status,
  left Waiting for event ``finish``.
* ``golden/v1-records.txt``: the body of every journal record of that run once
  completed, one per line, with what differs from run to run (times, attempt ids,
  durations, uuids, event ids) replaced by ``*``.
"""

from __future__ import annotations

import math
import re
import shutil
import sys
from datetime import timedelta
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest

from durablerun._private.records.model import Payload, StepRecord, Totals
from durablerun.api import Outcome
from durablerun.engine import EngineConfig, Run
from durablerun.stores import RunRef, Store, open_store
from durablerun.testing import replay_run

GOLDEN = Path(__file__).resolve().parent / "golden"
REF = RunRef.local("kinds")
INPUT = {"topic": "t"}
FINISH = {"ok": True}
CONFIG = EngineConfig(snapshot_every=4, inline_result_max=200, code_version="golden",
                      retry_initial=timedelta(milliseconds=1), retry_max=timedelta(milliseconds=1))
EXPECTED = {"n": 2, "read": ["T-A", "T-B"], "approval": {"by": "dana"}, "found": "t-a", "big": 300,
            "failed": "NonRetryableError", "late": True, "new": True, "now": True, "uuid": 36,
            "final": FINISH}

_VOLATILE = [
    (re.compile(rb'"(w|event_id)":"[0-9a-f]+"'), rb'"\1":"*"'),
    (re.compile(rb'"(at|dur)":[0-9.e+-]+'), rb'"\1":"*"'),
    (re.compile(rb'"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(\.\d+)?Z"'), rb'"*"'),
    (re.compile(rb'"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}"'), rb'"*"'),
]


def _attempt(store: Store) -> Any:
    return Run(store=store, run=REF, workflow="golden_kinds:run", input=INPUT,
               config=CONFIG).run_attempt()


def _write_until_finish(store: Store) -> None:
    """The first attempt: everything up to the wait for ``finish``."""
    store.put_event(run=REF, name="approval", payload={"by": "dana"})
    result = _attempt(store)
    assert result.outcome == Outcome.WAITING, result
    assert result.waiting is not None
    assert result.waiting.event == "finish"


def _finish(store: Store) -> Any:
    import golden_kinds

    golden_kinds.EXECUTED.clear()
    store.put_event(run=REF, name="finish", payload=FINISH)
    return _attempt(store)


def _records(store: Store) -> bytes:
    """Every journal record's body, volatile values starred, one per line."""
    from durablerun._private.records import codec

    lines = []
    for seq, sealed in store.backend.journal(REF.path + "/").read(0):
        body = codec.unseal(sealed, what=str(seq))
        for pattern, repl in _VOLATILE:
            body = pattern.sub(repl, body)
        lines.append(body)
    return b"\n".join(lines) + b"\n"


def test_a_layout_v1_journal_replays_every_record_kind(tmp_path: Path) -> None:
    shutil.copytree(GOLDEN / "v1-fs", tmp_path / "store")
    store = open_store(f"file://{tmp_path / 'store'}")
    import golden_kinds

    result = _finish(store)
    assert result.outcome == Outcome.COMPLETED, result
    assert result.result == EXPECTED
    assert golden_kinds.EXECUTED == [], "a journaled step ran again"
    assert (result.totals.steps, str(result.totals.usd), result.totals.tokens) == (7, "0.30", 127)


def test_the_replayer_checks_todays_code_against_the_layout_v1_journal(tmp_path: Path) -> None:
    """What CI does for an upgrade: today's workflow replays the golden journal, executing and writing nothing."""
    shutil.copytree(GOLDEN / "v1-fs", tmp_path / "store")
    store = open_store(f"file://{tmp_path / 'store'}")
    import golden_kinds

    golden_kinds.EXECUTED.clear()
    before = {p: p.read_bytes() for p in (tmp_path / "store").rglob("*") if p.is_file()}
    report = replay_run(store, REF, "golden_kinds:run")
    assert report.clean, report.summary()
    assert report.end is not None
    assert report.end.startswith("the run would go on with the delivery of event 'finish'"), report.end
    assert golden_kinds.EXECUTED == [], "the replayer executed a step"
    assert {p: p.read_bytes() for p in (tmp_path / "store").rglob("*") if p.is_file()} == before
    assert _finish(store).outcome == Outcome.COMPLETED
    completed = replay_run(store, REF, "golden_kinds:run")
    assert completed.clean, completed.summary()
    assert completed.end == "the journal's workflow completed, and so does the code's"


def test_todays_code_writes_the_records_layout_v1_wrote(tmp_path: Path) -> None:
    store = open_store(f"file://{tmp_path / 'store'}")
    _write_until_finish(store)
    result = _finish(store)
    assert result.outcome == Outcome.COMPLETED, result
    assert result.result == EXPECTED
    assert _records(store) == (GOLDEN / "v1-records.txt").read_bytes()


def _write_golden() -> None:  # pragma: no cover - run by hand, once per layout version
    target = GOLDEN / "v1-fs"
    if target.exists():
        raise SystemExit(f"{target} exists: golden files are written once per layout version")
    store = open_store(f"file://{target}")
    _write_until_finish(store)
    store.close()
    scratch = GOLDEN / "scratch"
    shutil.copytree(target, scratch)
    done = open_store(f"file://{scratch}")
    assert _finish(done).result == EXPECTED
    (GOLDEN / "v1-records.txt").write_bytes(_records(done))
    done.close()
    shutil.rmtree(scratch)


if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).resolve().parent / "workflows"))
    _write_golden()


def test_a_step_record_written_out_directly_is_byte_for_byte_what_its_dict_encodes_to() -> None:
    # StepRecord.encode writes the common record (a success, its result inline) without building the
    # dict; whatever the strings, numbers and model, the bytes must be the dict's.
    names = ["work", 'q"uote\\back/slash', "\u00fcn\u00efcode \u2713", "ctl\x00\x1f\x7f\u2028\ud7ff", ""]
    floats = [0.0, 0.1, 1764134000.123456, 1e-07, 1e16, 5e-324, 123456789.0]
    for i, name in enumerate(names):
        for model in (None, "pkg.mod:Report"):
            for usd in (Decimal(0), Decimal("0.000123"), Decimal("1E+3")):
                for at in floats:
                    record = StepRecord(seq=7 + i, pos=f"3/{i}.2", name=name, ok=True, attempts=2, dur=floats[i],
                                        w="a1b2c3", at=at, totals=Totals(usd, 10**20, 3))
                    record.set_result(Payload(b'{"k":[1,"\xc3\xbc"]}', None, model))
                    assert record.encode() == record.encode_dict(), (name, model, usd, at)
    for bad in (math.nan, math.inf):
        record = StepRecord(seq=1, pos="1", name="n", ok=True, at=bad, totals=Totals())
        record.set_result(Payload(b"1", None, None))
        with pytest.raises(ValueError, match="Out of range float"):
            record.encode()
        with pytest.raises(ValueError, match="Out of range float"):
            record.encode_dict()
