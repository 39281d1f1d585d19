"""One contract, three stores: memory, filesystem and S3 on a real MinIO.

Every test here runs unchanged against each store (the ``store_spec`` fixture).
"""

from __future__ import annotations

import threading
from decimal import Decimal

import pytest

from durablerun import errors
from durablerun._private.records import codec, layout
from durablerun._private.records.model import Record, StepRecord, Totals
from durablerun._private.storage.journal import RunStore
from durablerun.stores import RunRef, Store
from tests.helpers.local_runs import StoreSpec

from .helpers import corrupt_journal_record, raw_journal_bytes

REF = RunRef.kubernetes("team-a", "research", "3f2a9c1e-0000-4000-8000-000000000001")


@pytest.fixture
def store(store_spec: StoreSpec) -> Store:
    s = store_spec.open()
    s.check()
    return s


def _record(seq: int, name: str = "s", *, usd: str = "0") -> Record:
    return StepRecord(seq=seq, pos=str(seq), name=name, value={"n": seq}, w="test",
                      totals=Totals(Decimal(usd), seq, seq + 1))


# --- object primitives ----------------------------------------------------------------


def test_create_is_first_write_wins(store: Store) -> None:
    key = REF.path + "/events/go.json"
    assert store.backend.create(key, b"first") is True
    assert store.backend.create(key, b"second") is False
    assert store.backend.get(key) == b"first"
    # Identical bytes count as success: a retried request whose first try landed.
    assert store.backend.create(key, b"first") is True


def test_cas_replaces_only_the_expected_version(store: Store) -> None:
    key = REF.path + "/snapshot.json"
    assert store.backend.cas(key, b"v1", etag="not-there") is None
    e1 = store.backend.cas(key, b"v1", etag=None)
    assert e1 is not None
    assert store.backend.cas(key, b"v2", etag=None) is None  # exists now
    e2 = store.backend.cas(key, b"v2", etag=e1)
    assert e2 is not None
    assert e2 != e1
    assert store.backend.cas(key, b"v3", etag=e1) is None  # stale etag
    got = store.backend.get_versioned(key)
    assert got is not None
    assert got == (b"v2", e2)


def test_get_missing_is_none(store: Store) -> None:
    assert store.backend.get(REF.path + "/nope.json") is None
    assert store.backend.get_versioned(REF.path + "/nope.json") is None


# --- journal ---------------------------------------------------------------------------------


def test_journal_positions_are_written_once(store: Store) -> None:
    rs = store.run_store(REF)
    for seq in range(3):
        rs.append(_record(seq))
    assert [r.seq for r in rs.load().records] == [0, 1, 2]
    other = store.run_store(REF)  # a second writer that read the journal earlier
    other_view = other.load(for_writing=True)
    assert other_view.next_seq == 3
    rs.append(_record(3, "mine"))
    with pytest.raises(errors.FencedError):
        other.append(_record(3, "theirs"))
    loaded = store.run_store(REF).load()
    assert [r.name for r in loaded.records] == ["s", "s", "s", "mine"]
    rs.close()
    other.close()


