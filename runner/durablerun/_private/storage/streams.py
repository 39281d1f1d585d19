"""A run's output streams as stored: one sealed object per chunk, at ``streams/<name>/<offset>.json``.

Offsets count from 0 with no gap: a writer creates offset ``n`` only after ``n - 1`` is durable, and
creates it first-write-wins, so two attempts (a fenced one still writing, and its successor) never
both own an offset; the loser moves on to the next one. Each chunk names the step try that wrote it
(attempt, journal position, try), which is what a reader decides supersession from
(:mod:`durablerun._private.storage.stream_reader`).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

from durablerun import errors
from durablerun._private.records import codec, layout
from durablerun._private.storage.backends import base

#: How many offsets one read asks for at once (one ``get_many``).
READ_WINDOW = 64


@dataclass(frozen=True)
class Chunk:
    """One stored piece of a stream: text a step try wrote, at ``offset``."""

    offset: int
    text: str
    #: The attempt that wrote it: the ``w`` its step's journal record carries when this try is journaled.
    attempt: str
    #: The journal position and name of the step that wrote it.
    pos: str
    step: str
    #: Which try of the step (from 1): its journal record's ``attempts`` when this try is the last.
    tries: int
    #: When it was written (seconds since the epoch).
    at: float

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


class StreamObjects:
    """The streams of one run in one backend."""

    def __init__(self, backend: base.Backend, ref: layout.RunRef) -> None:
        self.backend = backend
        self.root = ref.path + "/"

    def names(self) -> list[str]:
        """The run's streams that hold at least one chunk, sorted."""
        head = self.root + layout.STREAMS_DIR
        return sorted({k[len(head):].partition("/")[0] for k in self.backend.list_keys(head)})

    def end(self, name: str) -> int:
        """The next free offset of stream ``name`` (one listing: where a new attempt starts writing)."""
        offsets = [layout.offset_of_stream_key(name, k[len(self.root):])
                   for k in self.backend.list_keys(self.root + layout.stream_dir(name))]
        return max((o for o in offsets if o is not None), default=-1) + 1

    def create(self, name: str, chunk: Chunk) -> bool:
        """Store ``chunk`` at its offset unless that offset is taken; True when this write won."""
        body = codec.dumps({"stream": name, **chunk.to_json()})
        return self.backend.create(self.root + layout.stream_key(name, chunk.offset), codec.seal(body))

    def read(self, name: str, start: int, limit: int = READ_WINDOW) -> list[Chunk]:
        """Chunks ``start``, ``start + 1``, ... up to the first offset not written yet (at most ``limit``)."""
        keys = [self.root + layout.stream_key(name, start + i) for i in range(limit)]
        first = self.backend.get(keys[0])
        if first is None:  # a follower's usual poll: one GET, not a window of misses
            return []
        chunks: list[Chunk] = []
        for key, data in zip(keys, [first, *self.backend.get_many(keys[1:])], strict=True):
            if data is None:
                break
            chunks.append(_decode(name, len(chunks) + start, data, key))
        return chunks


def _decode(name: str, offset: int, data: bytes, key: str) -> Chunk:
    doc = codec.loads(codec.unseal(data, what=key), what=key)
    try:
        chunk = Chunk(offset=int(doc["offset"]), text=str(doc["text"]), attempt=str(doc["attempt"]),
                      pos=str(doc["pos"]), step=str(doc["step"]), tries=int(doc["tries"]), at=float(doc["at"]))
    except (KeyError, TypeError, ValueError):
        raise errors.CorruptionError("stream chunk lacks a field", key=key) from None
    if doc.get("stream") != name or chunk.offset != offset:
        raise errors.CorruptionError(f"stream chunk names stream {doc.get('stream')!r} offset {chunk.offset}, "
                                     f"stored as {name!r} offset {offset}", key=key)
    return chunk
