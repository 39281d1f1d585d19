"""Reading a DurableRun's output streams from outside its pods: what the webhook ingress serves as Server-Sent
Events (``ctx.stream_url``, docs/sdk.md "Reading a stream over HTTP").

The one reader is the SDK's own (the one ``durablerun stream`` uses): offsets with no gap, each chunk's
standing (final, pending, superseded). ``open_run_stream`` opens it on a run's store from the DurableRun's
body and the entries of its credentials Secret, so the operator's side needs no private module::

    from durablerun import streams

    reader = streams.open_run_stream(run_body, "notes", start=0, secret=entries)
    try:
        step = reader.advance()        # one poll: step.reads, step.behind, step.done
    finally:
        reader.close()
"""

from durablerun._private.records.layout import stream_name_error
from durablerun._private.storage.stream_access import RunStream, StoreCache, open_run_stream
from durablerun._private.storage.stream_reader import (
    POLL_FIRST_SECONDS,
    POLL_MAX_SECONDS,
    Advance,
    Read,
    Standing,
    next_wait,
)
from durablerun._private.storage.streams import Chunk

__all__ = [
    "POLL_FIRST_SECONDS",
    "POLL_MAX_SECONDS",
    "Advance",
    "Chunk",
    "Read",
    "RunStream",
    "Standing",
    "StoreCache",
    "next_wait",
    "open_run_stream",
    "stream_name_error",
]
