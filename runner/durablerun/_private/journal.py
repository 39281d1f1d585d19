"""A run's objects in a store: manifest, journal records, snapshots, blobs, events, status.

This layer is the same for every backend. It seals and checks every object
(:mod:`~durablerun._private.codec`), owns the record format, and makes resume
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

Record format (layout v1), one JSON object per journal position::

    {"seq": 7, "pos": "3", "kind": "step", "name": "plan", "w": "<attempt id>",
     "at": 1700000000.1, "ok": true, "value": ..., | "ref": {"sha256":..., "size":...},
     "model": "pkg.mod:Model", "error": {"type":..., "message":...}, "attempts": 1,
     "dur": 0.12, "cost": {"usd": "0.02", "tokens": 1500},
     "totals": {"usd": "0.04", "tokens": 3000, "steps": 2}}

``kind`` is one of ``step``, ``value`` (ctx.now / ctx.uuid), ``sleep``,
``wait`` (the deadline of a wait_for_event), ``event`` (its resolution),
``patch`` (a ctx.patched marker) and ``complete`` (the workflow's result).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from datetime import UTC, datetime
from decimal import Decimal
from typing import Any

from durablerun import errors
from durablerun._private import codec, layout
from durablerun._private.backends import base


@dataclass
class Totals:
    """The run's journaled counters."""

    usd: Decimal = Decimal(0)
    tokens: int = 0
    steps: int = 0

    def to_json(self) -> dict[str, Any]:
        return {"usd": str(self.usd), "tokens": self.tokens, "steps": self.steps}

    @classmethod
    def from_json(cls, data: dict[str, Any] | None) -> Totals:
        if not data:
            return cls()
        return cls(Decimal(str(data.get("usd", "0"))), int(data.get("tokens", 0)),
                   int(data.get("steps", 0)))

    def copy(self) -> Totals:
        return Totals(self.usd, self.tokens, self.steps)


@dataclass
class Record:
    seq: int
    data: dict[str, Any]
    body: bytes | None = None
    #: The decoded value was handed to the workflow once; hand out copies after that.
    handed: bool = False

    @property
    def pos(self) -> str:
        return str(self.data["pos"])

    @property
    def kind(self) -> str:
        return str(self.data["kind"])

    @property
    def name(self) -> str:
        return str(self.data.get("name", ""))

    def raw(self) -> bytes:
        if self.body is None:
            self.body = codec.dumps(self.data)
        return self.body

    def value(self) -> Any:
        """The record's inline ``value`` as plain JSON (records written in this
        process keep it encoded until someone asks)."""
        value = self.data.get("value")
        raw = getattr(value, "data", None)
        if isinstance(raw, bytes):
            return codec.loads(raw, what=f"record {self.seq}")
        return value


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


@dataclass
class Loaded:
    """A run's journal as read at the start of an attempt."""

    records: list[Record]
    chunks: list[Chunk]
    snapshot_seq: int  # last seq covered by the snapshot, -1 if none
    snapshot_etag: str | None
    objects_read: int
    warnings: list[str] = field(default_factory=list)

    @property
    def next_seq(self) -> int:
        return len(self.records)

    @property
    def totals(self) -> Totals:
        return Totals.from_json(self.records[-1].data.get("totals")) if self.records else Totals()


def _chunk_lines(body: bytes, where: str) -> list[bytes]:
    """The records of a chunk body (``[\n<record>,\n<record>\n]``), byte for byte."""
    if not (body.startswith(b"[\n") and body.endswith(b"\n]")):
        raise errors.CorruptionError("snapshot chunk is not in the expected format", key=where)
    inner = body[2:-2]
    if not inner:
        return []
    return inner.split(b",\n")


def iso(t: datetime | float) -> str:
    if isinstance(t, float | int):
        t = datetime.fromtimestamp(t, UTC)
    return t.isoformat().replace("+00:00", "Z")


def parse_iso(text: str) -> datetime:
    return datetime.fromisoformat(text.replace("Z", "+00:00"))


