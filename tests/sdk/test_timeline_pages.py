"""The run browser's timeline pages: each reads only its own records (and a few before them), and the pages
together are the timeline of the whole journal: the same entries, attempts, waits and restarts."""

from __future__ import annotations

from decimal import Decimal
from pathlib import Path

import pytest

from durablerun._private.records.model import EventRecord, Record, StepRecord, Totals, WaitRecord
from durablerun._private.storage.journal import RunStore
from durablerun._private.tools import timeline
from durablerun.stores import RunRef, Store, open_store

REF = RunRef.local("pages")
PAGE = 7


def journal(n: int) -> list[Record]:
    """``n`` records: steps, a wait answered right away every 10th position, one still open at the end, and three
    attempts (the writer changes at 23 and 41)."""
    records: list[Record] = []
    for seq in range(n):
        writer = "a" if seq < 23 else "b" if seq < 41 else "c"
        at, totals = 1_000.0 + seq, Totals(Decimal(seq) / 100, seq * 10, seq + 1)
        if seq % 10 == 8 or seq == n - 1:
            records.append(WaitRecord(seq=seq, pos=str(seq), name=f"e{seq}", w=writer, at=at, totals=totals))
        elif seq % 10 == 9:
            records.append(EventRecord(seq=seq, pos=str(seq - 1), name=f"e{seq - 1}", w=writer, at=at + 0.5,
                                       value=True, totals=totals))
        else:
            records.append(StepRecord(seq=seq, pos=str(seq), name=f"s{seq}", value=seq, w=writer, at=at, dur=0.25,
                                      totals=totals))
    return records


class Counting(RunStore):
    """A RunStore that remembers which ranges were read."""

    ranges: list[tuple[int, int]]

    def read_range(self, from_seq: int, to_seq: int) -> list[Record]:
        self.ranges.append((from_seq, to_seq))
        return super().read_range(from_seq, to_seq)


@pytest.fixture(params=["memory", "file"])
def store(request: pytest.FixtureRequest, tmp_path: Path) -> Store:
    uri = f"memory://pages-{tmp_path.name}" if request.param == "memory" else f"file://{tmp_path / 'store'}"
    return open_store(uri)


def test_the_pages_together_are_the_whole_timeline_and_each_reads_only_its_own(store: Store) -> None:
    records = journal(57)
    rs = Counting(store.backend, REF)
    rs.ranges = []
    for record in records:
        rs.append(record)
    whole = timeline.build(REF.key, records, now=5_000.0)

    paged: list[timeline.Entry] = []
    for offset in range(0, len(records), PAGE):
        rs.ranges.clear()
        page, facts = timeline.page(rs, REF.key, offset, PAGE, now=5_000.0)
        paged.extend(page.entries)
        assert facts["total"] == len(records)
        assert (facts["start"], facts["end"]) == (whole.start, whole.end)
        assert (facts["attempts"], facts["usd"], facts["tokens"]) == (3, whole.usd, whole.tokens)
        # O(page): the page and what comes before it, and single records for the attempt index and the run's edges.
        assert all(end - first <= PAGE + timeline.LOOKBACK for first, end in rs.ranges), rs.ranges
        assert sum(end - first for first, end in rs.ranges) < len(records) or offset < timeline.LOOKBACK

    def plain(entries: list[timeline.Entry]) -> list[tuple[str, str, float, float, int, int]]:
        return [(e.kind, e.name, e.start, e.end, e.attempt, e.seq) for e in entries]

    assert plain(paged) == plain(whole.entries)
    kinds = [e.kind for e in paged]
    assert kinds.count("restart") == 2
    assert kinds.count("wait") == 6
    assert [e.attempt for e in paged if e.kind == "restart"] == [2, 3]
    assert paged[-1].kind == "wait"
    assert paged[-1].end == 5_000.0
    rs.close()


def test_a_far_page_of_a_long_journal_reads_a_page_not_the_journal(store: Store) -> None:
    records = journal(1_200)
    rs = Counting(store.backend, REF)
    rs.ranges = []
    for record in records:
        rs.append(record)
    rs.ranges.clear()
    attempts = timeline.Attempts(rs)
    page, facts = timeline.page(rs, REF.key, 700, 200, now=5_000.0, attempts=attempts)
    assert [e.seq for e in page.entries if e.kind == "step"][:2] == [700, 701]
    assert facts["attempts"] == 3
    assert all(e.attempt == 3 for e in page.entries)
    read = sum(end - first for first, end in rs.ranges)
    assert read <= 200 + timeline.LOOKBACK + 40, rs.ranges  # the page, its lookback, a bisection's single records
    rs.ranges.clear()
    timeline.page(rs, REF.key, 900, 200, now=5_000.0, attempts=attempts)
    assert sum(end - first for first, end in rs.ranges) <= 200 + timeline.LOOKBACK + 2  # the writers are remembered
    rs.close()


def test_a_restart_row_names_its_causes_from_the_runs_events() -> None:
    """The operator's Restarting Events between one attempt's last record and the next one's first are that
    restart's causes; Events elsewhere, or of another reason, are not."""
    records = journal(45)  # attempts change at 23 (t=1023) and 41 (t=1041)
    entries = timeline.build(REF.key, records).entries
    events = [
        (1_022.5, "Restarting", "Crash: the runner exited with code 137: restart 1 of 3 in 10s"),
        (1_023.0, "Started", "attempt 2 in pod x-2"),
        (1_030.0, "Restarting", "OOMKilled: not between two attempts' records"),
        (1_040.2, "Restarting", "Crash: the runner exited with code 1: restart 2 of 3 in 20s"),
        (1_041.9, "Restarting", "LeaseExpired: the lease lapsed before attempt 3 journaled anything"),
    ]
    timeline.restart_causes(entries, events)
    restarts = [e for e in entries if e.kind == "restart"]
    assert [e.causes for e in restarts] == [["Crash"], ["Crash", "LeaseExpired"]]
    assert restarts[0].reason == ("Crash: the runner exited with code 137: restart 1 of 3 in 10s; "
                                  "attempt 2 (b) resumed the run")
    assert "; then LeaseExpired: the lease lapsed" in restarts[1].reason
    assert all(not e.causes for e in entries if e.kind != "restart")
    items = [{"lastTimestamp": "2026-11-25T23:00:00Z", "reason": "Restarting", "message": "Crash: x"},
             {"eventTime": "2026-11-25T23:00:01.500000Z", "reason": "Restarting", "message": "Evicted: y"},
             {"reason": "Restarting", "message": "no time: left out"}]
    assert [(reason, message) for _, reason, message in timeline.kubernetes_events(items)] == [
        ("Restarting", "Crash: x"), ("Restarting", "Evicted: y")]
