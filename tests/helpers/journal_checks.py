"""A run's journal read straight from S3, and the invariants every trial checks on it.

Deliberately independent of the SDK's reader: the envelope is unsealed and
its sha256 checked here, records and snapshot chunks are parsed here, so an
SDK bug cannot hide itself from the check. The layout is the one of
``runner/durablerun/_private/records/layout.py`` (layout version 1)::

    <prefix>/<namespace>/<name>/<uid>/manifest.json
                                     journal/<seq:012d>.json   one sealed record, or a group:
                                                               '{"group":<seq>,"count":<n>}' and n
                                                               sealed records, one a line
                                     snapshot.json             pointer to chunks
                                     chunks/<sha256>.json      "[\\n<record>,\\n<record>\\n]", sealed
                                     blobs/, events/, status.json
"""

from __future__ import annotations

import hashlib
import json
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

_PREFIX = b'{"sha256":"'
_MID = b'","body":'

# Objects that are written once and must never change or disappear afterwards.
IMMUTABLE_DIRS = ("journal/", "chunks/", "blobs/", "events/", "manifest.json")


def unseal(data: bytes, key: str) -> bytes:
    """The body of a sealed object; AssertionError naming the key if it is damaged."""
    assert data.startswith(_PREFIX), f"{key}: not a sealed envelope"
    assert data.endswith(b"}"), f"{key}: not a sealed envelope (truncated?)"
    digest = data[len(_PREFIX) : len(_PREFIX) + 64].decode()
    assert data[len(_PREFIX) + 64 : len(_PREFIX) + 64 + len(_MID)] == _MID, f"{key}: bad envelope"
    body = data[len(_PREFIX) + 64 + len(_MID) : -1]
    assert hashlib.sha256(body).hexdigest() == digest, f"{key}: checksum mismatch"
    return body


def journal_object(data: bytes, first: int, key: str) -> list[bytes]:
    """The sealed records a journal object named ``first`` holds: itself, or the lines of its group."""
    if not data.startswith(b'{"group":'):
        return [data]
    head, *records = data.split(b"\n")
    meta = json.loads(head)
    assert meta == {"group": first, "count": len(records)}, f"{key}: group header {meta} for {len(records)} records"
    assert len(records) > 1, f"{key}: a group of one record"
    return records


@dataclass
class Journal:
    """Everything stored for one run, read at one moment."""

    root: str
    etags: dict[str, str] = field(default_factory=dict)  # key relative to root -> ETag
    bodies: dict[int, bytes] = field(default_factory=dict)  # seq -> record body (unsealed)
    records: dict[int, dict[str, Any]] = field(default_factory=dict)
    chunk_records: dict[int, list[bytes]] = field(default_factory=dict)  # seq -> bodies found in chunks
    pointer: dict[str, Any] | None = None

    @property
    def steps(self) -> dict[str, dict[str, Any]]:
        """Journaled step records by step name."""
        return {r["name"]: r for r in self.records.values() if r["kind"] == "step"}

    @property
    def last(self) -> dict[str, Any] | None:
        return self.records[max(self.records)] if self.records else None

    @property
    def writers(self) -> list[str]:
        """The attempt id (``w``) of each record, in journal order."""
        return [self.records[seq]["w"] for seq in sorted(self.records)]


def run_root(prefix: str, namespace: str, name: str, uid: str) -> str:
    return f"{prefix.strip('/')}/{namespace}/{name}/{uid}/"


def list_objects(s3: Any, bucket: str, root: str) -> dict[str, str]:
    pages = s3.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=root)
    return {o["Key"][len(root):]: o["ETag"] for page in pages for o in page.get("Contents", [])}


