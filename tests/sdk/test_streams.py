"""Output streams (ctx.stream): batching, offsets, resuming a read, limits, names, supersession, following.

On the filesystem store and on S3 (MinIO of the test bed); the kill-and-resume and follow tests run
``durablerun run`` as a subprocess and read the stream from outside it, as a user would.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import json
import queue
import signal
import subprocess
import sys
import threading
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from durablerun import DurableContext, NonRetryableError, StepError, WorkflowError
from durablerun._private.engine.halts import Halt, HaltKind
from durablerun._private.engine.replay import STEP, StepFrame
from durablerun._private.engine.streams import Streams
from durablerun._private.records import layout
from durablerun._private.storage.stream_reader import Read, Standing, StreamReader
from durablerun._private.storage.streams import Chunk, StreamObjects
from durablerun._private.tools import kubectl
from durablerun.api import Outcome
from durablerun.stores import RunRef, Store
from tests.helpers.local_runs import StoreSpec, wait_until

from .helpers import FAST, REF, attempt, cli, sub_env
from .workflows import streaming


def _reads(store: Store, name: str = "story", *, start: int = 0, final: bool = False,
           ref: RunRef = REF) -> list[Read]:
    rs = store.run_store(ref)
    try:
        return list(StreamReader(rs, name, start=start, final=final).read())
    finally:
        rs.close()


def _text(reads: list[Read]) -> str:
    return "".join(r.chunk.text for r in reads)


def _writer(words: int, *, pause: float = 0.0) -> Any:
    async def wf(ctx: DurableContext, input: dict[str, Any]) -> int:
        out = ctx.stream("story")

        def write_part(part: int) -> None:
            for i in range(words):
                out.write(streaming.word(part, i))
                time.sleep(pause)

        for part in range(input.get("parts", 1)):
            await ctx.step(f"part-{part}", write_part, part)
        return 0
    return wf


# --- batching and offsets ---------------------------------------------------------------------


def test_writes_are_batched_into_chunks_with_offsets_that_have_no_gap(durable_store_spec: StoreSpec) -> None:
    store = durable_store_spec.open()
    config = replace(FAST, stream_batch_bytes=40)
    result = attempt(store, _writer(30), {"parts": 2}, config=config)
    assert result.outcome == Outcome.COMPLETED, result.message
    reads = _reads(store)
    assert [r.chunk.offset for r in reads] == list(range(len(reads)))
    assert _text(reads) == streaming.expected(2, 30)
    assert all(r.standing == Standing.FINAL for r in reads)
    # Batched by size (6-byte words, 40 bytes a chunk), and never across a step's boundary.
    assert all(len(r.chunk.text) <= 40 for r in reads)
    assert 2 * 30 * 6 // 40 <= len(reads) < 30
    assert {r.chunk.step for r in reads} == {"part-0", "part-1"}
    assert all(r.chunk.text.startswith(f"p{r.chunk.step[-1]}") for r in reads)


def test_a_quick_step_is_one_chunk_and_a_slow_one_is_flushed_by_time(durable_store_spec: StoreSpec) -> None:
    store = durable_store_spec.open()
    assert attempt(store, _writer(10), config=replace(FAST, stream_batch_seconds=30)).outcome == Outcome.COMPLETED
    assert len(_reads(store)) == 1  # drained before the step was journaled, not by the 30 s timer
    slow = RunRef.local("slow")
    result = attempt(store, _writer(3, pause=0.3), ref=slow, config=replace(FAST, stream_batch_seconds=0.05))
    assert result.outcome == Outcome.COMPLETED, result.message
    assert [r.chunk.text for r in _reads(store, ref=slow)] == [streaming.word(0, i) for i in range(3)]


def test_a_reader_resuming_at_any_offset_sees_no_gap_and_no_duplicate(durable_store_spec: StoreSpec) -> None:
    store = durable_store_spec.open()
    attempt(store, _writer(20), {"parts": 3}, config=replace(FAST, stream_batch_bytes=20))
    whole = _reads(store)
    assert len(whole) > 5
    for cut in range(len(whole) + 1):
        rs = store.run_store(REF)
        first = StreamReader(rs, "story")
        head = first.poll()[:cut]
        resumed = StreamReader(rs, "story", start=head[-1].chunk.offset + 1 if head else 0)
        tail = list(resumed.read())
        assert [r.chunk.offset for r in head + tail] == list(range(len(whole)))
        assert _text(head + tail) == _text(whole)
        rs.close()


def test_a_reader_far_behind_reads_every_window(durable_store_spec: StoreSpec) -> None:
    store = durable_store_spec.open()
    attempt(store, _writer(150), config=replace(FAST, stream_batch_bytes=6))
    reads = _reads(store)
    assert len(reads) == 150  # more than two read windows
    assert _text(reads) == streaming.expected(1, 150)


def test_a_final_reader_holds_at_most_a_window_of_undecided_chunks(tmp_path: Path) -> None:
    """A step still running (nothing journaled) that wrote ten chunks: a final reader shows none of them and holds
    three (its window), not ten; the rest stay in the store. Once the run has written them all and finished, a
    final reader with the same window reads every chunk, in order, window by window."""
    store = StoreSpec("fs", f"file://{tmp_path / 'store'}", {}, [], {}).open()
    pending = RunRef.local("pending")
    objects = StreamObjects(store.backend, pending)
    for offset in range(10):
        assert objects.create("story", Chunk(offset=offset, text=f"{offset} ", attempt="a1", pos="0", step="s",
                                             tries=1, at=0.0))
    rs = store.run_store(pending)
    reader = StreamReader(rs, "story", final=True, window=3)
    assert reader.advance().behind  # a whole window came: read on at once...
    step = reader.advance()  # ...which fetches nothing more while the window is undecided: the follower waits
    assert (step.reads, step.fresh, step.behind, step.done, reader.next_offset) == ([], False, False, False, 0)
    assert len(reader._held) == 3  # what the reader keeps in memory: a window, not the stream
    rs.close()

    attempt(store, _writer(10), config=replace(FAST, stream_batch_bytes=1))  # one chunk a write, journaled
    rs = store.run_store(REF)
    reads = list(StreamReader(rs, "story", final=True, window=3).read())
    assert [r.chunk.offset for r in reads] == list(range(10))
    assert {r.standing for r in reads} == {Standing.FINAL}
    rs.close()


class _Undecided:
    """A run's store as a reader sees it while the step that wrote its chunks still runs: no journal record and no
    outcome yet, until ``decided``."""

    def __init__(self, store: Any) -> None:
        self._store, self.decided = store, False

    def __getattr__(self, name: str) -> Any:
        return getattr(self._store, name)

    def count(self) -> int:
        return int(self._store.count()) if self.decided else 0

    def read_status(self) -> Any:
        return self._store.read_status() if self.decided else None


def test_a_final_reader_whose_window_was_undecided_when_the_run_finished_reads_to_the_end(tmp_path: Path) -> None:
    """A final reader that holds a whole window of undecided chunks when the step is journaled and the run
    finishes reads on to the last chunk: the poll that decided the window fetched nothing for want of room,
    which is not the end of the stream."""
    store = StoreSpec("fs", f"file://{tmp_path / 'store'}", {}, [], {}).open()
    attempt(store, _writer(10), config=replace(FAST, stream_batch_bytes=1))  # one chunk a write, journaled
    rs = store.run_store(REF)
    seen = _Undecided(rs)
    reader = StreamReader(seen, "story", final=True, window=3)  # type: ignore[arg-type]
    assert reader.advance().reads == []
    assert reader.advance().reads == []
    assert len(reader._held) == 3
    seen.decided = True
    reads = list(reader.follow(sleep=lambda _: None))
    assert [r.chunk.offset for r in reads] == list(range(10))
    assert {r.standing for r in reads} == {Standing.FINAL}
    rs.close()


def test_async_steps_await_their_writes_and_gathered_steps_never_share_a_chunk(tmp_path: Path) -> None:
    store = StoreSpec("fs", f"file://{tmp_path / 'store'}", {}, [], {}).open()
    config = replace(FAST, stream_buffer_bytes=12, stream_batch_bytes=12)  # awrite waits for room often

    async def wf(ctx: DurableContext, input: dict[str, Any]) -> None:
        out = ctx.stream("story")

        async def write_part(part: int) -> None:
            for i in range(10):
                await out.awrite(streaming.word(part, i))
                await asyncio.sleep(0)

        await ctx.gather(*(ctx.step(f"part-{part}", write_part, part) for part in range(3)))

    result = attempt(store, wf, config=config)
    assert result.outcome == Outcome.COMPLETED, result.message
    reads = _reads(store, final=True)
    for part in range(3):
        mine = [r for r in reads if r.chunk.step == f"part-{part}"]
        assert _text(mine) == streaming.expected(part + 1, 10)[len(streaming.expected(part, 10)):]
        assert all(set(r.chunk.text.split()) <= {streaming.word(part, i).strip() for i in range(10)} for r in mine)
    assert [r.chunk.offset for r in reads] == list(range(len(reads)))


# --- supersession inside one attempt ------------------------------------------------------------


def test_a_retried_step_supersedes_what_its_failed_try_wrote(tmp_path: Path) -> None:
    store = StoreSpec("fs", f"file://{tmp_path / 'store'}", {}, [], {}).open()

    async def wf(ctx: DurableContext, input: dict[str, Any]) -> str:
        out = ctx.stream("story")
        tries = []

        def flaky() -> str:
            tries.append(1)
            out.write(f"try {len(tries)} ")
            if len(tries) == 1:
                raise RuntimeError("first try fails")
            return "ok"

        return await ctx.step("flaky", flaky)

    assert attempt(store, wf).outcome == Outcome.COMPLETED
    raw = _reads(store)
    assert [(r.chunk.text, r.standing) for r in raw] == [("try 1 ", Standing.SUPERSEDED), ("try 2 ", Standing.FINAL)]
    assert _text(_reads(store, final=True)) == "try 2 "


# --- limits, names and misuse -------------------------------------------------------------------


def _one_step(write: Any) -> Any:
    async def wf(ctx: DurableContext, input: dict[str, Any]) -> None:
        out = ctx.stream("story")
        await ctx.step("write", write, out)
    return wf


def test_a_write_past_the_size_limit_fails_its_step_naming_the_limit(tmp_path: Path) -> None:
    store = StoreSpec("fs", f"file://{tmp_path / 'store'}", {}, [], {}).open()
    config = replace(FAST, stream_max_write_bytes=100)
    result = attempt(store, _one_step(lambda out: out.write("x" * 101)), config=config)
    assert result.outcome == Outcome.FAILED
    assert "101 bytes is past the limit of 100 bytes per write" in result.message
    assert "stream_max_write_bytes" in result.message
    assert "split it" in result.message


def test_a_stream_past_its_chunk_limit_fails_the_step_naming_the_limit(tmp_path: Path) -> None:
    store = StoreSpec("fs", f"file://{tmp_path / 'store'}", {}, [], {}).open()
    config = replace(FAST, stream_max_chunks=3, stream_batch_bytes=1)

    def write(out: Any) -> None:
        for i in range(10):
            out.write(f"{i}")
            time.sleep(0.01)

    result = attempt(store, _one_step(write), config=config)
    assert result.outcome == Outcome.FAILED
    assert "reached its limit of 3 chunks (EngineConfig.stream_max_chunks)" in result.message
    assert [r.chunk.offset for r in _reads(store)] == [0, 1, 2]


def test_a_stream_past_its_limit_fails_only_the_steps_that_wrote_to_it(tmp_path: Path) -> None:
    store = StoreSpec("fs", f"file://{tmp_path / 'store'}", {}, [], {}).open()
    config = replace(FAST, stream_max_chunks=1, stream_batch_bytes=1)

    async def wf(ctx: DurableContext, input: dict[str, Any]) -> str:
        full, other = ctx.stream("full"), ctx.stream("other")

        def too_much() -> None:
            full.write("a")
            full.write("b")

        with contextlib.suppress(StepError):
            await ctx.step("too-much", too_much)
        await ctx.step("elsewhere", other.write, "fine")
        return await ctx.step("nothing", lambda: "written")

    result = attempt(store, wf, config=config)
    assert result.outcome == Outcome.COMPLETED, result.message
    assert _text(_reads(store, "other", final=True)) == "fine"
    assert [r.chunk.text for r in _reads(store, "full")] == ["a"]


@pytest.mark.parametrize("name", ["", "a/b", "-x", "x" * 129, "sp ace"])
def test_a_bad_stream_name_is_refused(tmp_path: Path, name: str) -> None:
    store = StoreSpec("fs", f"file://{tmp_path / 'store'}", {}, [], {}).open()

    async def wf(ctx: DurableContext, input: dict[str, Any]) -> None:
        ctx.stream(name)

    result = attempt(store, wf)
    assert result.outcome == Outcome.FAILED
    assert f"invalid stream name {name!r}" in result.message
    done = cli(["stream", "--run-id", "t", "--store", f"file://{tmp_path / 'store'}", "--", name])
    assert done.returncode == 2, done.stderr
    assert "invalid stream name" in done.stderr


def test_a_write_from_the_workflow_function_is_refused(tmp_path: Path) -> None:
    async def wf(ctx: DurableContext, input: dict[str, Any]) -> None:
        ctx.stream("story").write("hello")

    result = attempt(StoreSpec("fs", f"file://{tmp_path / 'store'}", {}, [], {}).open(), wf)
    assert result.outcome == Outcome.FAILED
    assert "write() was called outside a step" in result.message
    assert "runs again on every resume" in result.message


def test_writes_wait_while_the_store_lags_behind(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Bounded memory: with the store stalled, a write that would pass the buffer's bytes waits for it."""
    store = StoreSpec("fs", f"file://{tmp_path / 'store'}", {}, [], {}).open()
    stalled = threading.Event()
    created = StreamObjects.create

    def slow_create(self: StreamObjects, name: str, chunk: Any) -> bool:
        stalled.wait(timeout=30)
        return created(self, name, chunk)

    monkeypatch.setattr(StreamObjects, "create", slow_create)
    config = replace(FAST, stream_buffer_bytes=100, stream_batch_bytes=10, stream_batch_seconds=0.01)
    streams = Streams(StreamObjects(store.backend, REF), "a1", config, lambda: False)
    out = streams.open("story")
    written = []

    def step() -> None:
        STEP.set(StepFrame("0", "write", tries=1))
        for i in range(30):
            out.write("x" * 10)
            written.append(i)

    thread = threading.Thread(target=contextvars.copy_context().run, args=(step,))
    thread.start()
    wait_until(lambda: len(written) >= 10, timeout=10, what="the buffer to fill")
    time.sleep(0.2)  # the proof is that nothing happens: the writer stays blocked
    assert len(written) == 10
    stalled.set()
    thread.join(timeout=30)
    assert len(written) == 30
    streams.close()
    assert _text(_reads(store)) == "x" * 300


