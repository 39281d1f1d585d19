"""What a storage backend must do: a few conditional object operations and a journal.

A backend knows bytes and keys, nothing of records or runs: sealing, record
formats and snapshots live one layer up (:mod:`durablerun._private.storage.journal`),
the same for every backend. Keys are relative to the store's prefix and use
``/`` as separator.

Conditional semantics every backend provides (the contract tests check them
against all three):

* :meth:`Backend.create` writes a key only if it does not exist (first write
  wins); writing bytes identical to what is already there counts as success,
  so a retried request whose first try landed is not mistaken for a loss.
* :meth:`Backend.cas` replaces a key only if its current version tag (etag)
  is the one given (``None``: only if absent).
* :meth:`JournalBackend.append` writes sequence number ``seq`` exactly once;
  if another writer got there first it raises FencedError.
  :meth:`JournalBackend.append_group` does the same for several consecutive
  records in one write (group commit, where a write is a round trip: S3).
"""

from __future__ import annotations

import abc
import os
import signal
from collections.abc import Iterable, Sequence
from typing import Any

from durablerun._private.records import layout

#: A test hook, off unless set: ``<point>:<n>`` SIGKILLs this process the n-th time (from 1) a journal
#: append reaches ``<point>`` (:data:`CRASH_POINTS`). Read once, here; tests/sdk/test_write_crashes.py
#: arms it in the runner processes it starts (docs/faults.md).
CRASH_ENV = "DURABLERUN_CRASH_AT"
#: A journal append's points, in order: before the record is written; written but not yet durable (the
#: filesystem's fdatasync still to come; S3's PUT landed, its answer not yet seen by the backend); and
#: durable, the append about to return (the step's result not yet handed back).
CRASH_POINTS = ("before-write", "after-write", "after-answer")
#: The same three points of a group write (several records in one object, :meth:`JournalBackend.append_group`).
GROUP_CRASH_POINTS = ("group-before-write", "group-after-write", "group-after-answer")


def _crash_plan(value: str) -> tuple[str, int] | None:
    if not value:
        return None
    point, _, nth = value.partition(":")
    if point not in CRASH_POINTS + GROUP_CRASH_POINTS or not nth.isdigit() or int(nth) < 1:
        raise ValueError(f"{CRASH_ENV}={value!r}: expected <point>:<n>, point one of "
                         f"{', '.join(CRASH_POINTS + GROUP_CRASH_POINTS)}, "
                         "n from 1")
    return point, int(nth)


_CRASH_AT = _crash_plan(os.environ.get(CRASH_ENV, ""))
_crash_passes = 0


def crash_point(point: str) -> None:
    """Where a journal append may be killed (the hook above); unset, this returns at once."""
    global _crash_passes
    if _CRASH_AT is None or _CRASH_AT[0] != point:
        return
    _crash_passes += 1
    if _crash_passes == _CRASH_AT[1]:
        os.kill(os.getpid(), signal.SIGKILL)


class JournalBackend(abc.ABC):
    """The append-only journal of one run: sealed records by sequence number."""

    #: True when :meth:`append_group` writes its records in one request (the writer then groups the
    #: records of steps that finish while a write is in flight); False: it is one append per record.
    groups: bool = False

    @abc.abstractmethod
    def read(self, from_seq: int, *, repair: bool = False) -> list[tuple[int, bytes]]:
        """Records with ``seq >= from_seq`` in order, as stored (sealed bytes).

        ``repair=True`` is for the writer about to append: a torn tail (a
        record a crash cut short, detectable only where appends are not
        atomic) is removed. Readers never repair; they just stop before it.
        """

    def read_range(self, from_seq: int, to_seq: int) -> list[tuple[int, bytes]]:
        """Records with ``from_seq <= seq < to_seq`` in order: one page of a long journal (the run browser).

        A backend overrides this to read only the page, so it costs O(page), not O(journal).
        """
        return [(seq, data) for seq, data in self.read(from_seq) if seq < to_seq]

    def count(self, at_least: int = 0) -> int:
        """How many records the journal holds (its next sequence number), without reading them all;
        ``at_least``: a count known to be reached (a snapshot's), where a backend may start looking."""
        return len(self.read(0))

    @abc.abstractmethod
    def append(self, seq: int, data: bytes) -> str:
        """Write record ``seq``; return the key (or key#seq) it was written to.

        Durable when it returns. Raises FencedError when ``seq`` is taken.
        """

    def append_group(self, first: int, records: Sequence[bytes]) -> list[str]:
        """Write records ``first``, ``first + 1``, ...; return where each went.

        Durable when it returns. Raises FencedError when ``first`` is taken. This default is one
        append each, in order (a crash may leave a prefix of them, as separate appends would);
        a backend with :attr:`groups` overrides it to write them in one request.
        """
        return [self.append(first + i, data) for i, data in enumerate(records)]

    @abc.abstractmethod
    def truncate(self, from_seq: int) -> int:
        """Drop the records from ``from_seq`` on (``durablerun rerun``); return how many were dropped.

        The last first, so an interruption leaves a shorter prefix of the same journal, never a gap.
        Only for a caller holding the run (its owner record): an appending writer would race it.
        """

    def location(self, seq: int) -> str:
        """Where record ``seq`` is stored, relative to the run's root (for references)."""
        return layout.journal_key(seq)

    def close(self) -> None:  # noqa: B027 - optional hook
        """Release files and locks."""


class Backend(abc.ABC):
    """One store: a backend plus a prefix."""

    #: True when calls are local and fast enough to make on the event loop.
    io_inline: bool = True

    @abc.abstractmethod
    def describe(self) -> dict[str, Any]:
        """Diagnostics: kind, location, options (never credentials)."""

    @abc.abstractmethod
    def check(self, under: str = "") -> None:
        """Raise StoreNotFoundError / StoreAccessError when unusable for the keys under ``under``."""

    @abc.abstractmethod
    def get(self, key: str) -> bytes | None: ...

    @abc.abstractmethod
    def get_versioned(self, key: str) -> tuple[bytes, str] | None:
        """The object and its version tag (etag), or None."""

    def get_many(self, keys: Sequence[str]) -> list[bytes | None]:
        return [self.get(k) for k in keys]

    @abc.abstractmethod
    def create(self, key: str, data: bytes) -> bool:
        """Write if absent. True if this write won (or found identical bytes)."""

    @abc.abstractmethod
    def put(self, key: str, data: bytes) -> None:
        """Unconditional, atomic replace."""

    @abc.abstractmethod
    def cas(self, key: str, data: bytes, *, etag: str | None) -> str | None:
        """Replace if the current etag is ``etag`` (None: if absent).

        Returns the new etag, or None when the condition failed.
        """

    @abc.abstractmethod
    def list_keys(self, prefix: str) -> list[str]:
        """Keys under ``prefix`` (a folder ending in '/'), sorted."""

    @abc.abstractmethod
    def delete(self, keys: Iterable[str]) -> None: ...

    @abc.abstractmethod
    def delete_prefix(self, prefix: str) -> int:
        """Delete everything under ``prefix``; return how many objects."""

    @abc.abstractmethod
    def journal(self, root: str) -> JournalBackend:
        """The journal of the run rooted at ``root`` (ends in '/')."""

    def close(self) -> None:  # noqa: B027 - optional hook
        pass
