"""The journal reader, fuzzed: whatever bytes a store holds at a run's keys, reading the run either gives
well-formed records or a CorruptionError naming the object. Never another exception (a KeyError or a
TypeError would crash an attempt with a traceback instead of the error that says which object is bad), and
never a record with nonsense in it (a NaN cost, negative tokens) accepted as if it were fine.

Bounded in `make test` (FUZZ_EXAMPLES, 150 by default); `make faults` runs thousands.
"""

from __future__ import annotations

import json
import math
import re
import uuid
from decimal import Decimal
from pathlib import Path
from typing import Any

from hypothesis import given
from hypothesis import strategies as st

from durablerun import errors
from durablerun._private.records import codec, layout
from durablerun._private.records.model import Record
from durablerun._private.storage.backends.memory import MemoryBackend
from durablerun._private.storage.journal import RunStore
from tests.helpers.fuzz import fuzz

FUZZ = fuzz()

#: Every record kind as layout v1 writes it (tests/sdk/golden/v1-records.txt, volatile values filled in).
SEEDS: list[dict[str, Any]] = [
    json.loads(re.sub(r'"(at|dur)":"\*"', r'"\1":0.5', line).replace('"*"', '"0"'))
    for line in (Path(__file__).parent / "golden" / "v1-records.txt").read_text().splitlines() if line.strip()
]

json_values = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**70), 2**70) | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=20),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4),
    max_leaves=12,
)
#: Strings that parse as numbers, or almost do: what a hand-edited or hostile record holds.
number_like = st.sampled_from(["NaN", "-NaN", "Infinity", "-1", "1e999999", "0x10", "", " 1", "1_000", "١٢"])


@st.composite
def mutated_records(draw: st.DrawFn) -> dict[str, Any]:
    """A real record with a few of its fields (or its cost's and totals' fields) dropped or replaced."""
    record = json.loads(json.dumps(draw(st.sampled_from(SEEDS))))
    for _ in range(draw(st.integers(1, 3))):
        target = record
        if draw(st.booleans()):
            nested = draw(st.sampled_from(["totals", "cost", "error", "ref"]))
            target = record.get(nested) if isinstance(record.get(nested), dict) else record
        key = draw(st.sampled_from([*sorted(target), "seq", "kind", "pos", "usd", "tokens", "steps"]))
        action = draw(st.sampled_from(["drop", "json", "number"]))
        if action == "drop":
            target.pop(key, None)
        else:
            target[key] = draw(json_values if action == "json" else number_like)
    return record


def _journal_store(*objects: bytes) -> tuple[RunStore, MemoryBackend]:
    backend = MemoryBackend(f"fuzz-{uuid.uuid4().hex}")
    store = RunStore(backend, layout.RunRef.local("fuzzed"))
    backend.raw_journal(store.root).extend(objects)
    return store, backend


def _read(store: RunStore) -> list[Record] | None:
    """The records read back, or None when the reader refused the journal as it should: CorruptionError."""
    try:
        return store.load().records
    except errors.CorruptionError as e:
        refusal = str(e)
    assert "fuzzed" in refusal, f"the error does not name the object: {refusal}"
    return None


def _well_formed(record: Record) -> None:
    for total in (record.totals, *([record.cost] if record.cost else [])):
        assert total.usd.is_finite(), record
        assert total.usd >= 0, record
        assert isinstance(total.tokens, int), record
        assert total.tokens >= 0, record
    assert record.totals.steps >= 0, record
    assert math.isfinite(record.at), record


def test_the_seeds_are_read_as_written() -> None:
    # Every golden record alone at seq 0, renumbered: the fuzzing starts from records the reader accepts.
    for seed in SEEDS:
        store, _ = _journal_store(codec.seal(codec.dumps({**seed, "seq": 0})))
        records = _read(store)
        assert records is not None, seed
        assert records[0].kind == seed["kind"], seed


@FUZZ
@given(record=mutated_records())
def test_a_malformed_record_is_refused_by_name_or_read_well_formed(record: dict[str, Any]) -> None:
    record["seq"] = record.get("seq", 0) if not isinstance(record.get("seq"), int) else 0
    store, _ = _journal_store(codec.seal(codec.dumps(record)))
    for r in _read(store) or []:
        _well_formed(r)


@FUZZ
@given(data=st.binary(max_size=300), flip=st.integers(0, 10_000))
def test_damaged_bytes_are_refused_by_name(data: bytes, flip: int) -> None:
    sealed = bytearray(codec.seal(codec.dumps({**SEEDS[0], "seq": 0})))
    sealed[flip % len(sealed)] ^= 0xFF
    for raw in (bytes(sealed), data, codec.seal(data)):
        store, _ = _journal_store(raw)
        for r in _read(store) or []:
            _well_formed(r)


@FUZZ
@given(pointer=st.dictionaries(st.sampled_from(["seq", "base", "chunks", "at"]), json_values, max_size=4)
       | json_values)
def test_a_malformed_snapshot_pointer_is_refused_by_name(pointer: Any) -> None:
    store, backend = _journal_store(codec.seal(codec.dumps({**SEEDS[0], "seq": 0})))
    backend.put(store.key(layout.SNAPSHOT), codec.seal(codec.dumps(pointer)))
    for r in _read(store) or []:
        _well_formed(r)


def test_nan_and_negative_costs_are_not_accepted() -> None:
    for field, value in (("usd", "NaN"), ("usd", "-1"), ("tokens", -5), ("usd", "Infinity")):
        record = {**SEEDS[2], "seq": 0, "cost": {**SEEDS[2]["cost"], field: value}}
        store, _ = _journal_store(codec.seal(codec.dumps(record)))
        assert _read(store) is None, (field, value)
    assert Decimal("0.25") == Decimal(SEEDS[2]["cost"]["usd"])  # the seed itself is fine
