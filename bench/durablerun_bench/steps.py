"""Per-step overhead: every system and every floor, same workload, same machine, same run.

Each repeat runs every row once, in a fresh interpreter each, one after the
other. A system's ratio to its floor uses the floor measured in the same
process right before and right after it (the machine is shared: its disk and
MinIO speed up and slow down from one second to the next), and the median over
repeats is reported.
"""

from __future__ import annotations

import statistics
import tempfile
from dataclasses import dataclass
from typing import Any

from durablerun_bench.util import best_of, run_json


@dataclass(frozen=True)
class Row:
    key: str
    label: str
    system: str
    params: dict[str, Any]
    durability: str
    floor: str | None = None  # key of the floor row this one is compared with


@dataclass
class Env:
    """Where the systems write: a directory on the local disk, MinIO, PostgreSQL."""

    tmp: str
    s3: dict[str, Any]
    pg_dsn: str  # a database for the raw-INSERT floor
    dbos_pg_url: str
    langgraph_pg_dsn: str
    dbos_sqlite_url: str


FS_DURABILITY = ("the record is written into the journal segment's zero-filled space and fdatasync'd before the "
                 "next step starts")
S3_DURABILITY = ("one conditional PutObject (If-None-Match: *) per step, acknowledged by MinIO before the "
                 "next step starts")
PG_DURABILITY = "each step's row committed with synchronous_commit=on (WAL flushed to disk) before the next step"


def rows(env: Env, record_bytes: int) -> list[Row]:
    size = {"size": record_bytes, "dir": env.tmp}
    return [
        Row("floor-fdatasync", "floor: append + fdatasync", "floor-append-fdatasync", size,
            "write(2) to one open file, then fdatasync"),
        Row("floor-fsync", "floor: append + fsync", "floor-append-fsync", size, "write(2), then fsync"),
        Row("floor-overwrite", "floor: overwrite zeros + fdatasync", "floor-overwrite-fdatasync", size,
            "pwrite(2) into a zero-filled, already synced file, then fdatasync: no metadata to commit"),
        Row("floor-create", "floor: new file + fsync + dir fsync", "floor-create-fsync", size,
            "a file per write: create, write, fsync, close, fsync the directory"),
        Row("floor-s3", "floor: S3 conditional PutObject (MinIO)", "floor-s3-put", {**size, **env.s3},
            "boto3 put_object with IfNoneMatch='*', the call the S3 store makes per step"),
        Row("floor-pg", "floor: PostgreSQL INSERT + commit", "floor-pg-insert", {**size, "dsn": env.pg_dsn},
            "one autocommitted INSERT of the same bytes, synchronous_commit=on"),
        Row("floor-sqlite-wal", "floor: SQLite INSERT + commit (WAL)", "floor-sqlite-insert",
            {**size, "journal_mode": "wal"}, "journal_mode=WAL, synchronous=FULL: the WAL is fsync'd per commit"),
        Row("floor-sqlite-delete", "floor: SQLite INSERT + commit (rollback journal)", "floor-sqlite-insert",
            {**size, "journal_mode": "delete"}, "journal_mode=DELETE, synchronous=FULL"),
        # The filesystem store's own floor is the overwrite: it writes each record into zeros it laid down ahead.
        Row("dr-fs", "durable-run, filesystem store", "durablerun", {"store": "fs", "dir": env.tmp},
            FS_DURABILITY, "floor-overwrite"),
        Row("dr-fs-sync", "durable-run, filesystem store, sync step fn (worker thread)", "durablerun",
            {"store": "fs", "dir": env.tmp, "sync_step": True}, FS_DURABILITY, "floor-overwrite"),
        # The same sync step fn without the hop to a worker thread and back: what that hop costs.
        Row("dr-fs-sync-inline", "durable-run, filesystem store, sync step fn on the loop thread "
            "(sync_steps_in_threads=False)", "durablerun",
            {"store": "fs", "dir": env.tmp, "sync_step": True, "threads": False}, FS_DURABILITY, "floor-overwrite"),
        Row("dr-s3", "durable-run, S3 store (MinIO)", "durablerun", {"store": "s3", **env.s3}, S3_DURABILITY,
            "floor-s3"),
        Row("dbos-pg", "DBOS on PostgreSQL", "dbos", {"url": env.dbos_pg_url}, PG_DURABILITY, "floor-pg"),
        Row("dbos-sqlite", "DBOS on SQLite", "dbos", {"url": env.dbos_sqlite_url},
            "each step's row committed; SQLite rollback journal, synchronous=FULL", "floor-sqlite-delete"),
        Row("lg-sqlite", "LangGraph, SqliteSaver, durability='sync'", "langgraph",
            {"backend": "sqlite", "dir": env.tmp},
            "checkpoint committed before the next step (durability='sync'); WAL, synchronous=FULL",
            "floor-sqlite-wal"),
        Row("lg-pg", "LangGraph, PostgresSaver, durability='sync'", "langgraph",
            {"backend": "pg", "dsn": env.langgraph_pg_dsn},
            "checkpoint committed before the next step (durability='sync'); synchronous_commit=on", "floor-pg"),
    ]


