"""The writer of one attempt: appends its records in order, and saves snapshots.

Part of the runtime layer. Every record goes through :meth:`Writer.commit`
(or :meth:`Writer.commit_now`), which asks the write guard first (a runner
whose lease lapsed writes nothing more), assigns the next sequence number,
stamps the record (writer, time, cost, totals) and appends it: on the loop
thread for a local store, on the one writer thread for a remote one. Every
``snapshot_every`` records (and at each continuation) a snapshot is saved on
a thread of its own, off the step's critical path.

Group commit (a remote journal that writes several records in one request,
S3): records committed while a write is in flight wait in a queue, and the
writer thread's next write takes all of them (up to ``layout.GROUP_RECORDS``)
as one object. Each ``commit`` still returns only once its own record is
durable, so "journaled before the caller sees the result" holds per step; a
gather of N steps that finish together costs about two PUTs instead of N.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import threading
import time
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from decimal import Decimal
from typing import Any, TypeVar

from durablerun import errors
from durablerun._private.engine.halts import Halt, HaltKind
from durablerun._private.engine.replay import Live
from durablerun._private.engine.sinks import EventKind, SinkSet
from durablerun._private.records import layout
from durablerun._private.records.model import ContinueRecord, Cost, EngineConfig, Record, Totals
from durablerun._private.storage.journal import RunStore

R = TypeVar("R", bound=Record)


@dataclass
class _Entry:
    """One record waiting to be written, and where its caller waits for it."""

    record: Record
    usd: Decimal
    tokens: int
    step: bool
    #: Set for a record queued for group commit (:meth:`Writer._flush` writes it).
    done: Future[tuple[Any, str]] | None = None


class Writer:
    """Appends one attempt's records in order, behind the write guard; snapshots on its own thread."""

    def __init__(self, *, store: RunStore, live: Live, config: EngineConfig, sinks: SinkSet,
                 attempt_id: str) -> None:
        self.store = store
        self.live = live
        self.config = config
        self.sinks = sinks
        self.attempt_id = attempt_id
        #: Held while a record is appended (and while pending cost is added to).
        self.lock = threading.Lock()
        self._loop = asyncio.get_running_loop()
        self._snap_pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="durablerun-snap")
        self._write_pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="durablerun-w")
        #: Group commit when the journal writes a group in one request (and the config allows it).
        self._grouping = not store.backend.io_inline and store.journal().groups and config.group_commit
        self._queue: list[_Entry] = []
        self._queue_lock = threading.Lock()
        #: Why this attempt may write nothing more (lease lost, another writer won), once it may not.
        self.fenced: str | None = None
        self.closed = False

    def close(self) -> None:
        """No more appends; a snapshot still being saved finishes unless the attempt is fenced."""
        with self.lock:
            self.closed = True
        self._snap_pool.shutdown(wait=not self.fenced, cancel_futures=bool(self.fenced))
        self._write_pool.shutdown(wait=False)

    def _append_locked(self, record: R, usd: Decimal, tokens: int, step: bool) -> tuple[R, str]:
        """Append one record (on the loop thread for a local store, else on the writer thread)."""
        result: tuple[R, str] = self._write_batch([_Entry(record, usd, tokens, step)])[0]
        return result

    def _append_batch(self, batch: list[_Entry]) -> None:
        """Append queued records (group commit), in one write when there are several.

        On the single writer thread, one batch at a time, in order. Each entry's
        future gets its (record, key), or the Halt that stopped the write.
        """
        try:
            results = self._write_batch(batch)
        except BaseException as e:
            for entry in batch:
                assert entry.done is not None
                entry.done.set_exception(e)
            if not isinstance(e, Exception):
                raise
            return
        for entry, result in zip(batch, results, strict=True):
            assert entry.done is not None
            entry.done.set_result(result)

    def _write_batch(self, batch: list[_Entry]) -> list[tuple[Any, str]]:
        with self.lock:
            if self.refuse_writes():
                raise Halt(HaltKind.FENCE, self.fenced or "a replay-only attempt writes nothing")
            if self.closed:
                raise Halt(HaltKind.SUSPEND, "the attempt ended before this result was saved")
            live = self.live
            # Stamp every record first; the live state changes only once they are durable.
            totals, stamped = live.totals, []
            usd_pending, tokens_pending = live.pending_usd, live.pending_tokens
            first = live.loaded.next_seq
            for i, entry in enumerate(batch):
                record, usd, tokens = entry.record, entry.usd + usd_pending, entry.tokens + tokens_pending
                usd_pending, tokens_pending = Decimal(0), 0
                totals = Totals(totals.usd + usd, totals.tokens + tokens,
                                totals.steps + (1 if entry.step else 0))
                record.seq, record.w, record.at, record.totals = (
                    first + i, self.attempt_id, round(time.time(), 6), totals)
                record.cost = Cost(usd, tokens) if usd or tokens else None
                record.body = record.encode()
                stamped.append(totals)
            records = [entry.record for entry in batch]
            try:
                keys = (self.store.append_group(records) if len(records) > 1
                        else [self.store.append(records[0])])
            except errors.FencedError as e:
                self.fenced = str(e)
                raise Halt(HaltKind.FENCE, str(e), error=e) from None
            except errors.StoreError as e:
                raise Halt(HaltKind.CRASH, str(e), error=e) from None
            for record, totals in zip(records, stamped, strict=True):
                self._journaled(record, totals)
            return list(zip(records, keys, strict=True))

    def _journaled(self, record: Record, totals: Totals) -> None:
        """Take a durable record into the live state; under the writer lock."""
        live = self.live
        if isinstance(record, ContinueRecord):
            # The new generation starts here: earlier records are not kept in memory
            # (a snapshot still being written holds its own reference to them).
            live.loaded.rebase(record)
        else:
            live.loaded.records.append(record)
        live.add(record)
        live.totals = totals
        live.pending_usd, live.pending_tokens = Decimal(0), 0
        # Every snapshot_every records of a generation; a generation after the first
        # also saves one right at its continuation, so a resume from here on reads
        # nothing of the generation before (not even its journal tail).
        seq = record.seq
        gen_offset = 0 if live.loaded.continuation is not None else 1
        if (seq - live.loaded.base + gen_offset) % self.config.snapshot_every == 0:
            # Off the step's critical path: the record is already durable, and a
            # snapshot only makes the next resume cheaper.
            self._snap_pool.submit(self._snapshot_job, seq, totals)

    def _flush(self) -> None:
        """On the writer thread: write every queued record (up to a group's worth) in one request.

        One job is submitted per commit, so a job that finds the queue empty (an earlier job took
        its record along) has nothing to do. A continuation ends a group: what follows it belongs
        to the next generation's first write.
        """
        with self._queue_lock:
            batch = self._queue[: layout.GROUP_RECORDS]
            for i, entry in enumerate(batch):
                if isinstance(entry.record, ContinueRecord):
                    batch = batch[: i + 1]
                    break
            del self._queue[: len(batch)]
        if batch:
            self._append_batch(batch)

    def refuse_writes(self) -> bool:
        """True once this attempt may write nothing more: fenced, or its write guard says so."""
        if self.config.replay is not None:
            return True  # a replay-only attempt (the replayer) writes nothing, ever
        guard = self.config.write_guard
        reason = guard() if guard is not None and not self.fenced else None
        if reason:
            self.fenced = reason
        return bool(self.fenced)

    def _snapshot_job(self, upto: int | None, totals: Totals) -> tuple[str | None, str | None]:
        """Runs on the snapshot thread (one at a time, in order)."""
        if self.refuse_writes():
            return None, None
        key: str | None = None
        warning: str | None = None
        try:
            key = self.store.snapshot(self.live.loaded, totals, upto=upto)
        except errors.StoreError as e:
            # Snapshots only speed up resume; the journal already holds everything.
            warning = f"snapshot failed (the journal is intact): {e}"
        loop = self._loop
        if loop is not None and not loop.is_closed():
            seq = self.live.loaded.snapshot_seq
            with contextlib.suppress(RuntimeError):
                if key:
                    loop.call_soon_threadsafe(
                        functools.partial(self.sinks.emit, EventKind.CHECKPOINT_SAVED, seq=seq,
                                          key=key))
                if warning:
                    loop.call_soon_threadsafe(functools.partial(
                        self.sinks.emit, EventKind.WARNING, message=warning))
        return key, warning

    def _after_commit(self, result: tuple[R, str], step: bool) -> R:
        # Snapshots report from their own thread (_snapshot_job), never through here.
        record, key = result
        self.sinks.emit(EventKind.RECORD_JOURNALED, record=record)
        self.sinks.emit(EventKind.CHECKPOINT_SAVED, seq=record.seq, key=key)
        if step or record.cost is not None:
            t = self.live.totals
            self.sinks.emit(EventKind.COST_UPDATED, usd=t.usd, tokens=t.tokens, steps=t.steps)
        return record

    async def commit(self, record: R, *, usd: Decimal = Decimal(0),
                     tokens: int = 0, step: bool = False) -> R:
        """Append ``record`` (its seq, writer, time, cost and totals are set here); durable on return."""
        if self.store.backend.io_inline:
            result = self._append_locked(record, usd, tokens, step)
        elif self._grouping:
            done: Future[tuple[Any, str]] = Future()
            with self._queue_lock:
                self._queue.append(_Entry(record, usd, tokens, step, done))
            self._write_pool.submit(self._flush)
            result = await asyncio.wrap_future(done)
        else:
            loop = asyncio.get_running_loop()
            result = await loop.run_in_executor(
                self._write_pool, self._append_locked, record, usd, tokens, step)
        return self._after_commit(result, step)

    def commit_now(self, record: R) -> R:
        """Synchronous commit for ctx.now()/uuid()/patched(): durable before they return."""
        return self._after_commit(self._append_locked(record, Decimal(0), 0, False), False)

    async def final_snapshot(self) -> None:
        """A snapshot of everything journaled, after any snapshot still being written."""
        with self.lock:
            upto = self.live.loaded.next_seq - 1
            totals = self.live.totals
        fut = self._snap_pool.submit(self._snapshot_job, upto, totals)
        await asyncio.wrap_future(fut)
