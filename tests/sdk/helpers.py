"""Helpers shared by SDK tests: reaching *under* a store to damage it on purpose."""

from __future__ import annotations

from pathlib import Path

from durablerun._private import layout
from durablerun._private.backends.fs import FsBackend
from durablerun._private.backends.memory import MemoryBackend
from durablerun._private.backends.s3 import S3Backend
from durablerun.stores import RunRef, Store


def flip_byte(data: bytes, offset: int) -> bytes:
    b = bytearray(data)
    b[offset] ^= 0x01
    return bytes(b)


def corrupt_journal_record(store: Store, ref: RunRef, seq: int) -> None:
    """Flip one bit inside the body of journal record ``seq`` (not the tail)."""
    backend = store.backend
    root = ref.path + "/"
    if isinstance(backend, MemoryBackend):
        records = backend.raw_journal(root)
        records[seq] = flip_byte(records[seq], len(records[seq]) - 5)
    elif isinstance(backend, FsBackend):
        seg_dir = backend.root / root / "journal"
        start = seq - seq % layout.SEGMENT_RECORDS
        path = seg_dir / layout.segment_name(start)
        lines = path.read_bytes().split(b"\n")
        index = seq - start
        lines[index] = flip_byte(lines[index], len(lines[index]) - 5)
        path.write_bytes(b"\n".join(lines))
    elif isinstance(backend, S3Backend):
        key = backend._key(root + layout.journal_key(seq))
        data = backend._client.get_object(Bucket=backend.bucket, Key=key)["Body"].read()
        backend._client.put_object(Bucket=backend.bucket, Key=key,
                                   Body=flip_byte(data, len(data) - 5))
    else:  # pragma: no cover
        raise AssertionError(backend)


def raw_journal_bytes(store: Store, ref: RunRef) -> list[bytes]:
    """Every journal record as stored, to prove nothing was overwritten."""
    return [data for _, data in store.backend.journal(ref.path + "/").read(0)]


def fs_segment(store: Store, ref: RunRef, start: int = 0) -> Path:
    assert isinstance(store.backend, FsBackend)
    return store.backend.root / ref.path / "journal" / layout.segment_name(start)
