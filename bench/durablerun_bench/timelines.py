"""The run browser's timeline of a 100,000-step run: one page read from the store, beside the whole journal.

A synthetic journal of N records (steps with ~100-byte results, a wait answered every 5,000 records, a restart
at 60%, a snapshot every 100 records as the engine saves them) is built in memory through ``RunStore``, then
written out in the filesystem layout and to MinIO (an object per record). For each store, in one process:
the old way (``RunStore.load`` then ``timeline.build`` of everything, then a page of it) and
``timeline.page`` for the first, a middle and the last page (200 entries, a cold attempts index each time, as
the browser has after a rerun or on its first look). Time is the median of the repeats; peak memory is
``tracemalloc``'s peak during one more call (Python allocations only).
``python -m durablerun_bench.timelines`` runs this section alone and prints its RESULTS.md section.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
import tracemalloc
import uuid
from collections.abc import Callable
from decimal import Decimal
from pathlib import Path
from typing import Any

from durablerun._private.records import layout
from durablerun._private.records.model import EventRecord, Record, StepRecord, Totals, WaitRecord
from durablerun._private.storage.journal import RunStore
from durablerun._private.tools import timeline
from durablerun.stores import RunRef, open_store
from durablerun_bench.alone import alone
from durablerun_bench.systems import s3_client
from durablerun_bench.util import put_objects, quick

PAGE = 200  # the browser's TIMELINE_PAGE
REF = RunRef.local("timeline-bench")


def _record(seq: int, n: int) -> Record:
    writer = "attempt-1" if seq < n * 6 // 10 else "attempt-2"
    at, totals = 1.7e9 + seq * 0.01, Totals(Decimal(seq) / 10_000, seq * 10, seq + 1)
    if seq % 5_000 == 4_998:
        return WaitRecord(seq=seq, pos=str(seq), name=f"approval-{seq}", w=writer, at=at, totals=totals)
    if seq % 5_000 == 4_999:
        return EventRecord(seq=seq, pos=str(seq - 1), name=f"approval-{seq - 1}", w=writer, at=at + 0.005,
                           value={"approved": True}, totals=totals)
    return StepRecord(seq=seq, pos=str(seq), name=f"step-{seq % 50}", value="x" * 100, w=writer, at=at, dur=0.004,
                      totals=totals)


def build(n: int, fs_root: Path, s3: dict[str, Any], prefix: str) -> None:
    """The journal in memory (snapshots as the engine takes them), then written to both stores' layouts."""
    memory = open_store(f"memory://timeline-bench-{uuid.uuid4().hex[:8]}")
    rs = memory.run_store(REF)
    loaded = rs.load(for_writing=True)
    for seq in range(n):
        record = _record(seq, n)
        rs.append(record)
        loaded.records.append(record)
        if (seq + 1) % 100 == 0:
            rs.snapshot(loaded, record.totals)
    backend: Any = memory.backend
    root = REF.path + "/"
    records: list[bytes] = list(backend.raw_journal(root))
    objects = {k: backend.get(k) for k in backend.list_keys(root) if layout.seq_of_journal_key(k[len(root):]) is None}
    target = fs_root / REF.path
    for key, data in objects.items():
        path = target / key[len(root):]
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data)
    (target / "journal").mkdir(parents=True, exist_ok=True)
    for start in range(0, len(records), layout.SEGMENT_RECORDS):
        (target / "journal" / layout.segment_name(start)).write_bytes(
            b"".join(r + b"\n" for r in records[start:start + layout.SEGMENT_RECORDS]))
    client = s3_client(s3)
    puts = [(f"{prefix}/{k}", v) for k, v in objects.items()]
    puts += [(f"{prefix}/{root}{layout.journal_key(seq)}", r) for seq, r in enumerate(records)]

    put_objects(client, s3["bucket"], puts)


def _whole(rs: RunStore, offset: int) -> int:
    """What the browser did before: the journal loaded and its timeline built whole, then one page cut out."""
    built = timeline.build(REF.key, rs.load().records, now=time.time())
    return len(built.entries[offset:offset + PAGE])


def _page(rs: RunStore, offset: int) -> int:
    page, _ = timeline.page(rs, REF.key, offset, PAGE, now=time.time(), count_attempts=False)  # as the browser
    return len(page.entries)


