"""A run id's owner record: who may write its journal now, held through the store itself.

A journal named by a run id (``durablerun run --run-id``, ``spec.checkpoint.runId``)
can be opened from anywhere that reaches the store: two clusters, a cluster and
a laptop. They share no Kubernetes status, so the store holds the lease:
``<run root>/owner.json`` (sealed), written only with compare-and-swap
(``If-None-Match: *`` to create it, ``If-Match: <etag>`` to renew, take over or
release it; a flock-guarded swap on a filesystem store)::

    {"holder": {"cluster": "prod-eu", "namespace": "team-a", "name": "review",
                "uid": "...", "pod": "review-a3", "epoch": 3}        # or {"host": ..., "pid": ...}
     "token": "<random, one per holder>", "durationSeconds": 60, "renewals": 7,
     "acquireTime": "...", "renewTime": "...", "released": false}

Rules (times are the reader's own monotonic clock, never another machine's wall clock):

* the holder renews every third of ``durationSeconds`` and writes nothing once
  ``durationSeconds`` have passed since it *sent* its last successful renewal
  (:meth:`OwnerLease.valid`); a refused renewal means someone took the record
  over: the holder is fenced at once;
* a newcomer takes the record when it is absent or released, or when it has
  watched the same version (etag) of it for the holder's ``durationSeconds`` plus
  :data:`MARGIN_SECONDS`: the holder has then stopped writing by its own clock;
* a later attempt of the same DurableRun (same uid, higher epoch: the epoch in
  its status already fences the earlier pod) and a ``durablerun run`` on the
  same host whose holder process is gone take it over at once; a holder with a
  higher epoch of the same DurableRun fences the asker.

Renewals cost one conditional PUT per third of the lease, never a request per
step. The journal's write-once positions stay the last line of defence (a write
already in flight when a holder's lease ends).
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import secrets
import socket
import threading
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import Any

from durablerun import errors
from durablerun._private.records import codec, layout
from durablerun._private.storage.backends import base
from durablerun.api import Env, format_time

log = logging.getLogger("durablerun.owner")

#: Seconds a newcomer waits past the holder's lease before it takes over (clock rates, a request in flight).
MARGIN_SECONDS = 2.0
#: How often a newcomer reads the record while it waits.
POLL_SECONDS = 1.0


@dataclass(frozen=True)
class Holder:
    """Who holds (or asks for) a run id's journal: a DurableRun's pod, or a local ``durablerun run``."""

    cluster: str | None = None
    namespace: str | None = None
    name: str | None = None
    uid: str | None = None
    pod: str | None = None
    epoch: int | None = None
    host: str | None = None
    pid: int | None = None

    @classmethod
    def local(cls) -> Holder:
        return cls(host=socket.gethostname(), pid=os.getpid())

    @classmethod
    def from_json(cls, data: Any) -> Holder:
        data = data if isinstance(data, dict) else {}
        return cls(**{k: data.get(k) for k in cls.__dataclass_fields__})

    def to_json(self) -> dict[str, Any]:
        return {k: v for k, v in asdict(self).items() if v is not None}

    def describe(self) -> str:
        if self.uid:
            where = f"cluster {self.cluster}" if self.cluster else \
                f"a cluster whose operator sets no {Env.CLUSTER}"
            return (f"DurableRun {self.namespace}/{self.name} (uid {self.uid}, pod {self.pod}, "
                    f"epoch {self.epoch}) in {where}")
        return f"`durablerun run` on host {self.host} (pid {self.pid})"

    def supersedes(self, other: Holder) -> bool | None:
        """Whether this holder may take ``other``'s record at once (True), must stop (False), or must wait."""
        if self.uid and self.uid == other.uid and self.epoch is not None and other.epoch is not None:
            return self.epoch >= other.epoch
        if self.host and self.host == other.host and other.pid is not None and not _alive(other.pid):
            return True
        return None


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


class HeldElsewhere(Exception):
    """Another holder renews the run id's record: wait for it (``holder``), ``retry_after`` seconds."""

    def __init__(self, holder: Holder, retry_after: float, journal: str) -> None:
        self.holder, self.retry_after = holder, retry_after
        super().__init__(
            f"the journal {journal} is held by {holder.describe()}, which renews its store lease "
            f"({retry_after:g}s): it is taken over once that holder releases it or stops renewing")


