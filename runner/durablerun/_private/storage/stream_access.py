"""Opening a DurableRun's output stream from outside its pods, from the run's body and its credentials Secret's
entries: what the webhook ingress serves as Server-Sent Events (through the public ``durablerun.streams``)."""

from __future__ import annotations

import json
import threading
from collections import OrderedDict
from collections.abc import Callable, Mapping
from typing import Any

from durablerun import api, resource
from durablerun._private.records import layout
from durablerun._private.storage.stores import Store, store_from_checkpoint
from durablerun._private.storage.stream_reader import Advance, StreamReader
from durablerun._private.storage.streams import READ_WINDOW


class RunStream:
    """A reader of one stream of one DurableRun, with the store it reads; close it when done."""

    def __init__(self, reader: StreamReader, close: Callable[[], None]) -> None:
        self.reader = reader
        self._close = close

    @property
    def next_offset(self) -> int:
        return self.reader.next_offset

    def advance(self) -> Advance:
        """One poll (blocking IO: call it on a thread from an event loop)."""
        return self.reader.advance()

    def close(self) -> None:
        self._close()


class StoreCache:
    """Open stores shared by the readers of runs with the same store and credentials.

    A store is an S3 client (its service model, megabytes) and a pool of threads; a reader is a few objects.
    One store per reader would make each connection of a server cost the client: a store is opened once per
    store and credentials, shared while in use, and up to ``keep`` unused ones stay open (least recently
    used closed first). Thread-safe.
    """

    def __init__(self, keep: int = 8) -> None:
        self.keep = keep
        self._used: dict[str, tuple[Store, int]] = {}
        self._idle: OrderedDict[str, Store] = OrderedDict()
        self._lock = threading.Lock()

    def take(self, checkpoint: resource.Checkpoint, found: Mapping[str, str]) -> tuple[str, Store]:
        key = json.dumps([checkpoint.model_dump(mode="json", exclude={"runId"}), sorted(found.items())])
        with self._lock:
            store = self._idle.pop(key, None) or (self._used[key][0] if key in self._used else None)
            if store is None:
                store = _open(checkpoint, found)
            self._used[key] = (store, (self._used[key][1] if key in self._used else 0) + 1)
            return key, store

    def give(self, key: str) -> None:
        with self._lock:
            store, users = self._used.pop(key)
            if users > 1:
                self._used[key] = (store, users - 1)
                return
            self._idle[key] = store
            while len(self._idle) > self.keep:
                self._idle.popitem(last=False)[1].close()

    def close(self) -> None:
        with self._lock:
            while self._idle:
                self._idle.popitem()[1].close()


def _open(checkpoint: resource.Checkpoint, found: Mapping[str, str]) -> Store:
    return store_from_checkpoint(
        checkpoint, access_key=found.get("AWS_ACCESS_KEY_ID"), secret_key=found.get("AWS_SECRET_ACCESS_KEY"),
        session_token=found.get("AWS_SESSION_TOKEN"), endpoint_url=found.get("AWS_ENDPOINT_URL_S3"))


def open_run_stream(run: Mapping[str, Any], name: str, *, start: int = 0, final: bool = False,
                    secret: Mapping[str, bytes] | None = None, window: int = READ_WINDOW,
                    stores: StoreCache | None = None) -> RunStream:
    """Stream ``name`` of DurableRun ``run`` (its JSON body), read from offset ``start`` on, at most ``window``
    chunks a poll (what the reader holds in memory at once).

    ``secret``: the entries of the run's ``spec.checkpoint.credentialsSecret`` (as the run's own pods get
    them), or None for the process's own credentials (workload identity). ``stores``: where to take the
    store from (and give it back on close); else the reader opens one of its own. Opening reads nothing yet.
    """
    spec = resource.DurableRunSpec.model_validate(run["spec"])
    meta = run["metadata"]
    found = {k: v.decode() for k, v in (secret or {}).items()
             if k in (*api.STORE_SECRET_KEYS, *api.STORE_SECRET_OPTIONAL_KEYS)}
    key, store = stores.take(spec.checkpoint, found) if stores is not None else ("", _open(spec.checkpoint, found))
    ref = layout.RunRef.durable_run(meta["namespace"], meta["name"], meta["uid"], spec.checkpoint.runId)
    run_store = store.run_store(ref)

    def close() -> None:
        run_store.close()
        if stores is not None:
            stores.give(key)
        else:
            store.close()

    return RunStream(StreamReader(run_store, name, start=start, final=final, window=window), close)