def test_two_attempts_never_own_one_offset(durable_store_spec: StoreSpec, monkeypatch: pytest.MonkeyPatch) -> None:
    """A successor that listed the stream before its fenced predecessor's last chunks landed loses the
    offsets they took (first write wins) and writes after them."""
    store = durable_store_spec.open()
    config = replace(FAST, stream_batch_bytes=1)

    def write(streams: Streams, texts: list[str]) -> None:
        token = STEP.set(StepFrame("0", "write", tries=1))
        try:
            out = streams.open("story")
            for text in texts:
                out.write(text)
        finally:
            STEP.reset(token)
        streams.close()

    write(Streams(StreamObjects(store.backend, REF), "old", config, lambda: False), ["a", "b"])
    monkeypatch.setattr(StreamObjects, "end", lambda self, name: 0)  # a listing from before "a" and "b"
    write(Streams(StreamObjects(store.backend, REF), "new", config, lambda: False), ["c"])
    assert [(r.chunk.offset, r.chunk.attempt, r.chunk.text) for r in _reads(store)] == [
        (0, "old", "a"), (1, "old", "b"), (2, "new", "c")]


def test_a_fenced_attempt_writes_no_chunk_and_its_step_is_not_journaled(tmp_path: Path) -> None:
    store = StoreSpec("fs", f"file://{tmp_path / 'store'}", {}, [], {}).open()
    streams = Streams(StreamObjects(store.backend, REF), "fenced", FAST, lambda: True)
    out = streams.open("story")
    token = STEP.set(StepFrame("0", "write", tries=1))
    try:
        out.write("never stored")
        with pytest.raises(Halt) as halted:
            asyncio.run(streams.drain(STEP.get()))  # type: ignore[arg-type]
        assert halted.value.kind == HaltKind.FENCE
        with pytest.raises(Halt):
            out.write("nor this")
    finally:
        STEP.reset(token)
    streams.close()
    assert _reads(store) == []


