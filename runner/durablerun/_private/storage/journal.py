"""A run's objects in a store: manifest, journal records, snapshots, blobs, events, status.

It is one module of over 400 lines because it is one class, :class:`RunStore`,
whose reads and writes share the record format and the snapshot invariants
below; split, the two halves would drift apart.

This layer is the same for every backend. It seals and checks every object
(:mod:`~durablerun._private.records.codec`), owns the record format, and makes resume
cheap with *snapshots*:

* Every ``snapshot_every`` records the writer saves the records since the last
  snapshot as one immutable, content-addressed *chunk* and swaps the snapshot
  pointer (compare-and-swap, only ever forward) to the new chunk list.
* Chunks merge like a binary counter (the last two merge while the older is
  not bigger than the newer), so a pointer references at most
  ``log2(records / snapshot_every) + 1`` chunks: resuming 100,000 steps reads
  about a dozen objects instead of 100,000, and each record is rewritten only
  O(log n) times (no snapshot ever copies the whole history again and again).
* The journal stays the source of truth: if a chunk a pointer names is
  missing, the reader re-reads the pointer and, failing that, falls back to
  the whole journal (slower, same result). A checksum mismatch anywhere is a
  loud CorruptionError.

The records themselves (layout v1) are typed in :mod:`durablerun._private.records.model`,
one class per kind, which owns their format; tests/sdk/golden/ pins it.

Continuations bound what a resume reads. A resume starts at the run's last
``continue`` record: the snapshot pointer records where its chunks start
(``base``: the last continuation when it was saved, 0 without), so a
snapshot never covers an earlier generation, and a continuation in the
journal tail after the snapshot makes its chunks unnecessary (not read).
The engine saves a snapshot right at each continuation, so from then on
not even the earlier generation's journal tail is read.
Nothing is deleted: earlier generations' records and chunks stay in the
store (``RunStore.read_all`` and ``durablerun inspect --all`` read them).
"""

from __future__ import annotations

import re
import time
from dataclasses import dataclass
from typing import Any

from durablerun import errors
from durablerun._private.records import codec, layout
from durablerun._private.records.model import ContinueRecord, Record, Totals, count, decode_record
from durablerun._private.storage.backends import base
from durablerun.api import format_time


@dataclass
class Chunk:
    key: str
    first: int
    last: int

    @property
    def count(self) -> int:
        return self.last - self.first + 1

    def to_json(self) -> dict[str, Any]:
        return {"key": self.key, "first": self.first, "last": self.last}


class Loaded:
    """A run's journal as read at the start of an attempt.

    ``records`` starts at sequence number ``base``: 0, or the run's last
    ``ctx.continue_as_new`` record (what came before it is never read again).
    An attempt appends to ``records``; a continuation starts them again (:meth:`rebase`).
    """

    def __init__(self, records: list[Record], chunks: list[Chunk], snapshot_seq: int,
                 snapshot_etag: str | None, objects_read: int,
                 warnings: list[str] | None = None, base: int = 0) -> None:
        self._view: tuple[int, list[Record]] = (base, records)
        self.chunks = chunks
        #: Last seq covered by the snapshot pointer, -1 if none.
        self.snapshot_seq = snapshot_seq
        self.snapshot_etag = snapshot_etag
        self.objects_read = objects_read
        self.warnings = warnings if warnings is not None else []

    @property
    def records(self) -> list[Record]:
        return self._view[1]

    @property
    def base(self) -> int:
        """The sequence number of ``records[0]``."""
        return self._view[0]

    def view(self) -> tuple[int, list[Record]]:
        """``(base, records)`` as one consistent pair (for the snapshot thread)."""
        return self._view

    def rebase(self, record: Record) -> None:
        """Forget everything before continuation ``record``; it becomes ``records[0]``."""
        self._view = (record.seq, [record])

    @property
    def continuation(self) -> ContinueRecord | None:
        """The ``continue`` record the current generation started from, if any."""
        records = self.records
        return records[0] if records and isinstance(records[0], ContinueRecord) else None

    @property
    def next_seq(self) -> int:
        base, records = self._view
        return base + len(records)

    @property
    def totals(self) -> Totals:
        return self.records[-1].totals.copy() if self.records else Totals()