class OwnerLease:
    """Takes, renews and releases one run id's owner record. See the module's docstring."""

    def __init__(self, backend: base.Backend, ref: layout.RunRef, holder: Holder, duration: float,
                 *, clock: Callable[[], float] = time.monotonic) -> None:
        self.backend, self.ref, self.holder, self.duration = backend, ref, holder, max(1.0, duration)
        self.key = f"{ref.path}/{layout.OWNER}"
        self.clock = clock
        self.token = secrets.token_hex(8)
        self.etag: str | None = None
        self.renewals = 0
        self.acquired_at = ""
        self.last_success = 0.0
        self.lost: str | None = None
        self.previous: Holder | None = None  # whom this lease took the record from, if anyone
        self._stopped = threading.Event()
        self._thread: threading.Thread | None = None

    # --- the record ------------------------------------------------------------------
    def _read(self) -> tuple[dict[str, Any] | None, str | None]:
        got = self.backend.get_versioned(self.key)
        if got is None:
            return None, None
        return codec.loads(codec.unseal(got[0], what=self.key), what=self.key), got[1]

    def _doc(self, *, released: bool = False) -> bytes:
        now = format_time(time.time(), precise=True)
        return codec.seal(json.dumps({
            "holder": self.holder.to_json(), "token": self.token, "durationSeconds": self.duration,
            "renewals": self.renewals, "acquireTime": self.acquired_at, "renewTime": now,
            "released": released,
        }, separators=(",", ":"), sort_keys=True).encode())

    def _swap(self, etag: str | None, *, released: bool = False) -> str | None:
        self.renewals += 1
        return self.backend.cas(self.key, self._doc(released=released), etag=etag)

    # --- taking it -------------------------------------------------------------------
    def acquire(self, *, give_up_when_renewed: bool = True, patience: float | None = None) -> None:
        """Take the record, waiting while a holder may still write.

        Raises :class:`HeldElsewhere` when the holder renews it while we watch
        (``give_up_when_renewed``) or ``patience`` seconds run out first, and
        FencedError when a newer attempt of this same DurableRun holds it.
        """
        watched: tuple[str | None, float] | None = None
        started = self.clock()
        while True:
            record, etag = self._read()
            other = Holder.from_json((record or {}).get("holder"))
            duration = float((record or {}).get("durationSeconds") or self.duration)
            verdict = None if record is None or record.get("released") else self.holder.supersedes(other)
            if verdict is False:
                raise errors.FencedError(
                    f"the journal's owner record is held by a newer attempt: {other.describe()}", key=self.key)
            now = self.clock()
            if watched is not None and watched[0] != etag:
                if give_up_when_renewed and record is not None and not record.get("released"):
                    raise HeldElsewhere(other, duration, f"{self.ref.path}/")
                watched = None
            if watched is None:
                watched = (etag, now)
            expired = now - watched[1] >= duration + MARGIN_SECONDS
            if record is None or record.get("released") or verdict or expired:
                sent = self.clock()
                self.acquired_at = format_time(time.time(), precise=True)
                new = self._swap(etag)
                if new is not None:
                    self.etag, self.last_success = new, sent
                    self.previous = None if record is None or record.get("released") else other
                    if self.previous is not None:
                        log.warning("took over the journal %s from %s (%s)", self.key, other.describe(),
                                    "its own earlier attempt" if verdict else
                                    f"unchanged for {now - watched[1]:.1f}s: its lease had expired")
                    return
                watched = None  # someone else swapped it first: look again
                continue
            if patience is not None and now - started >= patience:
                raise HeldElsewhere(other, duration, f"{self.ref.path}/")
            time.sleep(min(POLL_SECONDS, max(0.05, duration + MARGIN_SECONDS - (now - watched[1]))))

    def claim_own(self) -> Holder | None:
        """Take the record only if it is absent or this holder's own DurableRun (same uid) held it last: before
        deleting the journal. Otherwise nothing is written and the holder that keeps it is returned."""
        record, etag = self._read()
        other = Holder.from_json((record or {}).get("holder"))
        if record is not None and other.uid != self.holder.uid:
            return other
        self.acquired_at = format_time(time.time(), precise=True)
        new = self._swap(etag)
        if new is None:
            return Holder.from_json((self._read()[0] or {}).get("holder"))
        self.etag, self.last_success = new, self.clock()
        return None

    # --- holding it ------------------------------------------------------------------
    def valid(self) -> bool:
        """Whether this holder may still write: held, and its last renewal sent less than the lease ago."""
        return self.etag is not None and self.lost is None and \
            self.clock() - self.last_success < self.duration

    def renew(self) -> bool:
        """One renewal. False when it failed; ``lost`` is set when someone else took the record."""
        if self.lost or self.etag is None:
            return False
        sent = self.clock()
        try:
            new = self._swap(self.etag)
        except errors.StoreError as e:
            log.warning("store lease renewal failed (retrying until the lease would lapse): %s", e)
            return False
        if new is None:
            record, _ = self._read()
            taker = Holder.from_json((record or {}).get("holder")).describe() if record else "nobody (deleted)"
            self.lost = f"the journal's owner record was taken over by {taker}"
            return False
        self.etag, self.last_success = new, sent
        return True

    def start(self, on_lost: Callable[[str], None]) -> None:
        """Renew every third of the lease on a thread; ``on_lost(why)`` once it is lost or lapses."""
        def loop() -> None:
            interval = self.duration / 3
            due = self.clock() + interval
            while not self._stopped.wait(0.2):
                if self.clock() >= due:
                    due = self.clock() + (interval if self.renew() else 1.0)
                if not self.valid():
                    on_lost(self.lost or f"store lease of {self.duration:g}s lapsed without renewal")
                    return

        self._thread = threading.Thread(target=loop, name="owner-lease", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stopped.set()
        if self._thread is not None:
            self._thread.join(timeout=5)

    def release(self) -> None:
        """Give the record up, so the next holder need not wait for it to expire. Best effort."""
        self.stop()
        if self.valid():
            with contextlib.suppress(errors.StoreError):
                self._swap(self.etag, released=True)
        self.etag = None


def read_owner(backend: base.Backend, ref: layout.RunRef) -> dict[str, Any] | None:
    """The run's owner record as stored (for ``inspect``), or None."""
    key = f"{ref.path}/{layout.OWNER}"
    got = backend.get(key)
    return None if got is None else dict(codec.loads(codec.unseal(got, what=key), what=key))
