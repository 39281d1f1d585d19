"""The invariant checks themselves fail on the damage they exist to find (no test that cannot fail)."""

from __future__ import annotations

import hashlib
import json
from typing import Any

import pytest

from durablerun import api
from tests.faults import generated, torture
from tests.faults.helpers import fenced_by_the_fencing
from tests.helpers.journal_checks import Journal, check_journal, check_kept, journal_object, unseal
from tests.helpers.torture_runs import Ledger, check_executions


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


def test_a_snapshot_tiles_its_own_generation() -> None:
    j = journal({}, {"kind": "continue"}, {"pos": "g1.0"}, {"pos": "end", "kind": "complete"})
    j.etags["chunks/c"] = '"c"'
    j.pointer = {"seq": 2, "base": 1, "chunks": [{"key": "chunks/c", "first": 1, "last": 2}]}
    check_journal(j)
    j.pointer["base"] = 0
    with pytest.raises(AssertionError, match="last continuation"):
        check_journal(j)
    j.pointer = {"seq": 2, "base": 1, "chunks": [{"key": "chunks/c", "first": 2, "last": 2}]}
    with pytest.raises(AssertionError, match=r"do not tile 1\.\.seq"):
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


def test_a_paused_runners_step_in_flight_may_land_after_the_next_attempts_and_nothing_else_may() -> None:
    # Trial p11-3 of 2026-11-26: p-a1 froze past its lease check, p-a2 ran the step and the run; p-a1 woke.
    ledger = Ledger([("start", "s0", "p-a2"), ("start", "s0", "p-a1")])
    with pytest.raises(AssertionError, match="ran again after"):
        check_executions(ledger, ["s0"], interrupted={"p-a1"})
    check_executions(ledger, ["s0"], interrupted={"p-a1"}, in_flight={("s0", "p-a1")})
    # Begun after the wake-up (not in flight at the freeze): still a step run again after it completed.
    with pytest.raises(AssertionError, match="ran again after"):
        check_executions(ledger, ["s0"], interrupted={"p-a1"}, in_flight={("s1", "p-a1")})
    # In flight in one pod does not excuse a third execution by a pod nobody interrupted.
    three = Ledger([("start", "s0", "p-a2"), ("start", "s0", "p-a3"), ("start", "s0", "p-a1")])
    with pytest.raises(AssertionError, match="nobody interrupted"):
        check_executions(three, ["s0"], interrupted={"p-a1"}, in_flight={("s0", "p-a1")})


def test_the_oracle_check_fails_on_every_execution_the_design_does_not_permit() -> None:
    program = [{"op": "step", "name": "s1", "fails": 1, "retries": 2},
               {"op": "saga", "steps": [{"op": "step", "name": "s2", "fails": 0, "retries": 0}], "fail": "s3"}]
    assert generated.expected_steps(program) == {"s1": 2, "s2": 1, "s3": 1, "compensate:undo-s2": 1}
    assert generated.expected_result(program) == {"out": [generated.step_result("s1"), {"undone": "s3"}]}
    good = ["call s1 p1", "call s1 p2", "call s1 p2", "call s2 p2", "call s3 p2", "call compensate:undo-s2 p2"]
    attempts = [generated.Attempt("p1", killed=True), generated.Attempt("p2", killed=False, journaled={"s1"})]
    assert generated.check_ledger(program, good, attempts) == []
    bad = {
        "never executed": good[:-1],
        "no such step": [*good, "call s9 p2"],
        "oracle says 2": good[:2] + good[3:],
        "at most 2": ["call s1 p1"] * 3 + good[1:],
        "several processes nobody killed": [*good, "call s2 p3"],
    }
    for what, lines in bad.items():
        assert any(what in p for p in generated.check_ledger(program, lines, attempts)), what
    # A step journaled when its attempt was killed must not run again.
    journaled = [generated.Attempt("p1", killed=True, journaled={"s1"}), attempts[1]]
    assert any("executed again" in p for p in generated.check_ledger(program, good, journaled))