def _chunk_lines(body: bytes, where: str) -> list[bytes]:
    """The records of a chunk body (``[\n<record>,\n<record>\n]``), byte for byte."""
    if not (body.startswith(b"[\n") and body.endswith(b"\n]")):
        raise errors.CorruptionError("snapshot chunk is not in the expected format", key=where)
    inner = body[2:-2]
    if not inner:
        return []
    return inner.split(b",\n")


_CHUNK_KEY = re.compile(re.escape(layout.CHUNKS_DIR) + r"[0-9a-f]{64}\.json")


@dataclass(frozen=True)
class Pointer:
    """A snapshot pointer (``snapshot.json``): its chunks, the last seq they cover, the continuation they start
    at (``base``), and the run's totals, whether it had completed and when, as of that seq."""

    chunks: list[Chunk]
    seq: int
    base: int
    totals: Totals
    complete: bool
    time: str | None


def read_pointer(sealed: bytes, where: str) -> Pointer:
    """The snapshot pointer stored as ``sealed``; CorruptionError naming ``where`` for one the writer never
    writes."""
    meta = codec.loads(codec.unseal(sealed, what=where), what=where)
    try:
        chunks = [Chunk(_key(c["key"]), count(c["first"]), count(c["last"])) for c in meta["chunks"]]
        time_ = meta.get("time")
        if time_ is not None and not isinstance(time_, str):
            raise ValueError(f"time must be a string, not {time_!r}")
        return Pointer(chunks, count(meta["seq"]), count(meta.get("base", 0)), Totals.from_json(meta.get("totals")),
                       bool(meta.get("complete")), time_)
    except (KeyError, TypeError, ValueError, AttributeError, ArithmeticError) as e:
        raise errors.CorruptionError(f"snapshot pointer is malformed: {e!s}", key=where) from e


def _key(value: object) -> str:
    # Exactly a chunk's name: a pointer must not lead a reader out of its run's keys.
    if not isinstance(value, str) or not _CHUNK_KEY.fullmatch(value):
        raise ValueError(f"a chunk's key must be {layout.chunk_key('<sha256>')!r}, not {value!r}")
    return value


def _last_continuation(records: list[Record]) -> int | None:
    """Index of the last ``continue`` record in ``records``, if any."""
    for i in range(len(records) - 1, -1, -1):
        if records[i].kind == "continue":
            return i
    return None


#: The key in status.json naming the attempt that claimed it (RunStore.claim_status), until that attempt
#: writes its outcome, which names it as ``attempt``.
CLAIM = "claimedBy"
#: Claim rounds lost to other writers before claim_status gives up: each loss is another attempt's claim or
#: outcome landing between a read and its swap, and an attempt that keeps losing is not the run's owner.
CLAIM_ROUNDS = 5