def _measure(open_rs: Callable[[], RunStore], op: Callable[[RunStore, int], int], offset: int,
             repeats: int) -> dict[str, Any]:
    seconds = []
    for _ in range(repeats):
        rs = open_rs()
        started = time.perf_counter()
        entries = op(rs, offset)
        seconds.append(time.perf_counter() - started)
        rs.close()
    rs = open_rs()
    tracemalloc.start()
    op(rs, offset)
    _, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    rs.close()
    return {"ms": statistics.median(seconds) * 1000, "ms_all": [s * 1000 for s in seconds], "peak_mib": peak / 2**20,
            "entries": entries}


def bench(*, tmp: str, s3: dict[str, Any], records: int, repeats: int, log: Any = print) -> dict[str, Any]:
    prefix = f"timelines-{uuid.uuid4().hex[:8]}"
    fs_root = Path(tmp) / "timelines-fs"
    started = time.monotonic()
    build(records, fs_root, s3, prefix)
    log(f"  built a {records:,}-record journal in both stores in {time.monotonic() - started:.0f} s")
    stores = {
        "filesystem": open_store(f"file://{fs_root}"),
        "S3 (MinIO)": open_store(f"s3://{s3['bucket']}/{prefix}", endpoint_url=s3["endpoint"],
                                 access_key=s3["access_key"], secret_key=s3["secret_key"]),
    }
    rows = []
    middle, last = records // 2, (records - 1) // PAGE * PAGE
    for store_name, store in stores.items():
        def open_rs(store: Any = store) -> RunStore:
            rs: RunStore = store.run_store(REF)
            return rs

        for what, op, offset in (("whole journal, then page 1 (before)", _whole, 0),
                                 ("page 1", _page, 0), (f"middle page (records {middle:,}+)", _page, middle),
                                 (f"last page (records {last:,}+)", _page, last)):
            row = {"store": store_name, "what": what, **_measure(open_rs, op, offset, repeats)}
            log(f"  {store_name}, {what}: {row['ms']:.1f} ms, peak {row['peak_mib']:.1f} MiB")
            rows.append(row)
        store.close()
    return {"records": records, "page": PAGE, "repeats": repeats, "rows": rows}


def section(t: dict[str, Any], load: str | None = None) -> list[str]:
    """The report's section (report.render)."""
    lines = [
        f"## 6. The run browser's timeline of a {t['records']:,}-record journal: one page, not the journal",
        "",
        f"A synthetic journal of {t['records']:,} records (steps with 100-byte results, a wait every 5,000, a "
        "restart at 60%, a snapshot every 100 records), on the filesystem store and on MinIO. *Before*: the "
        "browser loaded the journal (snapshot chunks and tail) and built the whole timeline to show one page. "
        f"*Page*: `timeline.page` as the browser calls it: the page's {t['page']} records and the 64 before it, "
        "the journal's length (filesystem: its last segment; S3: the snapshot pointer, then one listing of the "
        "tail), its first and last records, and the page's attempt by bisecting writer changes (single-record "
        "reads, cold each time: the last page is past the restart). Median of "
        f"{t['repeats']} repeats; peak memory is tracemalloc's (Python allocations) during one more call"
        + (f"; load average (1/5/15 min) {load} before the section" if load else "") + ".",
        "",
        "| store | read | time (median) | each repeat | peak memory |",
        "|---|---|---|---|---|",
    ]
    for row in t["rows"]:
        lines.append(f"| {row['store']} | {row['what']} | {row['ms']:.1f} ms | "
                     + ", ".join(f"{ms:.1f}" for ms in row["ms_all"]) + f" ms | {row['peak_mib']:.1f} MiB |")
    return [*lines, ""]


def main(argv: list[str] | None = None) -> int:
    argparse.ArgumentParser(prog="python -m durablerun_bench.timelines", description=__doc__.splitlines()[0]
                            ).parse_args(argv)
    with alone("timelines", s3=True) as run:
        records, repeats = (20_000, 1) if quick() else (100_000, 3)
        result = bench(tmp=str(run.root), s3=run.s3_params, records=records, repeats=repeats,
                       log=lambda m: print(m, file=sys.stderr))
        run.report(section(result, str(run.load)), result)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