def test_generated_programs_are_the_same_for_a_seed_and_use_every_operation() -> None:
    assert generated.generate(7) == generated.generate(7)
    assert generated.generate(7) != generated.generate(8)
    ops: set[str] = set()
    for seed in range(200):
        program = generated.generate(seed, with_children=True)
        assert "null" not in json.dumps(program), program  # kubectl apply would drop it from spec.input
        ops |= {op["op"] for op in program}
        ops |= {o["op"] for op in program if op["op"] == "gather" for b in op["branches"] for o in b}
    assert ops == {"step", "gather", "sleep", "wait", "saga", "continue", "child"}


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


@pytest.mark.parametrize(("fault", "ending", "counted"), [
    (torture.OOM, {"exitCode": 137, "reason": "OOMKilled"}, True),
    (torture.OOM, {"exitCode": 0, "message": '{"outcome": "Completed"}'}, False),  # it ended before the kill
    (torture.POD_DELETION, {"exitCode": 4, "message": '{"outcome": "Suspended"}'}, True),
    (torture.EVICTION, {"exitCode": 5, "message": '{"outcome": "Fenced"}'}, True),
    (torture.EVICTION, {"exitCode": 143, "message": None}, True),  # SIGTERM before its handler was set
    (torture.POD_DELETION, {"exitCode": 0, "message": '{"outcome": "Completed"}'}, False),  # finished first
    (torture.POD_DELETION, {"exitCode": 4, "message": '{"outcome": "Waiting"}'}, False),  # stopped to wait first
    (torture.POD_DELETION, None, False),
])
def test_a_faulted_attempt_is_counted_only_when_the_fault_ended_it(
        fault: torture.Fault, ending: dict[str, Any] | None, counted: bool) -> None:
    assert torture.ended_by_fault(ending, fault) is counted


def test_a_group_object_is_read_record_by_record_and_a_bad_header_is_caught() -> None:
    """Group commit stores records written together as one object; the independent reader takes it apart."""
    records = [seal(json.dumps({"seq": seq}).encode()) for seq in (4, 5, 6)]
    group = b'{"group":4,"count":3}\n' + b"\n".join(records)
    assert journal_object(group, 4, "journal/000000000004.json") == records
    assert journal_object(records[0], 4, "journal/000000000004.json") == [records[0]]
    with pytest.raises(AssertionError, match="group header"):
        journal_object(group, 5, "journal/000000000005.json")
    with pytest.raises(AssertionError, match="group header"):
        journal_object(group.rsplit(b"\n", 1)[0], 4, "journal/000000000004.json")


class _Record:
    """The lease timeline's and the pod recorder's answers for one pod (check_lapses reads only these)."""

    def __init__(self, renewed: str | None, started: str | None) -> None:
        self.renewed, self.start = renewed, started

    def last_renewal(self, pod: str) -> Any:
        return api.parse_time(self.renewed)

    def started(self, pod: str) -> Any:
        return api.parse_time(self.start)


def lapse(renewed: str | None, started: str | None = "2026-01-01T00:00:00Z") -> None:
    """The operator expired pod run-a1's lease (20 s + the skew margin) in an Event the API server stored at
    00:01:00."""
    body = {"metadata": {"namespace": "ns", "name": "run", "uid": "u"},
            "spec": {"workflow": "m:f", "checkpoint": {"uri": "s3://b/runs"}, "policy": {"leaseDuration": "20s"}}}
    told = [{"reason": "LeaseExpired", "message": "pod run-a1 has not renewed its lease for 22s",
             "metadata": {"creationTimestamp": "2026-01-01T00:01:00Z"}}]
    record = _Record(renewed, started)
    torture.check_lapses(body, {"run-a1"}, told, record, record)  # type: ignore[arg-type]


def test_a_lapse_counts_only_when_the_runners_own_record_shows_it() -> None:
    lapse("2026-01-01T00:00:30Z")  # last renewed 30 s before: past 20 s + the margin
    lapse(None, "2026-01-01T00:00:30Z")  # never renewed, started 30 s before
    with pytest.raises(AssertionError, match=r"last renewed it at .* within the lease's validity"):
        lapse("2026-01-01T00:00:50Z")  # renewed 10 s before the operator said it had lapsed
    with pytest.raises(AssertionError, match=r"started at .* never renewed it"):
        lapse(None, "2026-01-01T00:00:55Z")
    with pytest.raises(AssertionError, match="neither renewed nor started"):
        lapse(None, None)
