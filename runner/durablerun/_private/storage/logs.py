"""An attempt's stdout and stderr in the run's store: ``logs/<attempt>-<uid>/<part>.log.gz`` (layout.py).

:class:`AttemptLog` gathers what the runner writes, whole lines at a time so that stdout and stderr
never interleave inside a line, and stores it as numbered gzip parts, each written once with
``create``: a part cannot be overwritten, by a retry or by anyone else. It keeps at most
``layout.LOG_ATTEMPT_BYTES`` of text; what comes after is counted, and the last part says what was
dropped. The pod's log shipper (:mod:`durablerun._private.pod.logship`) drives it; the readers
below serve ``durablerun logs`` and ``kubectl durablerun logs --attempt``.
"""

from __future__ import annotations

import gzip
import threading

from durablerun._private.records import layout
from durablerun._private.storage.backends import base

#: A line longer than this is stored in pieces of this size (a runaway line must not hold the rest back).
LINE_PIECE = 64 * 1024


class PartTaken(Exception):
    """A part of this attempt's logs holds other bytes: someone else writes them (nothing more is stored)."""


class AttemptLog:
    """The logs of one attempt on their way to the store; thread-safe (one feeder, one shipper).

    Text is accepted before the store is known (:meth:`attach`), within the same bound.
    """

    def __init__(self, *, limit: int = layout.LOG_ATTEMPT_BYTES) -> None:
        self.limit = limit
        self.accepted = 0
        self.dropped_bytes = 0
        self.dropped_lines = 0
        self._partial: dict[int, bytearray] = {}
        self._pending = bytearray()
        self._lock = threading.Lock()
        self._backend: base.Backend | None = None
        self._root = ""
        self._root = ""
        self._attempt: tuple[int, str] = (0, "")
        self._part = 0

    def attach(self, backend: base.Backend, run: layout.RunRef, attempt: int, writer: str) -> None:
        """Where the parts go: the run's root in ``backend``, as attempt ``attempt`` of DurableRun ``writer``."""
        with self._lock:
            self._backend, self._root, self._attempt = backend, f"{run.path}/", (attempt, writer)

    @property
    def attached(self) -> bool:
        return self._backend is not None

    def feed(self, stream: int, data: bytes) -> None:
        """Bytes the runner wrote to ``stream`` (1: stdout, 2: stderr)."""
        with self._lock:
            partial = self._partial.setdefault(stream, bytearray())
            partial += data
            end = partial.rfind(b"\n") + 1
            if end == 0 and len(partial) >= LINE_PIECE:
                end = LINE_PIECE
            if end:
                self._accept(bytes(partial[:end]))
                del partial[:end]

    def pending(self) -> int:
        """Bytes of whole lines waiting to be stored."""
        return len(self._pending)

    def close(self) -> None:
        """The runner is gone: its unfinished lines, and what was dropped, join what is left to store."""
        with self._lock:
            for partial in self._partial.values():
                if partial:
                    self._accept(bytes(partial) + b"\n")
            self._partial.clear()
            if self.dropped_bytes:
                self._pending += (f"[durablerun: {self.dropped_bytes} more bytes in {self.dropped_lines} lines "
                                  f"were not kept: an attempt keeps {self.limit} bytes of logs]\n").encode()
                self.dropped_bytes = self.dropped_lines = 0

    def ship(self) -> int:
        """Store what is pending as the next part; return its size (0: nothing to store, or no store yet).

        Raises what the backend raises (the text stays pending, to try again), and PartTaken.
        """
        with self._lock:
            if self._backend is None or not self._pending:
                return 0
            data, backend = bytes(self._pending), self._backend
            key = self._root + layout.log_part_key(*self._attempt, self._part)
        # Outside the lock: a slow store must not stop the feeder. mtime=0: a retried part is the same bytes.
        if not backend.create(key, gzip.compress(data, mtime=0)):
            raise PartTaken(f"{key} holds other logs")
        with self._lock:
            del self._pending[:len(data)]
            self._part += 1
        return len(data)

    def _accept(self, text: bytes) -> None:
        if self.accepted + len(text) > self.limit:
            self.dropped_bytes += len(text)
            self.dropped_lines += text.count(b"\n")
            return
        self.accepted += len(text)
        self._pending += text


def _folders(backend: base.Backend, run: layout.RunRef) -> dict[tuple[int, str], list[str]]:
    root = f"{run.path}/"
    found: dict[tuple[int, str], list[str]] = {}
    for key in backend.list_keys(root + layout.LOGS_DIR):
        folder = layout.log_dir_of_key(key[len(root):])
        if folder is not None:
            found.setdefault(folder, []).append(key)
    return found


def archived_attempts(backend: base.Backend, run: layout.RunRef) -> list[int]:
    """The attempts whose logs the store keeps, in order."""
    return sorted({attempt for attempt, _ in _folders(backend, run)})


def read_attempt(backend: base.Backend, run: layout.RunRef, attempt: int) -> bytes | None:
    """Attempt ``attempt``'s stored logs, or None when the store has none of it. A run id's journal continued
    by several DurableRuns may have an attempt ``attempt`` of each: each comes under a line naming its uid."""
    folders = sorted((writer, keys) for (n, writer), keys in _folders(backend, run).items() if n == attempt)
    if not folders:
        return None
    out = []
    for writer, keys in folders:
        if len(folders) > 1:
            out.append(b"==> attempt %d of DurableRun uid %s <==\n" % (attempt, writer.encode()))
        out.extend(gzip.decompress(p) for p in backend.get_many(sorted(keys)) if p is not None)
    return b"".join(out)
