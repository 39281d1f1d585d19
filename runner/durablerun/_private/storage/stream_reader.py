"""Reading a run's output stream: from an offset, once or following it live, with each chunk's standing.

The journal decides which chunks count. A chunk names the step try that wrote it (attempt, position,
try); the step's journal record names the try that was journaled (its writer ``w`` and ``attempts``).
A chunk is

* ``final`` when its try is the journaled one;
* ``superseded`` when the step was journaled by another try, or (not yet journaled) the same attempt
  has since started a later try, or the run has finished without journaling the step;
* ``pending`` while its step is not journaled: its try may still be the one that counts.

A plain reader gets every chunk in offset order with its standing at the time it read it (a pending
chunk may be superseded later). A ``final`` reader gets only final chunks, in offset order, and holds
everything from the first pending chunk on until that chunk is decided: it never shows what a later
try replaces. Offsets are the stream's own, the same in both modes, so a reader that resumes at
``next_offset`` sees no gap and no duplicate. This module is the one reader: the CLI and the kubectl
plugin use it, and so can a browser view or an SSE endpoint (an offset is a ``Last-Event-ID``).
"""

from __future__ import annotations

import enum
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass

from durablerun._private.records.model import StepRecord
from durablerun._private.storage.journal import RunStore
from durablerun._private.storage.streams import READ_WINDOW, Chunk, StreamObjects
from durablerun.api import Outcome

#: Outcomes after which no attempt writes again (until a person retries the run).
FINISHED = frozenset({Outcome.COMPLETED, Outcome.FAILED, Outcome.USAGE_ERROR, Outcome.ABORTED})
#: A follower's polls: the first wait after nothing new, doubled up to the longest.
POLL_FIRST_SECONDS = 0.05
POLL_MAX_SECONDS = 1.0


class Standing(enum.StrEnum):
    FINAL = "final"
    SUPERSEDED = "superseded"
    PENDING = "pending"


@dataclass(frozen=True)
class Read:
    """A chunk as a reader sees it."""

    chunk: Chunk
    standing: Standing


@dataclass(frozen=True)
class Advance:
    """One poll of a follower: the chunks read, whether any came (``fresh``), whether a whole window came
    (``behind``: read on at once), and whether the stream is over (``done``: the run finished, all read)."""

    reads: list[Read]
    fresh: bool
    behind: bool
    done: bool


def next_wait(wait: float, step: Advance) -> float:
    """A follower's next pause after ``step``: short again once something came, else doubled up to the
    longest."""
    return POLL_FIRST_SECONDS if step.fresh else min(wait * 2, POLL_MAX_SECONDS)


