"""The filesystem journal: torn tails, damage, segments, durability bookkeeping."""

from __future__ import annotations

import fcntl
import os
from dataclasses import dataclass
from pathlib import Path

import pytest

from durablerun import errors
from durablerun._private.records import codec, layout
from durablerun._private.records.model import Record, StepRecord, Totals
from durablerun.stores import RunRef, Store, open_store

from .helpers import fs_segment

REF = RunRef.local("fs")


def _rec(seq: int) -> Record:
    return StepRecord(seq=seq, pos=str(seq), name=f"s{seq}", value=seq, totals=Totals(steps=seq + 1))


@dataclass
class FsJournal:
    """REF's journal in a filesystem store of the test's own."""

    uri: str

    def open(self) -> Store:
        """A new handle on the store, as another process would open it."""
        return open_store(self.uri)

    def write(self, n: int) -> Store:
        """Journal records 0..n-1 with a writer that then closes; a handle to look at them with."""
        rs = self.open().run_store(REF)
        rs.load(for_writing=True)
        for seq in range(n):
            rs.append(_rec(seq))
        rs.close()
        return self.open()

    def segment(self, start: int = 0) -> Path:
        return fs_segment(self.open(), REF, start)

    def seqs(self) -> list[int]:
        """What a reader loads now."""
        return [r.seq for r in self.open().run_store(REF).load().records]


@pytest.fixture
def fs(tmp_path: Path) -> FsJournal:
    return FsJournal(f"file://{tmp_path}")


@pytest.mark.parametrize("cut", [1, 10, 40, -1])
def test_a_torn_tail_is_discarded_and_the_position_rewritten(fs: FsJournal, cut: int) -> None:
    store = fs.write(3)
    seg = fs.segment()
    data = seg.read_bytes()
    # Simulate a crash in the middle of appending record 3.
    partial = codec.seal(_rec(3).raw()) + b"\n"
    # cut -1: the newline landed but a page in between did not (still zeros): incomplete.
    torn = partial[:cut] if cut > 0 else partial[:20] + bytes(len(partial) - 30) + partial[-10:]
    seg.write_bytes(data + torn)
    assert fs.seqs() == [0, 1, 2]  # readers stop
    rs = store.run_store(REF)
    loaded = rs.load(for_writing=True)
    assert loaded.next_seq == 3
    assert seg.read_bytes() == data  # the writer cut the torn tail off
    rs.append(_rec(3))
    rs.close()
    assert fs.seqs() == [0, 1, 2, 3]


def test_damage_before_the_tail_is_a_loud_error_and_nothing_is_truncated(fs: FsJournal) -> None:
    store = fs.write(4)
    seg = fs.segment()
    lines = seg.read_bytes().split(b"\n")
    lines[1] = lines[1].replace(b'"s1"', b'"s9"')
    seg.write_bytes(b"\n".join(lines))
    damaged = seg.read_bytes()
    for writing in (False, True):
        with pytest.raises(errors.CorruptionError) as e:
            store.run_store(REF).load(for_writing=writing)
        assert "checksum" in str(e.value)
        assert str(seg) in str(e.value)
    assert seg.read_bytes() == damaged


def test_a_damaged_last_complete_record_is_corruption_not_a_torn_write(fs: FsJournal) -> None:
    """One digit changed in the last record: complete (no zeros, newline in place), so it was
    damaged after it was written. Readers and the writer stop loudly; nothing is cut off."""
    store = fs.write(3)
    seg = fs.segment()
    lines = seg.read_bytes().split(b"\n")
    assert b'"value":2' in lines[2]
    lines[2] = lines[2].replace(b'"value":2', b'"value":7')
    seg.write_bytes(b"\n".join(lines))
    damaged = seg.read_bytes()
    for writing in (False, True):
        with pytest.raises(errors.CorruptionError) as e:
            store.run_store(REF).load(for_writing=writing)
        assert "checksum" in str(e.value)
        assert "not a torn write" in str(e.value)
        assert str(seg) in str(e.value)
        assert "seq=2" in str(e.value)
    assert seg.read_bytes() == damaged


def test_segments_roll_over_and_read_back(fs: FsJournal, tmp_path: Path) -> None:
    n = layout.SEGMENT_RECORDS + 5
    store = fs.write(n)
    assert fs.segment(layout.SEGMENT_RECORDS).exists()
    assert fs.seqs() == list(range(n))
    tail = store.backend.journal(REF.path + "/").read(n - 2)
    assert [seq for seq, _ in tail] == [n - 2, n - 1]
    # A missing middle segment is corruption, not a shorter journal.
    os.rename(fs.segment(0), tmp_path / "elsewhere")
    with pytest.raises(errors.CorruptionError):
        store.run_store(REF).load()


def test_a_second_writer_that_fell_behind_is_fenced(fs: FsJournal) -> None:
    a = fs.open().run_store(REF)
    b = fs.open().run_store(REF)
    a.load(for_writing=True)
    b.load(for_writing=True)
    a.append(_rec(0))
    with pytest.raises(errors.FencedError):
        b.append(_rec(0))
    a.append(_rec(1))
    a.close()
    b.close()


