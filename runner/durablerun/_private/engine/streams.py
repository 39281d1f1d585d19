"""The output streams of one attempt (``ctx.stream``): what steps write, batched into chunks.

Part of the runtime layer. A write lands in its stream's buffer, tagged with the step try that wrote
it; one thread of the attempt's own turns the buffers into chunks
(:class:`~durablerun._private.storage.streams.Chunk`) when a batch is big enough or old enough, and
the attempt drains every buffer before it journals a step (:meth:`Streams.drain`), so a journaled
step's chunks are always durable. A buffer is bounded: a write waits while the store lags behind.

Only steps write: the workflow function runs again on every resume, and a write there has no journal
record of its own to tell which attempt's copy is the one that counts.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from durablerun import errors
from durablerun._private.engine.halts import Halt, HaltKind
from durablerun._private.engine.replay import STEP, StepFrame, misuse
from durablerun._private.records import layout
from durablerun._private.records.model import EngineConfig
from durablerun._private.storage.streams import Chunk, StreamObjects


@dataclass
class _Piece:
    text: str
    size: int
    frame: StepFrame
    tries: int
    #: The order of writes across the attempt's streams (what a drain waits for).
    seq: int


@dataclass
class _Buffer:
    pending: list[_Piece] = field(default_factory=list)
    #: Bytes written and not yet durable (pending, or in a chunk being written).
    held: int = 0
    #: When the oldest pending piece was written (monotonic), for the time threshold.
    since: float = 0.0
    #: The next offset to create; None until the flusher has listed the stream.
    next_offset: int | None = None
    #: The last piece buffered, and the last one durable (their seqs).
    queued: int = 0
    durable: int = 0
    #: Why this stream takes no more writes (a limit, a fence, a store error), once it does not.
    failed: Halt | None = None
    #: The steps whose writes that failure lost (their drain raises it, other steps' do not).
    lost: list[StepFrame] = field(default_factory=list)


class Stream:
    """An append-only output stream of the run (``ctx.stream(name)``): what its steps write, durably.

    Each write is stored as (part of) a chunk with an offset in the stream; readers
    (``durablerun stream``) read it live or later. A step that runs again (its attempt was killed, or it
    failed and is retried) writes afresh, and what its earlier try wrote is marked superseded.
    """

    def __init__(self, streams: Streams, name: str) -> None:
        self._streams = streams
        self.name = name

    def write(self, text: str) -> None:
        """Append ``text``; from a step only. Waits while the stream's buffer is full (the store lags)."""
        self._streams.put(self.name, text)

    async def awrite(self, text: str) -> None:
        """:meth:`write` for async steps: waits for room without holding up the event loop."""
        streams = self._streams
        piece = streams.piece(self.name, text)
        if not streams.try_put(self.name, piece):
            await asyncio.to_thread(streams.put_piece, self.name, piece)


