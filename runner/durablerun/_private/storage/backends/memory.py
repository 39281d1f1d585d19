"""In-memory backend (``memory://name``) for unit tests.

Stores with the same name share their objects within one process, so a test
can open the store again the way a new attempt would.
"""

from __future__ import annotations

import hashlib
import threading
from collections.abc import Iterable
from typing import Any

from durablerun import errors
from durablerun._private.records import layout
from durablerun._private.storage.backends import base

_REGISTRY: dict[str, _Space] = {}
_REGISTRY_LOCK = threading.Lock()


class _Space:
    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.objects: dict[str, bytes] = {}
        self.journals: dict[str, list[bytes]] = {}


def _etag(data: bytes) -> str:
    return hashlib.md5(data, usedforsecurity=False).hexdigest()


def reset(name: str | None = None) -> None:
    """Forget one named memory store, or all of them."""
    with _REGISTRY_LOCK:
        if name is None:
            _REGISTRY.clear()
        else:
            _REGISTRY.pop(name, None)


class MemoryJournal(base.JournalBackend):
    def __init__(self, space: _Space, root: str) -> None:
        self._space = space
        self._root = root

    def read(self, from_seq: int, *, repair: bool = False) -> list[tuple[int, bytes]]:
        with self._space.lock:
            records = list(self._space.journals.get(self._root, ()))
        return [(seq, data) for seq, data in enumerate(records) if seq >= from_seq]

    def read_range(self, from_seq: int, to_seq: int) -> list[tuple[int, bytes]]:
        with self._space.lock:
            records = self._space.journals.get(self._root, [])[from_seq:max(from_seq, to_seq)]
        return list(enumerate(records, start=from_seq))

    def count(self, at_least: int = 0) -> int:
        with self._space.lock:
            return len(self._space.journals.get(self._root, ()))

    def append(self, seq: int, data: bytes) -> str:
        key = self._root + layout.journal_key(seq)
        with self._space.lock:
            records = self._space.journals.setdefault(self._root, [])
            if seq < len(records):
                if records[seq] == data:
                    return key
                raise errors.FencedError(
                    "journal position already written by another writer", key=key
                )
            if seq > len(records):
                raise errors.FencedError(
                    f"journal position {seq} is past the end ({len(records)}): this writer's "
                    "view of the journal is stale",
                    key=key,
                )
            records.append(data)
        return key

    def truncate(self, from_seq: int) -> int:
        with self._space.lock:
            records = self._space.journals.get(self._root, [])
            dropped = max(0, len(records) - from_seq)
            del records[from_seq:]
        return dropped


class MemoryBackend(base.Backend):
    io_inline = True

    def __init__(self, name: str) -> None:
        self.name = name
        with _REGISTRY_LOCK:
            self._space = _REGISTRY.setdefault(name, _Space())

    def describe(self) -> dict[str, Any]:
        return {"kind": "memory", "uri": f"memory://{self.name}"}

    def check(self, under: str = "") -> None:
        return None

    def get(self, key: str) -> bytes | None:
        with self._space.lock:
            return self._space.objects.get(key)

    def get_versioned(self, key: str) -> tuple[bytes, str] | None:
        data = self.get(key)
        return None if data is None else (data, _etag(data))

    def create(self, key: str, data: bytes) -> bool:
        with self._space.lock:
            existing = self._space.objects.get(key)
            if existing is not None:
                return existing == data
            self._space.objects[key] = data
            return True

    def put(self, key: str, data: bytes) -> None:
        with self._space.lock:
            self._space.objects[key] = data

    def cas(self, key: str, data: bytes, *, etag: str | None) -> str | None:
        with self._space.lock:
            existing = self._space.objects.get(key)
            current = None if existing is None else _etag(existing)
            if current != etag:
                return None
            self._space.objects[key] = data
            return _etag(data)

    def list_keys(self, prefix: str) -> list[str]:
        with self._space.lock:
            keys = [k for k in self._space.objects if k.startswith(prefix)]
            for root, records in self._space.journals.items():
                keys.extend(
                    root + layout.journal_key(seq)
                    for seq in range(len(records))
                    if (root + layout.journal_key(seq)).startswith(prefix)
                )
        return sorted(keys)

    def delete(self, keys: Iterable[str]) -> None:
        with self._space.lock:
            for key in keys:
                self._space.objects.pop(key, None)

    def delete_prefix(self, prefix: str) -> int:
        with self._space.lock:
            doomed = [k for k in self._space.objects if k.startswith(prefix)]
            for k in doomed:
                del self._space.objects[k]
            count = len(doomed)
            for root in [r for r in self._space.journals if r.startswith(prefix)]:
                count += len(self._space.journals.pop(root))
        return count

    def journal(self, root: str) -> base.JournalBackend:
        return MemoryJournal(self._space, root)

    # test helpers -----------------------------------------------------------
    def raw_journal(self, root: str) -> list[bytes]:
        """The journal's stored records (tests corrupt them through this)."""
        with self._space.lock:
            return self._space.journals.setdefault(root, [])