def test_reading_a_run_that_is_not_there_is_a_usage_error(tmp_path: Path) -> None:
    done = cli(["stream", "story", "--run-id", "nope", "--store", f"file://{tmp_path / 'store'}", "--follow"])
    assert done.returncode == 2
    assert "no run _local/nope in this store" in done.stderr


def test_unit_limits_of_the_writer_outside_a_run(tmp_path: Path) -> None:
    store = StoreSpec("fs", f"file://{tmp_path / 'store'}", {}, [], {}).open()
    streams = Streams(StreamObjects(store.backend, REF), "a1", FAST, lambda: False)
    with pytest.raises(WorkflowError, match="invalid stream name 'a/b'"):
        streams.open("a/b")
    out = streams.open("ok")
    token = STEP.set(StepFrame("0", "w", tries=1))
    try:
        with pytest.raises(NonRetryableError, match="takes a str"):
            out.write(b"bytes")  # type: ignore[arg-type]
    finally:
        STEP.reset(token)
    streams.close()


# --- across processes: kill and resume, follow --------------------------------------------------


def _run(spec: StoreSpec, run_id: str, input: dict[str, Any], env: dict[str, str] | None = None,
         ) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "durablerun", "run", "streaming:story", "--run-id", run_id, "--store", spec.uri,
         *spec.cli_args, "--input", json.dumps(input), "--quiet"],
        env=sub_env({**spec.env, **(env or {})}), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def _ledger(path: Path) -> dict[int, list[tuple[int, str]]]:
    """What each process wrote, by pid: (part, text), in order."""
    out: dict[int, list[tuple[int, str]]] = {}
    for line in path.read_text().splitlines():
        pid, part, text = line.split(" ", 2)
        out.setdefault(int(pid), []).append((int(part), text))
    return out


