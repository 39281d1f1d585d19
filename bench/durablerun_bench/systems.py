"""One measured run of one system or floor, in a fresh interpreter.

``python -m durablerun_bench.systems NAME '{"steps": 1000, ...}'`` prints one JSON
line: the :class:`~durablerun_bench.util.Series` summary. Every system runs the
same workload: ``steps`` sequential steps, each returning a 1 KB string
(:func:`~durablerun_bench.util.payload`), each made durable before the next
starts. A step's latency is the time from one step's start to the next step's
start (the step's own work is ~1 µs; the rest is the system's overhead).

Floors do the same number of bare writes of ``size`` bytes (the size of
durable-run's journal record for a 1 KB result) and time each write.
"""

from __future__ import annotations

import json
import os
import resource
import sys
import tempfile
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

from durablerun_bench.util import Series, emit, intervals, payload

STAMPS: list[float] = []


def _stamp() -> None:
    STAMPS.append(time.perf_counter())


def _blob(size: int, i: int) -> bytes:
    head = f'{{"seq":{i},"body":"'.encode()
    tail = b'"}'
    return head + payload(i).encode()[: max(0, size - len(head) - len(tail))].ljust(
        max(0, size - len(head) - len(tail)), b"x") + tail


# --- floors ---------------------------------------------------------------------------


def _time_ops(name: str, n: int, op: Callable[[int], None], extra: dict[str, Any] | None = None) -> Series:
    latencies = []
    started = time.perf_counter()
    for i in range(n):
        t0 = time.perf_counter()
        op(i)
        latencies.append(time.perf_counter() - t0)
    return Series(name, latencies, time.perf_counter() - started, extra or {})


def floor_append(p: dict[str, Any], *, sync: Callable[[int], None]) -> Series:
    path = Path(p["dir"]) / f"floor-{uuid.uuid4().hex}.log"
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    dir_fd = os.open(p["dir"], os.O_RDONLY | os.O_DIRECTORY)
    os.fsync(dir_fd)
    os.close(dir_fd)
    size = int(p["size"])

    def op(i: int) -> None:
        os.write(fd, _blob(size - 1, i) + b"\n")
        sync(fd)

    try:
        return _time_ops("floor", int(p["steps"]), op, {"bytes": size})
    finally:
        os.close(fd)
        path.unlink()


def floor_overwrite(p: dict[str, Any]) -> Series:
    """pwrite into zeros already on disk (written and synced beforehand), then fdatasync.

    The file's size and blocks do not change, so the sync flushes data only:
    what a database does with its preallocated log, and what durable-run's
    filesystem journal does since it zero-fills its segments ahead.
    """
    path = Path(p["dir"]) / f"floor-{uuid.uuid4().hex}.log"
    size, n = int(p["size"]), int(p["steps"])
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    os.write(fd, bytes(size * n + 4096))
    os.fsync(fd)

    def op(i: int) -> None:
        os.pwrite(fd, _blob(size - 1, i) + b"\n", i * size)
        os.fdatasync(fd)

    try:
        return _time_ops("floor", n, op, {"bytes": size})
    finally:
        os.close(fd)
        path.unlink()


