"""An attempt's stdout and stderr in the run's store: ``logs/<attempt>-<uid>/<part>.log.gz`` (layout.py).

:class:`AttemptParts` stores an attempt's text as numbered gzip parts, each written once with
``create``: a part cannot be overwritten, by a retry or by anyone else. What goes into the parts,
whole lines within ``layout.LOG_ATTEMPT_BYTES``, is the pod's log shipper's (its ``Lines``, in
:mod:`durablerun._private.pod.logship`, which imports this module only once it has something to
store); the readers below serve ``durablerun logs`` and ``kubectl durablerun logs --attempt``.
"""

from __future__ import annotations

import gzip

from durablerun._private.records import layout
from durablerun._private.storage.backends import base


class PartTaken(Exception):
    """A part of this attempt's logs holds other bytes: someone else writes them (nothing more is stored)."""


class AttemptParts:
    """The parts of attempt ``attempt`` of DurableRun ``writer`` (its uid) in ``run``'s root in ``backend``.

    One writer at a time: the shipper's store thread."""

    def __init__(self, backend: base.Backend, run: layout.RunRef, attempt: int, writer: str) -> None:
        self.backend = backend
        self.root = f"{run.path}/"
        self.attempt = (attempt, writer)
        self.part = 0

    def store(self, data: bytes) -> None:
        """``data`` as the next part. Raises what the backend raises (the same part is tried again next
        time), and PartTaken."""
        key = self.root + layout.log_part_key(*self.attempt, self.part)
        # mtime=0: a retried part is the same bytes.
        if not self.backend.create(key, gzip.compress(data, mtime=0)):
            raise PartTaken(f"{key} holds other logs")
        self.part += 1


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