def test_a_step_killed_mid_write_is_superseded_when_it_runs_again(durable_store_spec: StoreSpec,
                                                                    tmp_path: Path) -> None:
    store = durable_store_spec.open()
    ref = RunRef.local("killed")
    ledger, gate = tmp_path / "ledger", tmp_path / "gate"
    input = {"ledger": str(ledger), "parts": 3, "words": 8, "hold": 1, "gate_after": 5}
    first = _run(durable_store_spec, "killed", input, {streaming.GATE_ENV: str(gate)})
    # Killed once part-1's first five words are durable chunks (the 250 ms flush), before the step is journaled.
    held = "".join(streaming.word(1, i) for i in range(5))
    wait_until(lambda: _text([r for r in _reads(store, ref=ref) if r.chunk.step == "part-1"]) == held,
               timeout=30, what="part-1's first words in the stream", interval=0.02)
    first.send_signal(signal.SIGKILL)
    first.wait(timeout=30)
    second = _run(durable_store_spec, "killed", input)
    _, err = second.communicate(timeout=60)
    assert second.returncode == 0, err

    wrote = _ledger(ledger)
    assert set(wrote) == {first.pid, second.pid}
    assert [part for part, _ in wrote[first.pid]] == [0] * 8 + [1] * 5  # killed in part-1
    assert [part for part, _ in wrote[second.pid]] == [1] * 8 + [2] * 8  # part-0 was journaled: not again
    final = _reads(store, ref=ref, final=True)
    assert _text(final) == streaming.expected(3, 8)  # each word of the surviving tries once, in order
    assert [r.chunk.offset for r in final] == sorted(r.chunk.offset for r in final)
    raw = _reads(store, ref=ref)
    assert [r.chunk.offset for r in raw] == list(range(len(raw)))
    superseded = [r for r in raw if r.standing == Standing.SUPERSEDED]
    assert {r.chunk.step for r in superseded} == {"part-1"}
    assert _text(superseded) == "".join(text for part, text in wrote[first.pid] if part == 1)
    assert len({r.chunk.attempt for r in superseded}) == 1
    assert {r.chunk.attempt for r in final if r.chunk.step == "part-1"} != {superseded[0].chunk.attempt}
    assert not [r for r in raw if r.standing == Standing.PENDING]
    # The CLI reads the same: --final on stdout; a plain read sends the superseded chunks to stderr.
    args = ["stream", "story", "--run-id", "killed", "--store", durable_store_spec.uri, *durable_store_spec.cli_args]
    shown = cli([*args, "--final"], env=durable_store_spec.env)
    assert shown.returncode == 0, shown.stderr
    assert shown.stdout == streaming.expected(3, 8)
    plain = cli([a for a in args if a != "story"], env=durable_store_spec.env)  # the run's only stream
    assert plain.stdout == streaming.expected(3, 8)
    assert plain.stderr.count("[superseded: offset") == len(superseded)