def read_journal(s3: Any, bucket: str, root: str) -> Journal:
    """Read and verify every record, chunk and the snapshot pointer of the run under ``root``."""
    journal = Journal(root, list_objects(s3, bucket, root))

    def get(rel: str) -> bytes:
        return bytes(s3.get_object(Bucket=bucket, Key=root + rel)["Body"].read())

    for rel in sorted(journal.etags):
        if rel.startswith("journal/"):
            first = int(rel[len("journal/") : -len(".json")])
            for seq, sealed in enumerate(journal_object(get(rel), first, rel), start=first):
                body = unseal(sealed, f"{rel} (record {seq})")
                record = json.loads(body)
                assert record["seq"] == seq, f"{rel} holds seq {record['seq']} where {seq} belongs"
                assert seq not in journal.records, f"{rel}: record {seq} is stored twice"
                journal.bodies[seq], journal.records[seq] = body, record
        elif rel.startswith("chunks/"):
            body = unseal(get(rel), rel)
            assert rel == f"chunks/{hashlib.sha256(body).hexdigest()}.json", f"{rel}: content does not match its name"
            assert body.startswith(b"[\n"), f"{rel}: not a chunk"
            assert body.endswith(b"\n]"), f"{rel}: not a chunk"
            for line in body[2:-2].split(b",\n"):
                journal.chunk_records.setdefault(json.loads(line)["seq"], []).append(line)
    if "snapshot.json" in journal.etags:
        journal.pointer = json.loads(unseal(get("snapshot.json"), "snapshot.json"))
    return journal


def check_journal(journal: Journal, *, complete: bool = True) -> None:
    """Invariants of one run's stored journal (AssertionError says which and where)."""
    seqs = sorted(journal.records)
    assert seqs == list(range(len(seqs))), f"journal positions are not contiguous from 0: {seqs}"
    if complete:
        assert journal.last is not None, "the journal is empty"
        assert journal.last["kind"] == "complete", "the journal does not end complete"
    # A journal position (an operation of the workflow) is written once, by one attempt.
    ops = Counter((r["pos"], r["kind"], r["name"] if r["kind"] == "patch" else "") for r in journal.records.values())
    twice = [op for op, n in ops.items() if n > 1]
    assert not twice, f"operations journaled more than once: {twice}"
    # Writers take turns: once an attempt stops writing, it never writes again.
    blocks = [w for i, w in enumerate(journal.writers) if i == 0 or journal.writers[i - 1] != w]
    assert len(blocks) == len(set(blocks)), f"attempts interleaved their journal writes: {blocks}"
    # Snapshots copy records byte for byte, and only records that exist.
    for seq, copies in journal.chunk_records.items():
        assert seq in journal.bodies, f"a snapshot chunk holds seq {seq}, which the journal lacks"
        assert all(c == journal.bodies[seq] for c in copies), f"a snapshot chunk altered record {seq}"
    if journal.pointer is not None:
        assert journal.pointer["seq"] <= seqs[-1], "the snapshot pointer is ahead of the journal"
        # A snapshot covers its generation: from the last continuation at or before its seq (else 0) on.
        base = max((s for s in seqs if journal.records[s]["kind"] == "continue" and s <= journal.pointer["seq"]),
                   default=0)
        assert journal.pointer.get("base", 0) == base, f"the snapshot's base is not the last continuation {base}"
        covered = sorted(s for c in journal.pointer["chunks"] for s in range(c["first"], c["last"] + 1))
        assert covered == list(range(base, journal.pointer["seq"] + 1)), \
            f"snapshot chunks do not tile {base}..seq: {covered}"
        for chunk in journal.pointer["chunks"]:
            assert chunk["key"] in journal.etags, f"the snapshot names a missing chunk {chunk['key']}"


def check_kept(before: dict[str, str], after: dict[str, str]) -> None:
    """Every write-once object seen earlier is still there, unchanged (same ETag)."""
    lost = [k for k in before if k.startswith(IMMUTABLE_DIRS) and k not in after]
    changed = [k for k in before if k.startswith(IMMUTABLE_DIRS) and k in after and after[k] != before[k]]
    assert not lost, f"journaled objects were lost: {lost}"
    assert not changed, f"journaled objects were overwritten: {changed}"
