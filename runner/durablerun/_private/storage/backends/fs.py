"""Filesystem backend (``file:///path``): the SDK's embedded default.

It is one module of over 400 lines because it is one backend, and the
durability rules below cover every object it writes; split, they would be
stated in two places.

Durability, object by object:

* Objects (manifest, events, blobs, chunks) are written to a temp file,
  fsynced, then ``link``-ed into place (fails if the name exists: first write
  wins) or ``rename``-d over (replace), and the directory is fsynced.
* The journal is a series of append-only *segments*
  (``journal/<start>.log``, :data:`~durablerun._private.records.layout.SEGMENT_RECORDS`
  records each), one sealed record per line. An append takes the journal's
  writer lock (``journal/.lock``, ``flock``), checks nothing has been written
  at the offset where this writer's next record goes (the position check: if
  another writer appended, this one is fenced), writes the line with one
  ``pwrite`` and ``fdatasync``s it before returning. That is one small
  sequential write and one data sync per step — far cheaper than creating a
  file per step.
* The writer keeps the segment zero-filled ahead of its records
  (:data:`PREALLOCATE_BYTES` at a time), so the record's ``fdatasync`` finds
  the file's size and blocks already on disk and flushes data only: growing
  the file on every append would make every sync commit the file system's
  metadata journal too (the benchmark, bench/, measured an append +
  ``fdatasync`` ~1.4x slower than overwriting zeros + ``fdatasync``). Records
  end at the first NUL byte where a record would start; a writer that
  closes trims the zeros it did not use.
* A crash can cut the last line short (a torn tail), or, within the zeros,
  leave parts of it: an *incomplete* record, with no newline or with zeros
  inside it (a record never contains a NUL byte: JSON escapes it). The next
  writer discards everything after the last good record under the lock
  before appending. A *complete* record that fails its checksum, the last one
  included, was damaged after it was written: a loud CorruptionError, nothing
  discarded (a read from ``seq`` on counts the records before it without
  checking them: a snapshot holds their verified copies).

The lock is ``flock``: every attempt of a run must see the same filesystem
with working ``flock`` (a local disk, or a shared volume that supports it).
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import hashlib
import os
import shutil
import time
import uuid
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

from durablerun import errors
from durablerun._private.records import codec, layout
from durablerun._private.storage.backends import base

LOCK_TIMEOUT_S = 60.0
#: The journal writer extends its segment with this many zero bytes at a time.
PREALLOCATE_BYTES = 1 << 20


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        written = os.write(fd, view)
        view = view[written:]


def _pwrite_all(fd: int, data: bytes, offset: int) -> None:
    view = memoryview(data)
    while view:
        written = os.pwrite(fd, view, offset)
        view = view[written:]
        offset += written


def _etag(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()[:32]


def _take_lock(fd: int, what: str) -> None:
    """``flock`` ``fd`` exclusively: one system call when it is free (every append), else wait, with a deadline."""
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        return
    except BlockingIOError:
        pass
    deadline = time.monotonic() + LOCK_TIMEOUT_S
    delay = 0.0005
    while True:
        time.sleep(delay)
        delay = min(delay * 2, 0.05)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return
        except BlockingIOError:
            if time.monotonic() > deadline:
                raise errors.StoreUnavailableError(
                    f"could not take the lock within {LOCK_TIMEOUT_S:.0f}s: another process "
                    "holds it (a paused or hung writer?)",
                    lock=what,
                ) from None


@contextlib.contextmanager
def _flock(fd: int, what: str) -> Iterator[None]:
    _take_lock(fd, what)
    try:
        yield
    finally:
        fcntl.flock(fd, fcntl.LOCK_UN)


#: What a segment holds where no record starts yet: its end, or the zeros a writer set aside.
_NO_RECORD = (b"", b"\0")


class FsJournal(base.JournalBackend):
    def __init__(self, directory: Path) -> None:
        self._dir = directory
        self._dir_s = str(directory)
        self._lock_s = os.path.join(self._dir_s, ".lock")
        self._lock_fd: int | None = None
        self._seg_fd: int | None = None
        self._seg_start: int | None = None
        self._seg_path = ""  # the open segment's path (for keys and errors)
        self._expected_size = 0  # where this writer's next record goes in the open segment
        self._allocated = 0  # bytes the open segment holds: records, then zeros
        self._next_seq: int | None = None
        self._broken: str | None = None

    # --- reading ---------------------------------------------------------------
    def _segments(self) -> list[int]:
        try:
            names = os.listdir(self._dir)
        except FileNotFoundError:
            return []
        starts = []
        for name in names:
            if name.endswith(".log") and name[:-4].isdigit() and len(name) == layout.SEQ_DIGITS + 4:
                starts.append(int(name[:-4]))
        starts.sort()
        for i, start in enumerate(starts):
            if start != i * layout.SEGMENT_RECORDS:
                raise errors.CorruptionError(
                    "journal segments are not contiguous (a segment is missing or misnamed)",
                    directory=str(self._dir),
                    segments=[layout.segment_name(s) for s in starts],
                )
        return starts

    def _scan(
        self, start: int, *, last: bool, from_seq: int, until: int | None = None
    ) -> tuple[list[tuple[int, bytes]], int, int]:
        """Records of one segment with seq >= from_seq, count, and the good size. With ``until``, the scan
        stops before record ``until`` (a page): what follows it is neither checked nor counted."""
        path = self._dir / layout.segment_name(start)
        out: list[tuple[int, bytes]] = []
        good = 0
        count = 0
        with open(path, "rb") as f:
            data = f.read()
        pos = 0
        size = len(data)
        while pos < size:
            if until is not None and start + count >= until:
                return out, count, good
            if data[pos] == 0:
                # NUL where a record would start: the zero-filled space ahead of the
                # records (a torn write may have left bytes further on; a writer
                # discards them before it appends).
                break
            nl = data.find(b"\n", pos)
            if nl < 0:
                # A partial line: a torn append (or one in flight right now).
                if not last:
                    raise errors.CorruptionError(
                        "truncated record inside a full journal segment",
                        segment=str(path),
                        offset=pos,
                    )
                break
            line = data[pos:nl]
            # Records before ``from_seq`` (a snapshot holds their verified copies, or a
            # later continuation made them history) are only counted, not checked again.
            if start + count >= from_seq and not codec.is_sealed_ok(line):
                if (last and b"\0" in line and data.find(b"\n", nl + 1) < 0
                        and not data[nl + 1 :].strip(b"\0")):
                    # The final line is bad, nothing follows it and it still holds zeros
                    # the writer set aside: an incomplete record (a torn write whose
                    # newline landed before the rest of it).
                    break
                # A complete record (no zeros in it) that fails its checksum was damaged
                # after it was written, even the last one: never discard it as torn.
                where = "the last record" if data.find(b"\n", nl + 1) < 0 else "a record"
                raise errors.CorruptionError(
                    f"journal record failed its checksum ({where} of the segment, complete, so "
                    "not a torn write: the file was damaged or modified; nothing was changed)",
                    segment=str(path),
                    seq=start + count,
                    offset=pos,
                )
            seq = start + count
            if seq >= from_seq:
                out.append((seq, line))
            count += 1
            pos = nl + 1
            good = pos
            if count > layout.SEGMENT_RECORDS:
                raise errors.CorruptionError("journal segment holds too many records",
                                             segment=str(path))
        if not last and count != layout.SEGMENT_RECORDS:
            raise errors.CorruptionError(
                f"journal segment holds {count} records, expected {layout.SEGMENT_RECORDS}",
                segment=str(path),
            )
        if not last and data[good:].strip(b"\0"):
            raise errors.CorruptionError("bytes after the last record of a full journal segment",
                                         segment=str(path), offset=good)
        return out, count, good

    def read(self, from_seq: int, *, repair: bool = False) -> list[tuple[int, bytes]]:
        if repair:
            return self._open_writer(from_seq)
        starts = self._segments()
        out: list[tuple[int, bytes]] = []
        for i, start in enumerate(starts):
            if start + layout.SEGMENT_RECORDS <= from_seq:
                continue
            records, _, _ = self._scan(start, last=i == len(starts) - 1, from_seq=from_seq)
            out.extend(records)
        return out

    def read_range(self, from_seq: int, to_seq: int) -> list[tuple[int, bytes]]:
        # Only the segments the range falls in: a page reads one or two files of SEGMENT_RECORDS records.
        starts = self._segments()
        out: list[tuple[int, bytes]] = []
        for i, start in enumerate(starts):
            if start + layout.SEGMENT_RECORDS <= from_seq or start >= to_seq:
                continue
            records, _, _ = self._scan(start, last=i == len(starts) - 1, from_seq=from_seq, until=to_seq)
            out.extend(records)
        return out

    def count(self, at_least: int = 0) -> int:
        # Full segments hold SEGMENT_RECORDS each: only the last one is counted (not checked: it reads nothing).
        starts = self._segments()
        if not starts:
            return 0
        _, count, _ = self._scan(starts[-1], last=True, from_seq=starts[-1] + layout.SEGMENT_RECORDS)
        return starts[-1] + count

    # --- writing ---------------------------------------------------------------
    def _lock(self) -> int:
        if self._lock_fd is None:
            self._dir.mkdir(parents=True, exist_ok=True)
            self._lock_fd = os.open(self._dir / ".lock", os.O_RDWR | os.O_CREAT, 0o644)
        return self._lock_fd

    def _open_writer(self, from_seq: int) -> list[tuple[int, bytes]]:
        lock_fd = self._lock()
        with _flock(lock_fd, self._lock_s):
            starts = self._segments()
            out: list[tuple[int, bytes]] = []
            next_seq = 0
            for i, start in enumerate(starts):
                is_last = i == len(starts) - 1
                if start + layout.SEGMENT_RECORDS <= from_seq and not is_last:
                    next_seq = start + layout.SEGMENT_RECORDS
                    continue
                records, count, good = self._scan(start, last=is_last, from_seq=from_seq)
                out.extend(records)
                next_seq = start + count
                if is_last:
                    path = self._dir / layout.segment_name(start)
                    fd = os.open(path, os.O_RDWR)
                    size = os.fstat(fd).st_size
                    if size != good and os.pread(fd, size - good, good).strip(b"\0"):
                        # Discard the torn tail before anything is appended after it
                        # (zeros alone are space a writer set aside: keep them).
                        os.ftruncate(fd, good)
                        os.fdatasync(fd)
                        size = good
                    self._close_segment()
                    self._set_segment(fd, start, good, size)
            self._next_seq = next_seq
            return out

    def _set_segment(self, fd: int, start: int, records_end: int, size: int) -> None:
        """Make ``fd`` (segment ``start``) the one appended to: its records end at ``records_end``."""
        self._seg_fd, self._seg_start, self._expected_size, self._allocated = fd, start, records_end, size
        self._seg_path = os.path.join(self._dir_s, layout.segment_name(start))

    def _close_segment(self) -> None:
        if self._seg_fd is not None:
            os.close(self._seg_fd)
        self._seg_fd = None
        self._seg_start = None

    def _trim(self) -> None:
        """Cut the unused zeros off the open segment. Call under the lock.

        Only when nothing was written where this writer's next record would go:
        a newer writer's records are never cut.
        """
        fd = self._seg_fd
        if fd is None or self._allocated <= self._expected_size:
            return
        if os.pread(fd, 1, self._expected_size) in (b"", b"\0"):
            os.ftruncate(fd, self._expected_size)
            self._allocated = self._expected_size

    def append(self, seq: int, data: bytes) -> str:
        """Record ``seq``: under the writer lock, check its place is free, one ``pwrite``, one ``fdatasync``.

        The lock is taken for each append, not held across them: a writer paused between two steps (the
        usual way a lease lapses) must never keep a newer writer out, and flock cannot be taken from a
        process that is alive. What holding it would save (two ``flock`` calls and the one-byte ``pread``
        of the position check) measured ~2.5 µs of CPU per append, against a ~100 µs ``fdatasync``.
        """
        if self._broken:
            raise errors.StoreUnavailableError(
                f"an earlier journal write failed ({self._broken}); this writer stops and the "
                "next attempt repairs the journal",
                directory=str(self._dir),
            )
        if self._next_seq is None:
            self._open_writer(0)
        if seq != self._next_seq:
            raise errors.FencedError(
                f"position check failed: asked to write {seq}, the journal's next position "
                f"is {self._next_seq}",
                directory=str(self._dir),
            )
        line = data + b"\n"
        lock_fd = self._lock()
        _take_lock(lock_fd, self._lock_s)
        try:
            start = seq - seq % layout.SEGMENT_RECORDS
            if self._seg_start != start:
                self._roll_over(start)
            fd, offset = self._seg_fd, self._expected_size
            assert fd is not None
            # The fence: a newer writer that appended since this one's last append (each under the
            # lock) left a record where this one's next goes.
            if os.pread(fd, 1, offset) not in _NO_RECORD:
                raise errors.FencedError(
                    "journal position already written by another writer (the segment holds a "
                    "record where this writer's next one goes)",
                    segment=self._seg_path,
                    seq=seq,
                )
            end = offset + len(line)
            try:
                if end > self._allocated:
                    # Zero-fill ahead, so the syncs of the next records flush data only.
                    grow = end - self._allocated + PREALLOCATE_BYTES
                    _pwrite_all(fd, bytes(grow), self._allocated)
                    self._allocated += grow
                base.crash_point("before-write")
                written = os.pwrite(fd, line, offset)
                if written != len(line):
                    _pwrite_all(fd, line[written:], offset + written)
                base.crash_point("after-write")
                os.fdatasync(fd)
            except OSError as e:
                self._broken = f"{e.strerror or e}"
                raise errors.StoreUnavailableError(
                    f"journal append failed: {e}", segment=self._seg_path, seq=seq
                ) from e
        finally:
            fcntl.flock(lock_fd, fcntl.LOCK_UN)
        self._expected_size = end
        self._next_seq = seq + 1
        base.crash_point("after-answer")
        return f"{self._seg_path}#{seq}"

    def _roll_over(self, start: int) -> None:
        """Move on to the segment starting at record ``start``; it must not hold a record yet. Under the lock."""
        path = os.path.join(self._dir_s, layout.segment_name(start))
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        size = os.fstat(fd).st_size
        if size and os.pread(fd, size, 0).strip(b"\0"):
            os.close(fd)
            raise errors.FencedError("journal segment already written by another writer", segment=path)
        _fsync_dir(self._dir)
        with contextlib.suppress(OSError):
            self._trim()  # the full segment's spare zeros (harmless if they stay)
        self._close_segment()
        self._set_segment(fd, start, 0, size)

    def truncate(self, from_seq: int) -> int:
        lock_fd = self._lock()
        with _flock(lock_fd, self._lock_s):
            self._close_segment()
            self._next_seq = None  # an append after this reopens the journal
            starts = self._segments()
            dropped = 0
            for i in range(len(starts) - 1, -1, -1):  # the last segment first: a prefix stays at every moment
                start = starts[i]
                _, count, _ = self._scan(start, last=i == len(starts) - 1, from_seq=start)
                path = self._dir / layout.segment_name(start)
                if start >= from_seq:
                    os.unlink(path)
                    dropped += count
                    continue
                if start + count > from_seq:
                    # Cut the segment at the first dropped record: the end of the line before it.
                    data = path.read_bytes()
                    offset = 0
                    for _ in range(from_seq - start):
                        offset = data.index(b"\n", offset) + 1
                    fd = os.open(path, os.O_RDWR)
                    try:
                        os.ftruncate(fd, offset)
                        os.fdatasync(fd)
                    finally:
                        os.close(fd)
                    dropped += start + count - from_seq
                break
            _fsync_dir(self._dir)
        return dropped

    def location(self, seq: int) -> str:
        return f"{layout.JOURNAL_DIR}{layout.segment_name(seq - seq % layout.SEGMENT_RECORDS)}#{seq}"

    def close(self) -> None:
        if self._seg_fd is not None and self._lock_fd is not None and self._allocated > self._expected_size:
            # Trim the spare zeros if the lock is free right now (never wait for it here).
            with contextlib.suppress(OSError):
                fcntl.flock(self._lock_fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                try:
                    self._trim()
                finally:
                    fcntl.flock(self._lock_fd, fcntl.LOCK_UN)
        self._close_segment()
        if self._lock_fd is not None:
            os.close(self._lock_fd)
            self._lock_fd = None


class FsBackend(base.Backend):
    io_inline = True

    def __init__(self, root: str | os.PathLike[str]) -> None:
        self.root = Path(root).absolute()

    def describe(self) -> dict[str, Any]:
        return {"kind": "filesystem", "uri": f"file://{self.root}", "root": str(self.root)}

    def check(self, under: str = "") -> None:
        if self.root.is_dir():
            return
        if self.root.exists():
            raise errors.StoreNotFoundError(
                "the store path exists but is not a directory", path=str(self.root)
            )
        if not self.root.parent.is_dir():
            raise errors.StoreNotFoundError(
                "the store directory does not exist and neither does its parent: create it or "
                "fix the store URI (file:///absolute/path)",
                path=str(self.root),
            )
        try:
            self.root.mkdir(exist_ok=True)
        except OSError as e:
            raise errors.StoreAccessError(
                f"cannot create the store directory: {e}", path=str(self.root)
            ) from e

    def _path(self, key: str) -> Path:
        if key.startswith("/") or ".." in key.split("/"):
            raise errors.ConfigError(f"invalid store key {key!r}")
        return self.root / key

    def get(self, key: str) -> bytes | None:
        try:
            return self._path(key).read_bytes()
        except FileNotFoundError:
            return None
        except IsADirectoryError:
            return None

    def get_versioned(self, key: str) -> tuple[bytes, str] | None:
        data = self.get(key)
        return None if data is None else (data, _etag(data))

    def _temp(self, path: Path, data: bytes) -> Path:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.parent / f".tmp-{path.name}-{uuid.uuid4().hex}"
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
        try:
            _write_all(fd, data)
            os.fsync(fd)
        finally:
            os.close(fd)
        return tmp

    def create(self, key: str, data: bytes) -> bool:
        path = self._path(key)
        if path.exists():
            return path.read_bytes() == data
        tmp = self._temp(path, data)
        try:
            os.link(tmp, path)
            won = True
        except FileExistsError:
            won = path.read_bytes() == data
        finally:
            os.unlink(tmp)
        _fsync_dir(path.parent)
        return won

    def put(self, key: str, data: bytes) -> None:
        path = self._path(key)
        tmp = self._temp(path, data)
        os.replace(tmp, path)
        _fsync_dir(path.parent)

    def cas(self, key: str, data: bytes, *, etag: str | None) -> str | None:
        path = self._path(key)
        path.parent.mkdir(parents=True, exist_ok=True)
        lock_fd = os.open(path.parent / f".{path.name}.lock", os.O_RDWR | os.O_CREAT, 0o644)
        try:
            with _flock(lock_fd, str(path) + ".lock"):
                current = self.get_versioned(key)
                if (None if current is None else current[1]) != etag:
                    return None
                self.put(key, data)
                return _etag(data)
        finally:
            os.close(lock_fd)

    def list_keys(self, prefix: str) -> list[str]:
        base_dir = self._path(prefix.rstrip("/")) if prefix.strip("/") else self.root
        out = []
        for dirpath, _dirnames, filenames in os.walk(base_dir):
            for name in filenames:
                if name.startswith("."):
                    continue
                rel = os.path.relpath(os.path.join(dirpath, name), self.root)
                out.append(rel.replace(os.sep, "/"))
        return sorted(k for k in out if k.startswith(prefix))

    def delete(self, keys: Iterable[str]) -> None:
        for key in keys:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(self._path(key))

    def delete_prefix(self, prefix: str) -> int:
        target = self._path(prefix.rstrip("/"))
        if not target.exists():
            return 0
        count = sum(len(files) for _, _, files in os.walk(target))
        try:
            shutil.rmtree(target)
        except OSError as e:
            if e.errno != errno.ENOENT:
                raise
        return count

    def journal(self, root: str) -> base.JournalBackend:
        return FsJournal(self._path(root.rstrip("/")) / "journal")