def _lines(proc: subprocess.Popen[str]) -> tuple[queue.Queue[str], threading.Thread]:
    """The process's stdout lines as they come (a thread reads them, to its end: the test waits with
    deadlines)."""
    lines: queue.Queue[str] = queue.Queue()

    def pump() -> None:
        assert proc.stdout is not None
        for line in proc.stdout:
            lines.put(line)

    thread = threading.Thread(target=pump, daemon=True)
    thread.start()
    return lines, thread


def _take(lines: queue.Queue[str], count: int, timeout: float) -> list[dict[str, Any]]:
    deadline = time.monotonic() + timeout
    got = []
    while len(got) < count:
        try:
            got.append(json.loads(lines.get(timeout=max(0.0, deadline - time.monotonic()))))
        except queue.Empty:
            raise AssertionError(f"timed out after {timeout}s with {len(got)} of {count} chunks") from None
    return got


def test_a_follower_sees_chunks_while_the_run_writes_and_ends_with_it(durable_store_spec: StoreSpec,
                                                                       tmp_path: Path) -> None:
    ledger, gate = tmp_path / "ledger", tmp_path / "gate"
    input = {"ledger": str(ledger), "parts": 2, "words": 6, "hold": 1, "gate_after": 3}
    run = _run(durable_store_spec, "followed", input, {streaming.GATE_ENV: str(gate)})
    # The stream exists once part-0 is journaled; the follower starts while part-1 waits at the gate.
    store = durable_store_spec.open()
    wait_until(lambda: _reads(store, ref=RunRef.local("followed")), timeout=30, what="the stream's first chunk",
               interval=0.02)
    follower = subprocess.Popen(
        [sys.executable, "-m", "durablerun", "stream", "story", "--run-id", "followed", "--store",
         durable_store_spec.uri, *durable_store_spec.cli_args, "--follow", "--json"],
        env=sub_env(durable_store_spec.env), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        lines, pump = _lines(follower)
        seen = _take(lines, 1, timeout=30)
        while _text_of(seen) != streaming.expected(1, 6) + "p1w0 p1w1 p1w2 ":
            seen += _take(lines, 1, timeout=30)  # part-1's first words, live: the step has not returned
        assert run.poll() is None
        assert {c["standing"] for c in seen if c["step"] == "part-1"} == {"pending"}
        gate.touch()
        assert run.wait(timeout=60) == 0
        follower.wait(timeout=30)  # it ends by itself: the run finished and the stream is read
        pump.join(timeout=30)
        seen += _take(lines, lines.qsize(), timeout=1)
        assert _text_of(seen) == streaming.expected(2, 6)
        assert [c["offset"] for c in seen] == list(range(len(seen)))
        assert follower.returncode == 0
    finally:
        for proc in (run, follower):
            if proc.poll() is None:
                proc.kill()
                proc.wait()


def _text_of(chunks: list[dict[str, Any]]) -> str:
    return "".join(c["text"] for c in chunks)


def test_the_plugin_reads_a_stream_with_the_cli_s_options() -> None:
    args = kubectl.build_parser().parse_args(["stream", "my-run", "notes", "-f", "--from", "3", "--final", "-n", "t"])
    assert (args.run, args.name, args.follow, args.from_offset, args.final, args.namespace) == (
        "my-run", "notes", True, 3, True, "t")
    assert kubectl.HANDLERS["stream"] is kubectl.cmd_stream


def test_the_stream_key_scheme() -> None:
    assert layout.stream_key("story", 7) == "streams/story/000000000007.json"
    assert layout.offset_of_stream_key("story", "streams/story/000000000007.json") == 7
    assert layout.offset_of_stream_key("story", "streams/other/000000000007.json") is None
    assert layout.stream_name_error("ok.name-1_x") is None
    assert "invalid stream name 'a/b'" in str(layout.stream_name_error("a/b"))