def test_a_journal_page_reads_its_range_and_the_count_is_its_length(
    store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    """What the run browser pages a long journal with: a range of positions, and how many there are."""
    monkeypatch.setattr(layout, "SEGMENT_RECORDS", 8)  # the filesystem's pages cross segments' ends
    rs = store.run_store(REF)
    assert rs.count() == 0
    assert rs.read_range(0, 10) == []
    length = 37
    for seq in range(length):
        rs.append(_record(seq, f"s{seq}"))
    assert rs.count() == length
    for first, end in ((0, 3), (5, 6), (6, 18), (7, 9), (8, 16), (33, 37), (35, 90), (36, 37)):
        page = rs.read_range(first, end)
        assert [r.name for r in page] == [f"s{seq}" for seq in range(first, min(end, length))], (first, end)
    assert rs.read_range(length, length + 10) == []
    assert rs.read_range(4, 4) == []
    rs.close()


def test_truncate_drops_a_journal_tail_and_frees_its_positions(store: Store) -> None:
    """What `durablerun rerun` does to a journal: records from a position on are gone, those before are
    kept byte for byte, and the next writer appends at the cut."""
    rs = store.run_store(REF)
    for seq in range(5):
        rs.append(_record(seq))
    kept = rs.journal().read(0)[:2]
    assert rs.journal().truncate(2) == 3
    rs.close()
    again = store.run_store(REF)
    assert again.journal().read(0) == kept
    assert again.load(for_writing=True).next_seq == 2
    again.append(_record(2, "rerun"))
    assert [r.name for r in store.run_store(REF).load().records] == ["s", "s", "rerun"]
    assert again.journal().truncate(3) == 0
    again.close()


def test_a_group_of_records_reads_from_every_position_and_truncates_inside(store: Store) -> None:
    """Group commit: records written together (one object on S3) read like records written one by one, from
    any position (a snapshot may end inside a group); the position a group starts at is taken once; a rerun
    cut inside a group keeps the records before the cut."""
    rs = store.run_store(REF)
    rs.append(_record(0))
    group = [_record(seq, f"g{seq}") for seq in range(1, 6)]
    rs.append_group(group)
    everything = rs.journal().read(0)
    assert [seq for seq, _ in everything] == list(range(6))
    for start in range(7):
        assert rs.journal().read(start) == everything[start:], start
    # The run browser's pages and count, across and inside the group (a fresh reader knows no group yet).
    pages = store.run_store(REF).journal()
    for first, end in ((0, 1), (0, 6), (2, 4), (3, 9), (5, 6), (6, 8)):
        assert pages.read_range(first, end) == everything[first:end], (first, end)
    for at_least in range(7):
        assert store.run_store(REF).journal().count(at_least) == 6, at_least
    with pytest.raises(errors.FencedError):
        store.run_store(REF).append_group([_record(1, "late"), _record(2, "late")])
    if rs.journal().groups:  # one object holds them all
        assert len(store.backend.list_keys(f"{REF.path}/{layout.JOURNAL_DIR}")) == 2
    assert rs.journal().truncate(3) == 3
    rs.close()
    again = store.run_store(REF)
    assert again.journal().read(0) == everything[:3]
    assert again.load(for_writing=True).next_seq == 3
    again.append_group([_record(3, "rerun"), _record(4, "rerun")])
    assert [r.name for r in store.run_store(REF).load().records] == ["s", "g1", "g2", "rerun", "rerun"]
    again.close()


def test_two_writers_racing_each_position_exactly_one_wins(store: Store) -> None:
    """Two writers race for the same positions: each position has one winner, whose
    record is what is stored; the loser learns it is fenced."""
    winners: dict[int, list[str]] = {}
    lock = threading.Lock()
    barrier = threading.Barrier(2)

    def writer(name: str) -> None:
        rs = store.run_store(REF)
        rs.load(for_writing=True)
        for seq in range(12):
            barrier.wait(timeout=10)
            try:
                rs.append(_record(seq, name))
                with lock:
                    winners.setdefault(seq, []).append(name)
            except errors.FencedError:
                # The loser of a position re-reads (as a new attempt would) and goes on.
                rs.close()
                rs = store.run_store(REF)
                rs.load(for_writing=True)
        rs.close()

    threads = [threading.Thread(target=writer, args=(n,)) for n in ("a", "b")]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    assert sorted(winners) == list(range(12))
    assert all(len(v) == 1 for v in winners.values()), winners
    stored = store.run_store(REF).load().records
    assert [r.name for r in stored] == [winners[i][0] for i in range(12)]


def test_corrupt_record_is_a_loud_error_and_nothing_is_overwritten(store: Store) -> None:
    rs = store.run_store(REF)
    for seq in range(4):
        rs.append(_record(seq))
    rs.close()
    corrupt_journal_record(store, REF, 1)
    before = raw_journal_bytes_tolerant(store)
    with pytest.raises(errors.CorruptionError) as e:
        store.run_store(REF).load(for_writing=True)
    assert "checksum" in str(e.value)
    assert raw_journal_bytes_tolerant(store) == before


def raw_journal_bytes_tolerant(store: Store) -> list[bytes]:
    try:
        return raw_journal_bytes(store, REF)
    except errors.CorruptionError:
        # The filesystem journal refuses to read past damage: compare the file itself.
        from .helpers import fs_segment

        return [fs_segment(store, REF).read_bytes()]


def test_snapshots_bound_the_objects_a_resume_reads(store: Store) -> None:
    rs = store.run_store(REF)
    loaded = rs.load(for_writing=True)
    n = 200
    for seq in range(n):
        rec = _record(seq)
        rs.append(rec)
        loaded.records.append(rec)
        if (seq + 1) % 10 == 0:
            rs.snapshot(loaded, Totals(Decimal(0), seq, seq + 1))
    rs.close()
    # Binary merging: at most log2(200/10)+1 chunks.
    assert 1 <= len(loaded.chunks) <= 5, loaded.chunks
    resumed = store.run_store(REF).load()
    assert [r.seq for r in resumed.records] == list(range(n))
    assert [r.value for r in resumed.records if isinstance(r, StepRecord)] == [{"n": i} for i in range(n)]
    assert resumed.snapshot_seq == n - 1
    assert resumed.objects_read <= 8


def test_snapshot_pointer_only_moves_forward(store: Store) -> None:
    rs = store.run_store(REF)
    ahead = rs.load(for_writing=True)
    behind = store.run_store(REF).load()
    for seq in range(6):
        rec = _record(seq)
        rs.append(rec)
        ahead.records.append(rec)
        if seq < 3:
            behind.records.append(rec)
    assert rs.snapshot(ahead, Totals()) is not None
    assert rs.snapshot(behind, Totals()) is None  # older than what is saved
    assert store.run_store(REF).load().snapshot_seq == 5
    rs.close()


def test_blobs_round_trip_and_are_checked(store: Store) -> None:
    rs = store.run_store(REF)
    body = codec.dumps({"big": "x" * 100_000})
    ref = rs.put_blob(body)
    assert rs.get_blob(ref) == body
    key = rs.key(layout.blob_key(ref["sha256"]))
    store.backend.put(key, codec.seal(codec.dumps({"big": "y"})))
    with pytest.raises(errors.CorruptionError):
        rs.get_blob(ref)


def test_events_first_write_wins(store: Store) -> None:
    assert store.put_event(run=REF, name="approval", payload={"status": "yes"}) is True
    assert store.put_event(run=REF, name="approval", payload={"status": "no"}) is False
    got = store.get_event(run=REF, name="approval")
    assert got is not None
    assert got.payload == {"status": "yes"}
    assert store.get_event(run=REF, name="other") is None


def test_concurrent_event_senders_exactly_one_wins(store: Store) -> None:
    results: list[bool] = []
    barrier = threading.Barrier(4)

    def send(i: int) -> None:
        barrier.wait(timeout=10)
        results.append(store.put_event(run=REF, name="go", payload=i))

    threads = [threading.Thread(target=send, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=30)
    assert sorted(results) == [False, False, False, True]


def test_manifest_is_created_once(store: Store) -> None:
    rs = store.run_store(REF)
    first = rs.create_manifest({"input_sha256": "a"})
    second = rs.create_manifest({"input_sha256": "b"})
    assert first == second == {"input_sha256": "a"}


def test_read_run_reports_counters_checkpoint_and_status(store: Store) -> None:
    assert store.read_run(run=REF).exists is False
    rs: RunStore = store.run_store(REF)
    rs.create_manifest({"workflow": "m:f", "input_sha256": "abc"})
    for seq in range(3):
        rs.append(_record(seq, usd=f"0.{seq}"))
    rs.write_status({"outcome": "Waiting", "waitingFor": {"event": "go"}})
    rs.close()
    info = store.read_run(run=REF)
    assert info.exists
    assert info.workflow == "m:f"
    assert info.input_hash == "abc"
    assert info.totals.usd == Decimal("0.2")
    assert info.totals.steps == 3
    assert info.journal_records == 3
    assert info.checkpoint is not None
    assert info.checkpoint.seq == 2
    assert info.status == {"outcome": "Waiting", "waitingFor": {"event": "go"}}


def test_status_written_by_an_attempt_overtaken_since_its_claim_changes_nothing(store: Store) -> None:
    # The paused runner of docs/faults.md: attempt a1 claimed the run's status.json and got past its lease check;
    # a2 took the run and claimed it since. a1's write, landing late, must change nothing.
    a1, a2, local = store.run_store(REF), store.run_store(REF), store.run_store(REF)
    a1.claim_status("a1")
    assert a1.read_status() is None, "a claim alone records no outcome"
    a1.write_status({"outcome": "Waiting", "attempt": "a1"})
    a2.claim_status("a2")
    assert a2.read_status() == {"outcome": "Waiting", "attempt": "a1", "claimedBy": "a2"}  # what it was, claimed
    assert a1.write_status({"outcome": "Completed", "attempt": "a1"}) is False
    assert local.read_status() == {"outcome": "Waiting", "attempt": "a1", "claimedBy": "a2"}
    assert a2.write_status({"outcome": "Completed", "attempt": "a2"}) is True
    assert a2.write_status({"outcome": "Completed", "attempt": "a2", "n": 2}) is True  # its own writes follow
    assert local.read_status() == {"outcome": "Completed", "attempt": "a2", "n": 2}  # it names its attempt


def test_a_claim_that_keeps_losing_to_other_writers_gives_up_with_a_store_error(store: Store) -> None:
    from durablerun._private.storage import journal

    claimer = store.run_store(REF)
    backend = claimer.backend
    real_cas = backend.cas
    losses: list[str] = []

    def overtaken(key: str, data: bytes, *, etag: str | None) -> str | None:
        # Another attempt's claim lands between this one's read and its swap, every time.
        current = backend.get_versioned(key)
        real_cas(key, codec.seal(codec.dumps({journal.CLAIM: f"other-{len(losses)}"})),
                 etag=None if current is None else current[1])
        losses.append(key)
        return real_cas(key, data, etag=etag)

    backend.cas = overtaken  # type: ignore[method-assign]
    with pytest.raises(errors.StoreError, match="could not claim the run's status"):
        claimer.claim_status("a1")
    assert len(losses) == journal.CLAIM_ROUNDS


def test_delete_run_removes_everything_of_that_run_only(store: Store) -> None:
    other = RunRef.local("neighbour")
    for ref in (REF, other):
        rs = store.run_store(ref)
        rs.create_manifest({"x": 1})
        rs.append(_record(0))
        rs.close()
        store.put_event(run=ref, name="e", payload=1)
    assert store.delete_run(run=REF) >= 3
    assert store.read_run(run=REF).exists is False
    assert store.read_run(run=other).exists is True


def test_describe_names_the_store_without_secrets(store_spec: StoreSpec, store: Store) -> None:
    d = store.describe()
    assert d["kind"] in ("memory", "filesystem", "s3")
    assert store_spec.options.get("secret_key", "\0") not in repr(d)