def floor_create_fsync(p: dict[str, Any]) -> Series:
    """A file per write: create, write, fsync, close, fsync the directory."""
    directory = Path(p["dir"]) / f"floor-{uuid.uuid4().hex}"
    directory.mkdir()
    dir_fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY)
    size = int(p["size"])

    def op(i: int) -> None:
        fd = os.open(directory / f"{i:012d}.json", os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
        os.write(fd, _blob(size, i))
        os.fsync(fd)
        os.close(fd)
        os.fsync(dir_fd)

    try:
        return _time_ops("floor", int(p["steps"]), op, {"bytes": size})
    finally:
        os.close(dir_fd)
        import shutil

        shutil.rmtree(directory, ignore_errors=True)


def s3_client(p: dict[str, Any]) -> Any:
    import boto3
    import botocore.config

    return boto3.session.Session().client(
        "s3", endpoint_url=p["endpoint"], region_name="us-east-1",
        aws_access_key_id=p["access_key"], aws_secret_access_key=p["secret_key"],
        config=botocore.config.Config(retries={"mode": "standard", "max_attempts": 8},
                                      s3={"addressing_style": "path"}, max_pool_connections=16))


def floor_s3_put(p: dict[str, Any]) -> Series:
    """One conditional PutObject (If-None-Match: *) per write, through boto3 as the SDK does."""
    client = s3_client(p)
    prefix = f"floor-{uuid.uuid4().hex[:8]}"
    size = int(p["size"])
    client.put_object(Bucket=p["bucket"], Key=f"{prefix}/warmup", Body=b"x", IfNoneMatch="*")

    def op(i: int) -> None:
        import botocore.exceptions

        try:
            client.put_object(Bucket=p["bucket"], Key=f"{prefix}/journal/{i:012d}.json", Body=_blob(size, i),
                              IfNoneMatch="*")
        except botocore.exceptions.ClientError as error:
            # MinIO under heavy load now and then reports IncompleteBody; the SDK's retries would
            # resend, and so does the floor (the retry stays inside the timed operation).
            if error.response.get("Error", {}).get("Code") != "IncompleteBody":
                raise
            client.put_object(Bucket=p["bucket"], Key=f"{prefix}/journal/{i:012d}.json", Body=_blob(size, i),
                              IfNoneMatch="*")

    return _time_ops("floor", int(p["steps"]), op, {"bytes": size})


def floor_pg_insert(p: dict[str, Any]) -> Series:
    """One INSERT of the same bytes per write, autocommit (synchronous_commit=on: WAL flushed)."""
    import psycopg

    size = int(p["size"])
    with psycopg.connect(p["dsn"], autocommit=True) as conn:
        conn.execute("CREATE TABLE IF NOT EXISTS floor (id bigint PRIMARY KEY, body bytea)")
        conn.execute("TRUNCATE floor")
        setting = conn.execute("SHOW synchronous_commit").fetchone()
        fsync = conn.execute("SHOW fsync").fetchone()

        def op(i: int) -> None:
            conn.execute("INSERT INTO floor (id, body) VALUES (%s, %s)", (i, _blob(size, i)))

        return _time_ops("floor", int(p["steps"]), op, {
            "bytes": size, "synchronous_commit": setting[0] if setting else None,
            "fsync": fsync[0] if fsync else None})


def floor_sqlite_insert(p: dict[str, Any]) -> Series:
    """One INSERT + COMMIT per write (journal_mode as given, synchronous=FULL)."""
    import sqlite3

    size = int(p["size"])
    path = Path(p["dir"]) / f"floor-{uuid.uuid4().hex}.sqlite"
    conn = sqlite3.connect(path)
    conn.execute(f"PRAGMA journal_mode={p['journal_mode']}")
    conn.execute("PRAGMA synchronous=FULL")
    conn.execute("CREATE TABLE floor (id INTEGER PRIMARY KEY, body BLOB)")
    conn.commit()

    def op(i: int) -> None:
        conn.execute("INSERT INTO floor (id, body) VALUES (?, ?)", (i, _blob(size, i)))
        conn.commit()

    try:
        return _time_ops("floor", int(p["steps"]), op, {"bytes": size, "journal_mode": p["journal_mode"]})
    finally:
        conn.close()
        for suffix in ("", "-wal", "-shm", "-journal"):
            Path(str(path) + suffix).unlink(missing_ok=True)


# --- durable-run ------------------------------------------------------------------------


async def _work_async(i: int) -> str:
    _stamp()
    return payload(i)


def _work_sync(i: int) -> str:
    _stamp()
    return payload(i)


def durablerun(p: dict[str, Any]) -> Series:
    from durablerun import api
    from durablerun.engine import EngineConfig, Run
    from durablerun.stores import RunRef, open_store

    n = int(p["steps"])
    fn: Callable[[int], Any] = _work_sync if p.get("sync_step") else _work_async

    async def workflow(ctx: Any, input: dict[str, Any]) -> int:
        for i in range(n):
            await ctx.step("work", fn, i)
        return n

    workdir = Path(tempfile.mkdtemp(prefix="drbench-", dir=p["dir"]))
    if p["store"] == "fs":
        uri = f"file://{workdir}"
        store = open_store(uri)
    else:
        uri = f"s3://{p['bucket']}/bench"
        store = open_store(uri, endpoint_url=p["endpoint"], access_key=p["access_key"],
                           secret_key=p["secret_key"], region="us-east-1")
    ref = RunRef.local(f"steps-{uuid.uuid4().hex[:12]}")
    config = EngineConfig(snapshot_every=int(p.get("snapshot_every", 100)),
                          sync_steps_in_threads=bool(p.get("threads", True)))
    sinks: list[Any] = []
    children = resource.getrusage(resource.RUSAGE_CHILDREN)
    if p.get("trace_endpoint"):  # the tracing section: the sink `durablerun run` adds when an endpoint is set
        from durablerun._private.telemetry import tracing

        os.environ["OTEL_EXPORTER_OTLP_ENDPOINT"] = p["trace_endpoint"]  # the exporter reads the environment
        sinks = tracing.sinks_for(store, ref)  # starts the span export child
        if not sinks:
            raise RuntimeError("tracing did not start: is the otel extra installed?")
        if p.get("warm"):
            sink: Any = sinks[0]
            _wait_for_export_child(sink.export.process.pid)
    STAMPS.clear()
    started, cpu, own = time.perf_counter(), time.process_time(), time.thread_time()
    # The event loop, and so every async step, runs on this thread; process_time adds the other threads' CPU.
    result = Run(store=store, run=ref, workflow=workflow, input={}, sinks=sinks, config=config).run_attempt()
    total, cpu, own = time.perf_counter() - started, time.process_time() - cpu, time.thread_time() - own
    # The attempt's end waited for the span export child: its CPU is in the children's, the only child here.
    ended = resource.getrusage(resource.RUSAGE_CHILDREN)
    child = ended.ru_utime + ended.ru_stime - children.ru_utime - children.ru_stime
    if result.outcome != api.Outcome.COMPLETED:
        raise RuntimeError(f"durable-run ended {result.outcome.value}: {result.message}")
    extra: dict[str, Any] = {"end_to_end_s": total, "cpu_ms_per_step": 1000 * cpu / n,
                             "thread_cpu_ms_per_step": 1000 * own / n, "child_cpu_ms_per_step": 1000 * child / n}
    if sinks:
        extra["spans_undelivered"] = sinks[0].undelivered
    if p["store"] == "fs":
        journal = workdir / ref.path / "journal"
        segment = sorted(journal.glob("*.log"))[0].read_bytes()
        first = segment.split(b"\n", 1)[0]
        extra["record_bytes"] = len(first) + 1
    store.close()
    import shutil

    shutil.rmtree(workdir, ignore_errors=True)
    latencies, wall = intervals(STAMPS)
    return Series("durablerun", latencies, wall, extra)


def _wait_for_export_child(pid: int) -> None:
    """Until the span export child has started and waits on its pipe (Linux: its wait channel)."""
    deadline = time.monotonic() + 60
    while "pipe" not in Path(f"/proc/{pid}/wchan").read_text():
        if time.monotonic() > deadline:
            raise RuntimeError("the span export child did not start within 60 s")
        time.sleep(0.01)


# --- DBOS ---------------------------------------------------------------------------------


def _dbos(p: dict[str, Any]) -> Any:
    from dbos import DBOS, DBOSConfig

    config: DBOSConfig = {"name": "durablerun-bench", "system_database_url": p["url"], "log_level": "WARNING"}
    DBOS(config=config)
    return DBOS


def dbos(p: dict[str, Any]) -> Series:
    from durablerun_bench import dbos_flows

    n = int(p["steps"])
    dbos_api = _dbos(p)
    dbos_api.launch()
    try:
        durability = dbos_flows.durability(p["url"])
        STAMPS.clear()
        dbos_flows.STAMP.append(_stamp)
        started = time.perf_counter()
        handle = dbos_api.start_workflow(dbos_flows.steps, n, False)
        assert handle.get_result() == n
        total = time.perf_counter() - started
    finally:
        dbos_api.destroy()
    latencies, wall = intervals(STAMPS)
    return Series("dbos", latencies, wall, {"end_to_end_s": total, **durability})


# --- LangGraph ------------------------------------------------------------------------------


def langgraph(p: dict[str, Any]) -> Series:
    from typing import TypedDict

    from langgraph.graph import END, START, StateGraph

    n = int(p["steps"])

    class State(TypedDict):
        i: int
        last: str

    def work(state: State) -> dict[str, Any]:
        _stamp()
        return {"i": state["i"] + 1, "last": payload(state["i"])}

    graph = StateGraph(State)
    graph.add_node("work", work)
    graph.add_edge(START, "work")
    graph.add_conditional_edges("work", lambda s: END if s["i"] >= n else "work")
    config: Any = {"configurable": {"thread_id": uuid.uuid4().hex}, "recursion_limit": n + 10}
    extra: dict[str, Any] = {}

    def go(saver: Any) -> float:
        app = graph.compile(checkpointer=saver)
        STAMPS.clear()
        started = time.perf_counter()
        out = app.invoke({"i": 0, "last": ""}, config, durability="sync")
        assert out["i"] == n
        return time.perf_counter() - started

    if p["backend"] == "sqlite":
        from langgraph.checkpoint.sqlite import SqliteSaver

        path = Path(p["dir"]) / f"lg-{uuid.uuid4().hex}.sqlite"
        with SqliteSaver.from_conn_string(str(path)) as lite:
            lite.setup()
            extra["journal_mode"] = lite.conn.execute("PRAGMA journal_mode").fetchone()[0]
            extra["synchronous"] = {0: "OFF", 1: "NORMAL", 2: "FULL", 3: "EXTRA"}[
                lite.conn.execute("PRAGMA synchronous").fetchone()[0]]
            total = go(lite)
    else:
        from langgraph.checkpoint.postgres import PostgresSaver

        with PostgresSaver.from_conn_string(p["dsn"]) as saver:
            saver.setup()
            import psycopg

            with psycopg.connect(p["dsn"]) as conn:
                row = conn.execute("SHOW synchronous_commit").fetchone()
            extra["synchronous_commit"] = row[0] if row else None
            total = go(saver)
    latencies, wall = intervals(STAMPS)
    return Series("langgraph", latencies, wall, {"end_to_end_s": total, **extra})


SYSTEMS: dict[str, Callable[[dict[str, Any]], Series]] = {
    "floor-append-fdatasync": lambda p: floor_append(p, sync=os.fdatasync),
    "floor-append-fsync": lambda p: floor_append(p, sync=os.fsync),
    "floor-overwrite-fdatasync": floor_overwrite,
    "floor-create-fsync": floor_create_fsync,
    "floor-s3-put": floor_s3_put,
    "floor-pg-insert": floor_pg_insert,
    "floor-sqlite-insert": floor_sqlite_insert,
    "durablerun": durablerun,
    "dbos": dbos,
    "langgraph": langgraph,
}


def bracketed(name: str, params: dict[str, Any]) -> dict[str, Any]:
    """Run the system between two runs of its floor, in this process, back to back.

    ``params["bracket"]`` names the floor and its parameters. On a shared
    machine the disk's and the server's speed drift from second to second; a
    floor measured right before and right after the system is the fairest
    denominator for its ratio.
    """
    bracket = params.pop("bracket", None)
    if not bracket:
        return SYSTEMS[name](params).summary()
    floor = SYSTEMS[bracket["system"]]
    before = floor({**bracket["params"], "dir": params["dir"]}).summary()
    result = SYSTEMS[name](params).summary()
    after = floor({**bracket["params"], "dir": params["dir"]}).summary()
    return {**result, "floor_before": before, "floor_after": after}


def main(argv: list[str]) -> int:
    name, params = argv[0], json.loads(argv[1]) if len(argv) > 1 else {}
    params.setdefault("dir", tempfile.gettempdir())
    emit(bracketed(name, params))
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