class Streams:
    """The streams of one attempt and the thread that writes their chunks."""

    def __init__(self, objects: StreamObjects, attempt_id: str, config: EngineConfig,
                 refuse_writes: Callable[[], bool]) -> None:
        self._objects = objects
        self._attempt_id = attempt_id
        self._config = config
        self._refuse_writes = refuse_writes
        self._buffers: dict[str, _Buffer] = {}
        self._cond = threading.Condition()
        self._seq = 0
        self._closing = False
        self._urgent = False
        self._thread: threading.Thread | None = None

    @property
    def opened(self) -> bool:
        """Whether the attempt opened any stream (only then is there anything to drain)."""
        return bool(self._buffers)

    def open(self, name: str) -> Stream:
        problem = layout.stream_name_error(name)
        if problem is not None:
            raise errors.WorkflowError(f"ctx.stream: {problem}")
        with self._cond:
            if name not in self._buffers:
                self._buffers[name] = _Buffer()
            if self._thread is None:
                self._thread = threading.Thread(target=self._flusher, name="durablerun-streams", daemon=True)
                self._thread.start()
        return Stream(self, name)

    # --- writes (any thread of a step) --------------------------------------------------------
    def piece(self, name: str, text: str) -> _Piece:
        """``text`` as a piece of the step running here, or the error that refuses it."""
        frame = STEP.get()
        if frame is None:
            raise misuse(f"stream {name!r}: write() was called outside a step. The workflow function runs "
                         "again on every resume, so a write there would repeat; write from a step, e.g. "
                         f"await ctx.step('say', ctx.stream({name!r}).write, text)")
        if not isinstance(text, str):
            raise errors.NonRetryableError(f"stream {name!r}: write() takes a str, got {type(text).__name__}")
        size = len(text.encode())
        limit = self._config.stream_max_write_bytes
        if size > limit:
            raise errors.NonRetryableError(
                f"stream {name!r}: a write of {size} bytes is past the limit of {limit} bytes per write "
                "(EngineConfig.stream_max_write_bytes): split it into smaller writes")
        return _Piece(text, size, frame, frame.tries, 0)

    def put(self, name: str, text: str) -> None:
        self.put_piece(name, self.piece(name, text))

    def try_put(self, name: str, piece: _Piece) -> bool:
        """Buffer ``piece`` if there is room now (True), else leave it (False); raise what refuses it."""
        with self._cond:
            buf = self._usable(name)
            if self._full(buf, piece):
                return False
            self._buffer(buf, piece)
            return True

    def put_piece(self, name: str, piece: _Piece) -> None:
        """Buffer ``piece``, waiting while the buffer is full (bounded memory: the store sets the pace)."""
        with self._cond:
            buf = self._usable(name)
            while self._full(buf, piece):
                self._urgent = True
                self._cond.notify_all()
                self._cond.wait()
                buf = self._usable(name)
            self._buffer(buf, piece)

    def _full(self, buf: _Buffer, piece: _Piece) -> bool:
        """No room for ``piece`` (one piece always fits an empty buffer: the largest write is limited)."""
        return bool(buf.held) and buf.held + piece.size > self._config.stream_buffer_bytes

    def _usable(self, name: str) -> _Buffer:
        buf = self._buffers[name]
        _raise(buf.failed)
        if self._closing:
            raise Halt(HaltKind.SUSPEND, f"stream {name!r}: the attempt ended before this write")
        return buf

    def _buffer(self, buf: _Buffer, piece: _Piece) -> None:
        self._seq += 1
        piece.seq = buf.queued = self._seq
        if not buf.pending:
            buf.since = time.monotonic()
        buf.pending.append(piece)
        buf.held += piece.size
        if buf.held >= self._config.stream_batch_bytes:
            self._cond.notify_all()

    # --- the attempt's side -------------------------------------------------------------------
    async def drain(self, frame: StepFrame) -> None:
        """Return once everything written so far is durable (before step ``frame``'s record is journaled);
        raise what stopped a stream: a fence or a store error always, a limit if it lost this step's writes."""
        with self._cond:
            targets = {name: buf.queued for name, buf in self._buffers.items() if buf.durable < buf.queued}
            if not targets:
                self._raise_failed(frame)
                return
            self._urgent = True
            self._cond.notify_all()
        await asyncio.to_thread(self._wait_durable, targets, frame)

    def _wait_durable(self, targets: dict[str, int], frame: StepFrame) -> None:
        with self._cond:
            while not all(self._buffers[n].durable >= seq or self._buffers[n].failed for n, seq in targets.items()):
                self._cond.wait()
            self._raise_failed(frame)

    def _raise_failed(self, frame: StepFrame) -> None:
        for buf in self._buffers.values():
            if buf.failed is not None and (buf.failed.kind != HaltKind.FAIL or any(f is frame for f in buf.lost)):
                _raise(buf.failed)

    def close(self) -> None:
        """Write what is buffered (a later try supersedes it if its step was not journaled), then stop."""
        with self._cond:
            self._closing = True
            self._cond.notify_all()
            thread = self._thread
        if thread is not None:
            thread.join(timeout=self._config.stop_grace.total_seconds())

    # --- the flusher thread --------------------------------------------------------------------
    def _flusher(self) -> None:
        config = self._config
        while True:
            with self._cond:
                while True:
                    due = self._due()
                    if due or (self._closing and not any(b.pending for b in self._buffers.values())):
                        break
                    oldest = min((b.since for b in self._buffers.values() if b.pending), default=None)
                    wait = config.stream_batch_seconds if oldest is None else \
                        oldest + config.stream_batch_seconds - time.monotonic()
                    self._cond.wait(timeout=max(wait, 0.001))
                self._urgent = False
                if not due:
                    return
                taken = []
                for name in due:
                    buf = self._buffers[name]
                    taken.append((name, buf, buf.pending))
                    buf.pending = []
            for name, buf, pieces in taken:
                self._write(name, buf, pieces)

    def _due(self) -> list[str]:
        """The streams to flush now: all with something pending when urgent or closing, else those past a
        threshold."""
        now, config = time.monotonic(), self._config
        return [name for name, buf in self._buffers.items() if buf.pending and (
            self._urgent or self._closing or buf.held >= config.stream_batch_bytes
            or now - buf.since >= config.stream_batch_seconds)]

    def _write(self, name: str, buf: _Buffer, pieces: list[_Piece]) -> None:
        failed: Halt | None = None
        try:
            for batch in _batches(pieces, self._config.stream_batch_bytes):
                self._create(name, buf, batch)
        except Halt as halt:
            failed = halt
        except Exception as e:  # a store error, or a bug: either way its writers must not wait forever
            failed = Halt(HaltKind.CRASH, f"stream {name!r}: {type(e).__name__}: {e}", error=e)
        with self._cond:
            buf.held -= sum(p.size for p in pieces)
            buf.durable = max(buf.durable, pieces[-1].seq)
            if failed is not None and buf.failed is None:
                buf.failed = failed
            if buf.failed is not None:  # nothing more of this stream is written: free its writers
                buf.lost += [p.frame for p in pieces + buf.pending]
                buf.held -= sum(p.size for p in buf.pending)
                buf.pending = []
            self._cond.notify_all()

    def _create(self, name: str, buf: _Buffer, batch: list[_Piece]) -> None:
        """Store one chunk at the stream's next free offset (first write wins: a taken offset was an
        earlier attempt's, still writing while it is fenced; the next one is tried)."""
        if buf.next_offset is None:
            buf.next_offset = self._objects.end(name)
        head = batch[0]
        while True:
            limit = self._config.stream_max_chunks
            if buf.next_offset >= limit:
                message = (f"stream {name!r} reached its limit of {limit} chunks "
                           "(EngineConfig.stream_max_chunks): write less to it, or to several streams")
                raise Halt(HaltKind.FAIL, message, error=errors.NonRetryableError(message))
            if self._refuse_writes():
                raise Halt(HaltKind.FENCE, f"stream {name!r}: this attempt may write nothing more")
            chunk = Chunk(offset=buf.next_offset, text="".join(p.text for p in batch), attempt=self._attempt_id,
                          pos=head.frame.position, step=head.frame.name, tries=head.tries, at=round(time.time(), 6))
            buf.next_offset += 1
            if self._objects.create(name, chunk):
                return


def _raise(failed: Halt | None) -> None:
    """Raise why a stream failed: a limit as the step's own error (it fails for good, the workflow may catch
    it), anything else as the Halt it is."""
    if failed is None:
        return
    if failed.kind == HaltKind.FAIL and isinstance(failed.error, errors.NonRetryableError):
        raise failed.error
    raise failed


def _batches(pieces: list[_Piece], batch_bytes: int) -> list[list[_Piece]]:
    """Consecutive pieces of one step try, up to ``batch_bytes`` a chunk (a bigger piece is a chunk alone)."""
    batches: list[list[_Piece]] = []
    size = 0
    for piece in pieces:
        last = batches[-1] if batches else None
        if last and last[0].frame is piece.frame and last[0].tries == piece.tries \
                and size + piece.size <= batch_bytes:
            last.append(piece)
            size += piece.size
        else:
            batches.append([piece])
            size = piece.size
    return batches
