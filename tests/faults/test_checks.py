"""The invariant checks themselves fail on the damage they exist to find (no test that cannot fail)."""

from __future__ import annotations

import hashlib
import json
from typing import Any

import pytest

from tests.faults.helpers import Ledger, check_executions, fenced_by_the_fencing
from tests.faults.journal import Journal, check_journal, check_kept, unseal


def seal(body: bytes) -> bytes:
    return b'{"sha256":"' + hashlib.sha256(body).hexdigest().encode() + b'","body":' + body + b"}"


def journal(*records: dict[str, Any]) -> Journal:
    j = Journal("root/")
    for seq, extra in enumerate(records):
        record = {"seq": seq, "pos": str(seq), "kind": "step", "name": f"s{seq}", "w": "a", **extra}
        j.records[seq] = record
        j.bodies[seq] = json.dumps(record).encode()
        j.etags[f"journal/{seq:012d}.json"] = f'"{seq}"'
    return j


def test_a_sound_journal_passes() -> None:
    j = journal({}, {"w": "b"}, {"w": "b", "pos": "end", "kind": "complete"})
    j.chunk_records[0] = [j.bodies[0]]
    check_journal(j)


@pytest.mark.parametrize(("damage", "message"), [
    ("gap", "not contiguous"),
    ("twice", "journaled more than once"),
    ("interleaved", "interleaved"),
    ("altered-chunk", "altered record"),
    ("incomplete", "does not end complete"),
])
def test_each_kind_of_damage_is_caught(damage: str, message: str) -> None:
    j = journal({}, {"w": "b"}, {"w": "b", "pos": "end", "kind": "complete"})
    if damage == "gap":
        del j.records[1]
    elif damage == "twice":
        j.records[1]["pos"] = "0"
    elif damage == "interleaved":
        j.records[2]["w"] = "a"
    elif damage == "altered-chunk":
        j.chunk_records[1] = [j.bodies[1].replace(b'"b"', b'"c"')]
    elif damage == "incomplete":
        j.records[2]["kind"] = "step"
    with pytest.raises(AssertionError, match=message):
        check_journal(j)


def test_lost_and_overwritten_objects_are_caught() -> None:
    before = {"journal/000000000000.json": '"1"', "snapshot.json": '"2"'}
    check_kept(before, {**before, "snapshot.json": '"3"'})  # the pointer moves on by design
    with pytest.raises(AssertionError, match="lost"):
        check_kept(before, {"snapshot.json": '"2"'})
    with pytest.raises(AssertionError, match="overwritten"):
        check_kept(before, {**before, "journal/000000000000.json": '"9"'})


def test_a_flipped_byte_fails_the_checksum() -> None:
    sealed = seal(b'{"seq":0}')
    assert unseal(sealed, "k") == b'{"seq":0}'
    with pytest.raises(AssertionError, match="checksum"):
        unseal(sealed.replace(b'"seq":0', b'"seq":1'), "k")
    with pytest.raises(AssertionError, match="truncated"):
        unseal(sealed[:-3], "k")


def test_executions_beyond_the_kills_that_caught_a_step_are_caught() -> None:
    ledger = Ledger([("start", "s0", "p-a1"), ("start", "s0", "p-a2"), ("start", "s1", "p-a2")])
    check_executions(ledger, ["s0", "s1"], interrupted={"p-a1"})
    with pytest.raises(AssertionError, match="nobody interrupted"):
        check_executions(ledger, ["s0", "s1"], interrupted=set())
    with pytest.raises(AssertionError, match="never ran"):
        check_executions(ledger, ["s0", "s1", "s2"], interrupted={"p-a1"})
    twice = Ledger([("start", "s0", "p-a1"), ("start", "s0", "p-a1")])
    with pytest.raises(AssertionError, match="twice in one pod"):
        check_executions(twice, ["s0"], interrupted={"p-a1"})
    keys = Ledger([("start", "c", "p-a1"), ("effect", "r:1:c", "p-a1"), ("start", "c", "p-a2"),
                   ("effect", "r:2:c", "p-a2")])
    with pytest.raises(AssertionError, match="different idempotency keys"):
        check_executions(keys, ["c"], interrupted={"p-a1"})


def test_only_the_fencing_s_own_endings_excuse_a_later_attempt() -> None:
    def fenced(why: str, code: int = 5) -> dict[str, Any]:
        return {"exitCode": code, "message": json.dumps({"outcome": "Fenced", "message": why})}

    j = journal({"w": "paused"}, {"w": "next"})
    refused = ("journal position already written by another writer (412 Precondition Failed) "
               "[bucket=b, key=runs/ns/r/uid/journal/{:012d}.json]")
    assert fenced_by_the_fencing(fenced(refused.format(0)), "paused", j)
    assert fenced_by_the_fencing(fenced("lease of 6s lapsed without renewal"), "paused", j)
    # Refused at a position another attempt holds, fenced by a newer epoch, or a crash: not excused.
    assert not fenced_by_the_fencing(fenced(refused.format(1)), "paused", j)
    assert not fenced_by_the_fencing(fenced(refused.format(0)), None, j)
    assert not fenced_by_the_fencing(fenced("status.epoch is no longer 2: a newer attempt owns the run"), "paused", j)
    assert not fenced_by_the_fencing(fenced("lease of 6s lapsed without renewal", code=70), "paused", j)
    assert not fenced_by_the_fencing(None, "paused", j)