class RunStore:
    """All objects of one run in one backend. Thread-compatible, not thread-safe."""

    def __init__(self, backend: base.Backend, ref: layout.RunRef) -> None:
        self.backend = backend
        self.ref = ref
        self.root = ref.path + "/"
        self._journal: base.JournalBackend | None = None

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
        data = codec.loads(body, what=where)
        if not isinstance(data, dict) or data.get("seq") != seq:
            raise errors.CorruptionError(
                f"journal record claims seq {data.get('seq') if isinstance(data, dict) else '?'}"
                f" but is stored at {seq}",
                key=where,
            )
        return Record(seq, data, body)

    def load(self, *, for_writing: bool = False) -> Loaded:
        """Read the snapshot (if any) and the journal records after it."""
        objects = 0
        warnings: list[str] = []
        records: list[Record] = []
        chunks: list[Chunk] = []
        snap_seq, snap_etag = -1, None
        for _ in range(3):
            pointer = self.backend.get_versioned(self.key(layout.SNAPSHOT))
            objects += 1
            if pointer is None:
                break
            where = self.key(layout.SNAPSHOT)
            meta = codec.loads(codec.unseal(pointer[0], what=where), what=where)
            chunks = [Chunk(c["key"], int(c["first"]), int(c["last"])) for c in meta["chunks"]]
            bodies = self.backend.get_many([self.key(c.key) for c in chunks])
            objects += len(chunks)
            if any(b is None for b in bodies):
                continue  # the pointer moved on under us (or a chunk is lost): try again
            records = []
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
                    if not isinstance(item, dict) or item.get("seq") != len(records):
                        raise errors.CorruptionError(
                            f"snapshot chunk holds seq {item.get('seq') if isinstance(item, dict) else '?'}"
                            f" where {len(records)} belongs", key=ck)
                    records.append(Record(len(records), item, line))
            snap_seq, snap_etag = int(meta["seq"]), pointer[1]
            if len(records) != snap_seq + 1:
                raise errors.CorruptionError(
                    f"snapshot covers {len(records)} records but claims seq {snap_seq}",
                    key=where)
            break
        else:
            warnings.append(
                "the snapshot pointer names a chunk that does not exist; read the whole "
                "journal instead (slower, same result)"
            )
            records, chunks, snap_seq, snap_etag = [], [], -1, None
            current = self.backend.get_versioned(self.key(layout.SNAPSHOT))
            snap_etag = None if current is None else current[1]
        tail = self.journal().read(snap_seq + 1, repair=for_writing)
        objects += max(1, len(tail)) if not self.backend.io_inline else 1
        for seq, sealed in tail:
            if seq != len(records):
                raise errors.CorruptionError(
                    f"journal has a gap: expected position {len(records)}, found {seq}",
                    key=self.key(layout.journal_key(seq)),
                )
            records.append(self._decode_record(seq, sealed, self.key(layout.journal_key(seq))))
        return Loaded(records, chunks, snap_seq, snap_etag, objects, warnings)

    def append(self, record: Record) -> str:
        """Seal and append one record at ``record.seq``; durable on return."""
        return self.journal().append(record.seq, codec.seal(record.raw()))

    # --- snapshots ---------------------------------------------------------------
    def snapshot(self, loaded: Loaded, totals: Totals, *, upto: int | None = None) -> str | None:
        """Save records after ``loaded.snapshot_seq`` (up to ``upto``) as a chunk; swap
        the pointer.

        Updates ``loaded`` (chunks, snapshot seq, etag). Returns the pointer key,
        or None when there was nothing new or a newer snapshot already exists.
        Safe to run on another thread while records are appended: it reads only
        records up to ``upto``, which never change.
        """
        records = loaded.records
        last = len(records) - 1 if upto is None else upto
        if last <= loaded.snapshot_seq:
            return None
        chunks = list(loaded.chunks)
        chunks.append(Chunk("", loaded.snapshot_seq + 1, last))
        while len(chunks) >= 2 and chunks[-2].count <= chunks[-1].count:
            b = chunks.pop()
            a = chunks.pop()
            chunks.append(Chunk("", a.first, b.last))
        for chunk in chunks:
            if chunk.key:
                continue
            # One record per line: still a JSON array, and a reader can keep each
            # record's exact bytes without re-encoding anything.
            body = (b"[\n" + b",\n".join(r.raw() for r in records[chunk.first : chunk.last + 1])
                    + b"\n]")
            chunk.key = layout.chunk_key(codec.sha256_hex(body))
            self.backend.create(self.key(chunk.key), codec.seal(body))
        pointer = codec.seal(codec.dumps({
            "layout": layout.LAYOUT_VERSION,
            "seq": last,
            "chunks": [c.to_json() for c in chunks],
            "totals": totals.to_json(),
            "complete": records[last].kind == "complete",
            "time": iso(time.time()),
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
        self.backend.create(self.key(layout.blob_key(sha)), codec.seal(body))
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
            b',"sent_at":', codec.dumps(iso(time.time())), b',"payload":', body, b"}",
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
    def write_status(self, status: dict[str, Any]) -> None:
        self.backend.put(self.key(layout.STATUS), codec.seal(codec.dumps(status)))

    def read_status(self) -> dict[str, Any] | None:
        value = self._get_sealed(layout.STATUS)
        return value if isinstance(value, dict) else None

    # --- lifecycle -------------------------------------------------------------------------
    def delete(self) -> int:
        self.close()
        return self.backend.delete_prefix(self.root)

    def close(self) -> None:
        if self._journal is not None:
            self._journal.close()
            self._journal = None
