"""Journal stores: where a run's journal, snapshots, results and events live.

Open one by URI::

    from durablerun.stores import open_store, RunRef

    store = open_store("s3://bucket/prefix", endpoint_url="http://minio:9000")
    store = open_store("file:///var/lib/durablerun")      # the embedded default
    store = open_store("memory://tests")                  # unit tests

A run lives under ``<prefix>/<namespace>/<name>/<uid>/`` (a DurableRun:
``RunRef.kubernetes(ns, name, uid)``) or ``<prefix>/_local/<run-id>/`` (the
local CLI's ``--run-id``: ``RunRef.local(run_id)``). The full key layout is
documented in ``durablerun._private.records.layout`` and docs/sdk.md.

For the operator (all keyword-only, all safe to call while a runner runs):

* ``store.put_event(run=ref, name="approval", payload={...}) -> bool``:
  first write wins; True when this write won.
* ``store.get_event(run=ref, name=...) -> EventInfo | None``
* ``store.read_run(run=ref) -> RunInfo``: manifest (workflow, input hash,
  code version), totals (usd, tokens, steps), latest checkpoint (seq, key,
  time), last attempt status, completed flag, events present. Reads O(1)
  objects plus the journal tail since the last snapshot.
* ``store.delete_run(run=ref) -> int``: removes every object of the run
  (retention: Delete).
* ``store.describe() -> dict``: kind, URI, bucket/prefix/endpoint or root,
  encryption options, never credentials. ``store.check()`` raises
  StoreNotFoundError / StoreAccessError (usage errors) when unusable.

Errors: :mod:`durablerun.errors` (CorruptionError on any checksum mismatch,
FencedError when another writer won a journal position,
StoreUnavailableError when the store cannot be reached after retries).
"""

from durablerun._private.records.layout import LAYOUT_VERSION, RunRef
from durablerun._private.records.model import Totals
from durablerun._private.storage.backends.options import S3Options
from durablerun._private.storage.stores import (
    CheckpointInfo,
    EventInfo,
    RunInfo,
    Store,
    open_store,
    store_from_checkpoint,
)

__all__ = [
    "LAYOUT_VERSION",
    "CheckpointInfo",
    "EventInfo",
    "RunInfo",
    "RunRef",
    "S3Options",
    "Store",
    "Totals",
    "open_store",
    "store_from_checkpoint",
]