def test_a_writer_between_appends_holds_no_lock_and_a_newer_writer_fences_it(fs: FsJournal) -> None:
    # The lock is taken per append: a writer paused between two steps (its lease lapsing) must not keep
    # the attempt that replaces it out, and its own next append must then fail.
    old = fs.open().run_store(REF)
    old.load(for_writing=True)
    old.append(_rec(0))
    lock = os.open(fs.segment().parent / ".lock", os.O_RDWR)
    try:
        fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)  # free: raises BlockingIOError if held
        fcntl.flock(lock, fcntl.LOCK_UN)
    finally:
        os.close(lock)
    new = fs.open().run_store(REF)
    assert [r.seq for r in new.load(for_writing=True).records] == [0]
    new.append(_rec(1))
    with pytest.raises(errors.FencedError, match="already written by another writer"):
        old.append(_rec(1))
    new.append(_rec(2))
    old.close()
    new.close()
    assert fs.seqs() == [0, 1, 2]


def test_objects_are_written_whole_or_not_at_all(tmp_path: Path) -> None:
    store = open_store(f"file://{tmp_path}")
    assert store.backend.create("a/b.json", b"one")
    store.backend.put("a/c.json", b"two")
    leftovers = [p.name for p in (tmp_path / "a").iterdir() if p.name.startswith(".tmp")]
    assert leftovers == []


def test_the_writer_zero_fills_ahead_and_trims_on_close(fs: FsJournal) -> None:
    rs = fs.open().run_store(REF)
    rs.load(for_writing=True)
    for seq in range(3):
        rs.append(_rec(seq))
    seg = fs.segment()
    records = b"".join(codec.seal(_rec(seq).raw()) + b"\n" for seq in range(3))
    data = seg.read_bytes()
    assert data.startswith(records)
    assert len(data) > len(records)  # zeros ahead: a record's sync flushes data, not the file's size
    assert not data[len(records):].strip(b"\0")
    assert fs.seqs() == [0, 1, 2]  # readers stop at NUL
    rs.close()
    assert seg.read_bytes() == records


def test_a_crash_inside_the_zeros_is_discarded_before_the_next_append(fs: FsJournal) -> None:
    rs = fs.open().run_store(REF)
    rs.load(for_writing=True)
    for seq in range(3):
        rs.append(_rec(seq))
    seg = fs.segment()
    good = len(b"".join(codec.seal(_rec(seq).raw()) + b"\n" for seq in range(3)))
    # SIGKILL mid-write, and the disk kept only the second half of record 3 (pages land in any order).
    torn = codec.seal(_rec(3).raw()) + b"\n"
    with open(seg, "r+b") as f:
        f.seek(good + len(torn) // 2)
        f.write(torn[len(torn) // 2 :])
    assert fs.seqs() == [0, 1, 2]
    again = fs.open().run_store(REF)
    assert again.load(for_writing=True).next_seq == 3
    assert not seg.read_bytes()[good:].strip(b"\0")  # the torn bytes are gone
    again.append(_rec(3))
    again.append(_rec(4))
    again.close()
    assert fs.seqs() == [0, 1, 2, 3, 4]
    with pytest.raises(errors.FencedError):  # the crashed writer's view is stale: it cannot write again
        rs.append(_rec(3))
    rs.close()  # nor trim the newer writer's records away
    assert fs.seqs() == [0, 1, 2, 3, 4]


def test_a_read_from_a_later_record_does_not_check_the_ones_before_it(fs: FsJournal) -> None:
    """A resume reads from after its snapshot (or its last continuation): the records
    before that are counted, not checked again; damage from there on is still loud."""
    store = fs.write(6)
    seg = fs.segment()
    lines = seg.read_bytes().split(b"\n")
    lines[1] = lines[1].replace(b'"s1"', b'"s9"')
    seg.write_bytes(b"\n".join(lines))
    journal = store.backend.journal(REF.path + "/")
    assert [seq for seq, _ in journal.read(3)] == [3, 4, 5]
    writer = store.backend.journal(REF.path + "/")
    assert [seq for seq, _ in writer.read(3, repair=True)] == [3, 4, 5]
    writer.append(6, codec.seal(_rec(6).raw()))  # the writer's position is right
    writer.close()
    with pytest.raises(errors.CorruptionError):
        journal.read(1)


def test_truncate_cuts_across_segments_and_appends_resume_at_the_cut(fs: FsJournal,
                                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    """A rerun's cut inside the first segment of two: the later segment goes, the first is cut at a line."""
    monkeypatch.setattr(layout, "SEGMENT_RECORDS", 8)  # small segments: the same code, 13 appends not 4,101
    n = layout.SEGMENT_RECORDS + 5
    store = fs.write(n)
    journal = store.backend.journal(REF.path + "/")
    assert journal.truncate(layout.SEGMENT_RECORDS - 2) == 7
    assert not fs.segment(layout.SEGMENT_RECORDS).exists()
    assert fs.seqs() == list(range(layout.SEGMENT_RECORDS - 2))
    journal.close()
    rs = fs.open().run_store(REF)
    assert rs.load(for_writing=True).next_seq == layout.SEGMENT_RECORDS - 2
    for seq in range(layout.SEGMENT_RECORDS - 2, layout.SEGMENT_RECORDS + 1):
        rs.append(_rec(seq))
    rs.close()
    assert fs.seqs() == list(range(layout.SEGMENT_RECORDS + 1))