class RunStore:
    """All objects of one run in one backend. Thread-compatible, not thread-safe.

    A few hundred lines because it is every kind of object a run has (manifest,
    journal, snapshots and their chunks, blobs, events, status, policy), each a
    short section over the same root and the same sealing; loading (snapshot
    plus tail, continuations, a missing chunk) is most of it.
    """

    def __init__(self, backend: base.Backend, ref: layout.RunRef) -> None:
        self.backend = backend
        self.ref = ref
        self.root = ref.path + "/"
        self._journal: base.JournalBackend | None = None
        # The attempt that claimed status.json through this store, and the etag of its last write there.
        self._status_claim: str | None = None
        self._status_etag: str | None = None

    def key(self, rel: str) -> str:
        return self.root + rel

    def _get_sealed(self, rel: str) -> Any | None:
        data = self.backend.get(self.key(rel))
        if data is None:
            return None
        return codec.loads(codec.unseal(data, what=self.key(rel)), what=self.key(rel))

    # --- manifest -------------------------------------------------------------
    def read_manifest(self) -> dict[str, Any] | None:
        value = self._get_sealed(layout.MANIFEST)
        return value if isinstance(value, dict) or value is None else None

    def create_manifest(self, manifest: dict[str, Any]) -> dict[str, Any]:
        """Create the manifest unless one exists; return the one that is stored."""
        sealed = codec.seal(codec.dumps(manifest))
        if self.backend.create(self.key(layout.MANIFEST), sealed):
            return manifest
        existing = self.read_manifest()
        if existing is None:
            raise errors.StoreError("manifest vanished right after a conflicting create",
                                    key=self.key(layout.MANIFEST))
        return existing

    # --- journal ----------------------------------------------------------------
    def journal(self) -> base.JournalBackend:
        if self._journal is None:
            self._journal = self.backend.journal(self.root)
        return self._journal

    def _decode_record(self, seq: int, sealed: bytes, where: str) -> Record:
        body = codec.unseal(sealed, what=where)
        return decode_record(seq, codec.loads(body, what=where), body, where)

    def _read_tail(self, from_seq: int, for_writing: bool) -> tuple[list[Record], int]:
        """Decoded journal records from ``from_seq`` on, and how many objects that read."""
        raw = self.journal().read(from_seq, repair=for_writing)
        out: list[Record] = []
        for seq, sealed in raw:
            if seq != from_seq + len(out):
                raise errors.CorruptionError(
                    f"journal has a gap: expected position {from_seq + len(out)}, found {seq}",
                    key=self.key(layout.journal_key(seq)),
                )
            out.append(self._decode_record(seq, sealed, self.key(layout.journal_key(seq))))
        return out, (max(1, len(raw)) if not self.backend.io_inline else 1)

    def _read_chunks(self, chunks: list[Chunk], base: int) -> list[Record] | None:
        """The records of a snapshot's chunks (from ``base``), or None if a chunk is missing."""
        bodies = self.backend.get_many([self.key(c.key) for c in chunks])
        if any(b is None for b in bodies):
            return None
        records: list[Record] = []
        for chunk, sealed in zip(chunks, bodies, strict=True):
            assert sealed is not None
            ck = self.key(chunk.key)
            body = codec.unseal(sealed, what=ck)
            if not chunk.key.endswith(f"{codec.sha256_hex(body)}.json"):
                raise errors.CorruptionError("chunk content does not match its name", key=ck)
            lines = _chunk_lines(body, ck)
            items = codec.loads(body, what=ck)  # one parse of the whole array
            if not isinstance(items, list) or len(items) != len(lines):
                raise errors.CorruptionError("snapshot chunk does not parse", key=ck)
            for line, item in zip(lines, items, strict=True):
                seq = base + len(records)
                if not isinstance(item, dict) or item.get("seq") != seq:
                    raise errors.CorruptionError(
                        f"snapshot chunk holds seq {item.get('seq') if isinstance(item, dict) else '?'}"
                        f" where {seq} belongs", key=ck)
                record = decode_record(seq, item, line, ck)
                if record.kind == "continue" and records:
                    # A snapshot always starts at the last continuation before it; should one
                    # ever hold a later one, what came before that is not needed either.
                    base, records = seq, []
                records.append(record)
        return records

    def load(self, *, for_writing: bool = False) -> Loaded:
        """Read the run's current generation: the snapshot (if any) and the journal after it.

        A run that called ``ctx.continue_as_new`` is read from its last
        continuation record on: the snapshot pointer names the continuation its
        chunks start at (``base``), and a continuation in the journal tail
        after the snapshot makes the chunks unnecessary (they are not read).
        Records before the last continuation are never read or decoded.
        """
        objects = 0
        warnings: list[str] = []
        where = self.key(layout.SNAPSHOT)
        for _ in range(3):
            pointer = self.backend.get_versioned(where)
            objects += 1
            chunks: list[Chunk] = []
            snap_seq, snap_etag, base = -1, None, 0
            if pointer is not None:
                meta = read_pointer(pointer[0], where)
                chunks, snap_seq, base, snap_etag = meta.chunks, meta.seq, meta.base, pointer[1]
            tail, read = self._read_tail(snap_seq + 1, for_writing)
            objects += read
            last_cont = _last_continuation(tail)
            if last_cont is not None:
                # The generation started after the snapshot: its chunks are not needed.
                records = tail[last_cont:]
                return Loaded(records, [], snap_seq, snap_etag, objects, warnings,
                              base=records[0].seq)
            if pointer is None:
                return Loaded(tail, [], -1, None, objects, warnings)
            objects += len(chunks)
            if not chunks or chunks[0].first != base:
                raise errors.CorruptionError(
                    f"snapshot pointer's chunks do not start at its base {base}", key=where)
            records_or_none = self._read_chunks(chunks, base)
            if records_or_none is None:
                continue  # the pointer moved on under us (or a chunk is lost): try again
            records = records_or_none
            base = records[0].seq if records else base
            if base + len(records) != snap_seq + 1:
                raise errors.CorruptionError(
                    f"snapshot covers records {base}..{base + len(records) - 1} but claims seq "
                    f"{snap_seq}", key=where)
            if base and records[0].kind != "continue":
                raise errors.CorruptionError(
                    f"snapshot starts at record {base}, which is not a continuation", key=where)
            if len(chunks) and chunks[0].first != base:
                chunks = []  # they start before the continuation found inside them
            records.extend(tail)
            return Loaded(records, chunks, snap_seq, snap_etag, objects, warnings, base=base)
        warnings.append(
            "the snapshot pointer names a chunk that does not exist; read the whole journal "
            "(of the current generation) instead: slower, same result"
        )
        current = self.backend.get_versioned(where)
        snap_etag = None if current is None else current[1]
        base = 0
        if current is not None:
            base = read_pointer(current[0], where).base
        # The journal from the pointer's base on (the last continuation it knows of).
        records, read = self._read_tail(base, for_writing)
        objects += read
        if base and (not records or records[0].kind != "continue"):
            raise errors.CorruptionError(
                f"the snapshot pointer names record {base} as a continuation, the journal "
                "does not", key=where)
        last_cont = _last_continuation(records)
        if last_cont is not None:
            records = records[last_cont:]
            base = records[0].seq
        return Loaded(records, [], -1, snap_etag, objects, warnings, base=base)

    def read_all(self) -> list[Record]:
        """Every record of the journal from seq 0, every generation (for ``inspect --all``).

        One object per record on S3: slow for long journals; an attempt never does this.
        """
        records, _ = self._read_tail(0, False)
        return records

    def read_range(self, from_seq: int, to_seq: int) -> list[Record]:
        """Records ``from_seq`` up to (not including) ``to_seq``, every generation: a page of the journal,
        read and decoded alone (the run browser's timeline; O(page) on every backend)."""
        out: list[Record] = []
        for seq, sealed in self.journal().read_range(from_seq, to_seq):
            where = self.key(layout.journal_key(seq))
            if seq != from_seq + len(out):
                raise errors.CorruptionError(
                    f"journal has a gap: expected position {from_seq + len(out)}, found {seq}", key=where)
            out.append(self._decode_record(seq, sealed, where))
        return out

    def count(self) -> int:
        """How many records the journal holds, every generation (cheap: not a read of the records). The
        snapshot pointer says how many at least."""
        pointer = self._get_sealed(layout.SNAPSHOT)
        at_least = int(pointer["seq"]) + 1 if isinstance(pointer, dict) and "seq" in pointer else 0
        return self.journal().count(at_least)

    def append(self, record: Record) -> str:
        """Seal and append one record at ``record.seq``; durable on return."""
        return self.journal().append(record.seq, codec.seal(record.raw()))

    def append_group(self, records: list[Record]) -> list[str]:
        """Seal and append consecutive records (from ``records[0].seq``) in one write; durable on return."""
        return self.journal().append_group(records[0].seq, [codec.seal(r.raw()) for r in records])

    # --- snapshots ---------------------------------------------------------------
    def snapshot(self, loaded: Loaded, totals: Totals, *, upto: int | None = None) -> str | None:
        """Save records after ``loaded.snapshot_seq`` (up to ``upto``) as a chunk; swap
        the pointer.

        Updates ``loaded`` (chunks, snapshot seq, etag). Returns the pointer key,
        or None when there was nothing new or a newer snapshot already exists.
        Safe to run on another thread while records are appended: it reads only
        records up to ``upto``, which never change.

        A snapshot covers the current generation only: its chunks start at the
        last continuation (``loaded.base``, written to the pointer as ``base``);
        chunks of earlier generations drop out of the pointer (they stay in the
        store). A snapshot up to a record before the last continuation is
        skipped: the continuation superseded it.
        """
        base, records = loaded.view()
        last = base + len(records) - 1 if upto is None else upto
        if last <= loaded.snapshot_seq or last < base:
            return None
        chunks = [c for c in loaded.chunks if c.first >= base]
        chunks.append(Chunk("", loaded.snapshot_seq + 1 if chunks else base, last))
        while len(chunks) >= 2 and chunks[-2].count <= chunks[-1].count:
            b = chunks.pop()
            a = chunks.pop()
            chunks.append(Chunk("", a.first, b.last))
        for chunk in chunks:
            if chunk.key:
                continue
            # One record per line: still a JSON array, and a reader can keep each
            # record's exact bytes without re-encoding anything.
            body = (b"[\n" + b",\n".join(
                r.raw() for r in records[chunk.first - base : chunk.last - base + 1]) + b"\n]")
            sha = codec.sha256_hex(body)
            chunk.key = layout.chunk_key(sha)
            self.backend.create(self.key(chunk.key), codec.seal(body, sha256=sha))
        pointer = codec.seal(codec.dumps({
            "layout": layout.LAYOUT_VERSION,
            "seq": last,
            "base": base,
            "chunks": [c.to_json() for c in chunks],
            "totals": totals.to_json(),
            "complete": records[last - base].kind == "complete",
            "time": format_time(time.time(), precise=True),
        }))
        etag = loaded.snapshot_etag
        for _ in range(5):
            new_etag = self.backend.cas(self.key(layout.SNAPSHOT), pointer, etag=etag)
            if new_etag is not None:
                loaded.chunks, loaded.snapshot_seq, loaded.snapshot_etag = chunks, last, new_etag
                return self.key(layout.SNAPSHOT)
            current = self.backend.get_versioned(self.key(layout.SNAPSHOT))
            if current is None:
                etag = None
                continue
            where = self.key(layout.SNAPSHOT)
            meta = codec.loads(codec.unseal(current[0], what=where), what=where)
            if int(meta["seq"]) >= last:
                return None  # someone saved a newer snapshot; pointers only move forward
            etag = current[1]
        return None

    # --- blobs (big results) ----------------------------------------------------------
    def put_blob(self, body: bytes) -> dict[str, Any]:
        sha = codec.sha256_hex(body)
        self.backend.create(self.key(layout.blob_key(sha)), codec.seal(body, sha256=sha))
        return {"sha256": sha, "size": len(body)}

    def get_blob(self, ref: dict[str, Any]) -> bytes:
        sha = str(ref["sha256"])
        key = self.key(layout.blob_key(sha))
        data = self.backend.get(key)
        if data is None:
            raise errors.CorruptionError(
                "a journal record references a result object that does not exist", key=key
            )
        body = codec.unseal(data, what=key)
        if codec.sha256_hex(body) != sha:
            raise errors.CorruptionError("result object does not match its name", key=key)
        return body

    # --- events ------------------------------------------------------------------------
    def put_event(self, name: str, payload: Any, *, event_id: str) -> bool:
        """Store an event; True if this write won (first write wins)."""
        try:
            body, _ = codec.encode_value(payload, what=f"the payload of event {name!r}")
        except errors.ResultNotSerializableError as e:
            raise errors.ConfigError(str(e).replace(" returned a value", " is a value")) from None
        doc = b"".join((
            b'{"name":', codec.dumps(name), b',"id":', codec.dumps(event_id),
            b',"sent_at":', codec.dumps(format_time(time.time(), precise=True)), b',"payload":', body, b"}",
        ))
        return self.backend.create(self.key(layout.event_key(name)), codec.seal(doc))

    def get_event(self, name: str) -> dict[str, Any] | None:
        value = self._get_sealed(layout.event_key(name))
        return value if isinstance(value, dict) else None

    def list_events(self) -> list[str]:
        prefix = self.key(layout.EVENTS_DIR)
        return [k[len(prefix) : -len(".json")] for k in self.backend.list_keys(prefix)
                if k.endswith(".json")]

    # --- status --------------------------------------------------------------------------
    # An attempt claims status.json when it starts (the same document, stamped with its id) and writes it only
    # if nobody has claimed it since (compare and swap on the etag of its own last write), so a runner fenced
    # while its write was on its way (paused, then woken after a newer attempt took the run) changes nothing:
    # the guard checks the lease, but a write already past the check cannot be called back.
    def claim_status(self, attempt: str) -> None:
        key = self.key(layout.STATUS)
        for _ in range(CLAIM_ROUNDS):
            current = self.backend.get_versioned(key)
            doc = {} if current is None else codec.loads(codec.unseal(current[0], what=key), what=key)
            doc = {**(doc if isinstance(doc, dict) else {}), CLAIM: attempt}
            etag = self.backend.cas(key, codec.seal(codec.dumps(doc)), etag=None if current is None else current[1])
            if etag is not None:
                self._status_claim, self._status_etag = attempt, etag
                return
        raise errors.StoreError(f"could not claim the run's status: {CLAIM_ROUNDS} other writes won the race",
                                key=key, attempt=attempt)

    def write_status(self, status: dict[str, Any]) -> bool:
        """Record an attempt's outcome. After :meth:`claim_status`, False (and nothing written) when another
        attempt has claimed status.json since: this one no longer owns the run."""
        key = self.key(layout.STATUS)
        if self._status_claim is None:  # not an attempt: a local command acting for the operator
            self.backend.put(key, codec.seal(codec.dumps(status)))
            return True
        stamp = {} if status.get("attempt") == self._status_claim else {CLAIM: self._status_claim}
        etag = self.backend.cas(key, codec.seal(codec.dumps({**status, **stamp})), etag=self._status_etag)
        if etag is None:
            return False
        self._status_etag = etag
        return True

    def read_status(self) -> dict[str, Any] | None:
        """The last attempt's outcome; None before any (a claim alone records none)."""
        value = self._get_sealed(layout.STATUS)
        return value if isinstance(value, dict) and "outcome" in value else None

    # --- policy (local runs: on Kubernetes spec.policy is the run's own) -------------------
    def write_policy(self, policy: dict[str, Any]) -> None:
        self.backend.put(self.key(layout.POLICY), codec.seal(codec.dumps(policy)))

    def read_policy(self) -> dict[str, Any] | None:
        value = self._get_sealed(layout.POLICY)
        return value if isinstance(value, dict) else None

    # --- child requests (a local family of runs: durablerun._private.engine.family) -----------------
    def put_child_request(self, child: str, request: dict[str, Any]) -> dict[str, Any]:
        """Record the request for child ``child`` unless one is recorded (first write wins); the stored one."""
        key = self.key(layout.child_request_key(child))
        if self.backend.create(key, codec.seal(codec.dumps(request))):
            return request
        stored = self._get_sealed(layout.child_request_key(child))
        if not isinstance(stored, dict):
            raise errors.StoreError("child request vanished right after a conflicting create", key=key)
        return stored

    def read_child_requests(self) -> dict[str, dict[str, Any]]:
        """The child requests recorded for this run, by child name, in name order."""
        prefix = self.key(layout.CHILDREN_DIR)
        requests = {}
        for key in sorted(self.backend.list_keys(prefix)):
            if key.endswith(".json"):
                value = self._get_sealed(key[len(self.root):])
                if isinstance(value, dict):
                    requests[key[len(prefix):-len(".json")]] = value
        return requests

    # --- lifecycle -------------------------------------------------------------------------
    def delete(self) -> int:
        self.close()
        return self.backend.delete_prefix(self.root)

    def close(self) -> None:
        if self._journal is not None:
            self._journal.close()
            self._journal = None