class StreamReader:
    """Stream ``name`` of the run in ``store``, read from offset ``start`` on."""

    def __init__(self, store: RunStore, name: str, *, start: int = 0, final: bool = False,
                 window: int = READ_WINDOW) -> None:
        self._store = store
        #: Chunks fetched at most per poll: what one reader holds in memory at once.
        self._window = window
        self._objects = StreamObjects(store.backend, store.ref)
        self.name = name
        self.final = final
        #: The offset the next read goes on from: resume here for no gap and no duplicate.
        self.next_offset = start
        self._fetched = start
        self._held: list[Chunk] = []
        #: Whether the last poll may have left chunks in the store: it filled its window, or (a final reader
        #: whose window was all undecided) it had no room to fetch and has room again.
        self._more = False
        #: Whether the last poll fetched with room to spare: nothing was left in the store then.
        self._at_end = False
        #: The journaled try of each step position: (attempt, tries) of its last step record.
        self._journaled: dict[str, tuple[str, int]] = {}
        self._journal_read = 0
        #: The last try seen writing at each position (attempt, tries).
        self._latest: dict[str, tuple[str, int]] = {}
        self._latest_at: dict[str, int] = {}
        self.finished = False

    def poll(self) -> list[Read]:
        """What is readable now, from :attr:`next_offset` on (a window at a time: call again while it
        returns a full one)."""
        # A final reader holds undecided chunks; it fetches no more than a window of them, so a long step's
        # output waits in the store, not in this reader's memory.
        room = self._window - len(self._held) if self.final else self._window
        fresh = self._objects.read(self.name, self._fetched, room) if room > 0 else []
        filled = room > 0 and len(fresh) >= room
        self._at_end = room > 0 and not filled
        self._fetched += len(fresh)
        self._held += fresh
        for chunk in fresh:
            if chunk.offset >= self._latest_at.get(chunk.pos, -1):  # a read again (seek) knows no less
                self._latest[chunk.pos], self._latest_at[chunk.pos] = (chunk.attempt, chunk.tries), chunk.offset
        if any(c.pos not in self._journaled for c in self._held):
            self._read_journal()
        out: list[Read] = []
        while self._held:
            standing = self._standing(self._held[0])
            if self.final and standing == Standing.PENDING:
                break
            chunk = self._held.pop(0)
            self.next_offset = chunk.offset + 1
            if not self.final or standing == Standing.FINAL:
                out.append(Read(chunk, standing))
        self._more = filled or (room <= 0 and not self._held)
        return out

    def seek(self, start: int) -> None:
        """Read on from offset ``start`` (again: a page that shows pending chunks asks for them once more),
        keeping what the reader knows of the journal, so a poll reads only the records since its last."""
        self.next_offset = self._fetched = start
        self._held = []

    def read(self) -> Iterator[Read]:
        """Everything readable now, from :attr:`next_offset` on (a finished run's undecided chunks are
        superseded)."""
        self._run_finished()
        while True:
            yield from self.poll()
            if not self._more:
                return

    def follow(self, *, stop: Callable[[], bool] = lambda: False,
               sleep: Callable[[float], None] = time.sleep) -> Iterator[Read]:
        """Every chunk from :attr:`next_offset` on, as it is written; ends once the run has finished and the
        stream is drained (or ``stop`` says so). Polls back off while nothing new comes."""
        wait = POLL_FIRST_SECONDS
        while not stop():
            step = self.advance()
            yield from step.reads
            if step.behind:
                continue  # read on at once
            if step.done:
                return
            wait = next_wait(wait, step)
            sleep(wait)

    def advance(self) -> Advance:
        """One poll of a follower (:meth:`follow`'s loop, for a caller that waits its own way, e.g. on an
        event loop): what is readable now, and whether to read on at once, wait, or stop."""
        was_finished = self._run_finished()  # asked first: what it wrote before finishing is read below
        before = self._fetched
        reads = self.poll()
        fetched = self._fetched - before
        return Advance(reads, fresh=fetched > 0, behind=self._more,
                       done=was_finished and fetched == 0 and self._at_end and not self._held)

    def _run_finished(self) -> bool:
        if not self.finished:
            outcome = (self._store.read_status() or {}).get("outcome")
            self.finished = outcome in FINISHED
            if self.finished:
                self._read_journal()  # the last steps' records, before anything is called superseded
        return self.finished

    def _standing(self, chunk: Chunk) -> Standing:
        mine = (chunk.attempt, chunk.tries)
        journaled = self._journaled.get(chunk.pos)
        if journaled is not None:
            return Standing.FINAL if journaled == mine else Standing.SUPERSEDED
        latest = self._latest[chunk.pos]
        if self.finished or (latest[0] == chunk.attempt and latest[1] > chunk.tries):
            return Standing.SUPERSEDED
        # Another attempt writing this step now almost surely supersedes it; a final reader waits for the
        # journal to say so (a fenced attempt's write may still have landed first).
        if not self.final and latest != mine:
            return Standing.SUPERSEDED
        return Standing.PENDING

    def _read_journal(self) -> None:
        count = self._store.count()
        if count < self._journal_read:  # `durablerun rerun` cut the journal back: decide afresh
            self._journaled, self._journal_read = {}, 0
        for record in self._store.read_range(self._journal_read, count):
            if isinstance(record, StepRecord):
                self._journaled[record.pos] = (record.w or "", record.attempts)
        self._journal_read = count