#: Operations of the floor run before and after each system (its bracket).
BRACKET_OPS = 500


def _floor(run: dict[str, Any], field: str) -> float:
    """The floor's value around one system run: the mean of the runs before and after it."""
    return (float(run["floor_before"][field]) + float(run["floor_after"][field])) / 2


def record_size(env: Env) -> int:
    """Bytes of one durable-run journal record holding a 1 KB result (what the floors write)."""
    got = run_json(["durablerun_bench.systems", "durablerun", _json({"store": "fs", "dir": env.tmp, "steps": 20})])
    return int(got["record_bytes"])


def _json(value: Any) -> str:
    import json

    return json.dumps(value)


def run(env: Env, *, steps: int, repeats: int, log: Any = print) -> dict[str, Any]:
    size = record_size(env)
    table = rows(env, size)
    by_key = {row.key: row for row in table}
    measured: dict[str, list[dict[str, Any]]] = {row.key: [] for row in table}
    for repeat in range(repeats):
        for row in table:
            params = {**row.params, "steps": steps}
            if row.system in ("dbos",) and "sqlite" in row.params.get("url", ""):
                params["url"] = f"sqlite:///{tempfile.mkdtemp(dir=env.tmp)}/dbos.sqlite"
            if row.floor:
                floor = by_key[row.floor]
                params["bracket"] = {"system": floor.system,
                                     "params": {**floor.params, "steps": min(steps, BRACKET_OPS)}}
            result = run_json(["durablerun_bench.systems", row.system, _json(params)])
            measured[row.key].append(result)
            log(f"  [{repeat + 1}/{repeats}] {row.label}: {result['ops_per_s']:.0f}/s, "
                f"p50 {result['p50_ms']:.2f} ms, p99 {result['p99_ms']:.2f} ms")
    out_rows = []
    for row in table:
        chosen = best_of(measured[row.key])
        entry: dict[str, Any] = {"key": row.key, "label": row.label, "durability": row.durability,
                                 "floor": row.floor, **chosen}
        if row.floor:
            runs = measured[row.key]
            ratios = [r["mean_ms"] / _floor(r, "mean_ms") for r in runs]
            p50 = [r["p50_ms"] / _floor(r, "p50_ms") for r in runs]
            fd = [r["mean_ms"] / f["mean_ms"] for r, f in zip(runs, measured["floor-fdatasync"], strict=True)]
            entry.update(ratio_floor=statistics.median(ratios), ratio_floor_all=ratios,
                         ratio_floor_p50=statistics.median(p50), ratio_fdatasync=statistics.median(fd),
                         floor_ms=statistics.median(_floor(r, "mean_ms") for r in runs))
        out_rows.append(entry)
    return {"steps": steps, "repeats": repeats, "record_bytes": size, "rows": out_rows,
            "raw": measured}
