"""Opening a DurableRun's output stream from outside its pods, from the run's body and its credentials Secret's
entries: what the webhook ingress serves as Server-Sent Events (through the public ``durablerun.streams``)."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from durablerun import api, resource
from durablerun._private.records import layout
from durablerun._private.storage.stores import store_from_checkpoint
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


def open_run_stream(run: Mapping[str, Any], name: str, *, start: int = 0, final: bool = False,
                    secret: Mapping[str, bytes] | None = None, window: int = READ_WINDOW) -> RunStream:
    """Stream ``name`` of DurableRun ``run`` (its JSON body), read from offset ``start`` on, at most ``window``
    chunks a poll (what the reader holds in memory at once).

    ``secret``: the entries of the run's ``spec.checkpoint.credentialsSecret`` (as the run's own pods get
    them), or None for the process's own credentials (workload identity). Opening reads nothing yet.
    """
    spec = resource.DurableRunSpec.model_validate(run["spec"])
    meta = run["metadata"]
    found = {k: v.decode() for k, v in (secret or {}).items()
             if k in (*api.STORE_SECRET_KEYS, *api.STORE_SECRET_OPTIONAL_KEYS)}
    store = store_from_checkpoint(
        spec.checkpoint, access_key=found.get("AWS_ACCESS_KEY_ID"), secret_key=found.get("AWS_SECRET_ACCESS_KEY"),
        session_token=found.get("AWS_SESSION_TOKEN"), endpoint_url=found.get("AWS_ENDPOINT_URL_S3"))
    ref = layout.RunRef.durable_run(meta["namespace"], meta["name"], meta["uid"], spec.checkpoint.runId)
    run_store = store.run_store(ref)

    def close() -> None:
        run_store.close()
        store.close()

    return RunStream(StreamReader(run_store, name, start=start, final=final, window=window), close)
