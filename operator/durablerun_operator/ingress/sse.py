"""Server-Sent Events as the ingress writes them (the WHATWG HTML "server-sent events" format), pure.

A chunk is one event: ``id`` is its offset in the stream (what a reconnecting client sends back as
``Last-Event-ID``), ``data`` its text, one ``data:`` line per line of it, since a client joins them with
``\\n`` (``\\r\\n`` and a lone ``\\r`` end lines too, so they come back as ``\\n``).
"""

from __future__ import annotations

import re

#: How long a client waits before it reconnects (ms): the stream's own ``retry:`` field.
RETRY_MS = 2000
#: The longest ``Last-Event-ID`` taken: offsets are below a stream's chunk limit, far under 10^12.
_ID = re.compile(r"^[0-9]{1,12}$")
_LINE_END = re.compile(r"\r\n|\r|\n")

HEARTBEAT = b": keepalive\n\n"


class BadLastEventId(ValueError):
    pass


def start_after(header: str | None) -> int:
    """The offset to read from, given a request's ``Last-Event-ID`` (the last event it got): 0 without one."""
    if header is None or header.strip() == "":
        return 0
    value = header.strip()
    if not _ID.match(value):
        raise BadLastEventId(f"Last-Event-ID {value[:40]!r} is not an event id this stream sent (a decimal offset): "
                             "send the id of the last event received, or no Last-Event-ID to read from the start")
    return int(value) + 1


def event(offset: int, text: str, kind: str | None = None) -> bytes:
    """One event: id ``offset``, data ``text``, and type ``kind`` (None: the default, ``message``)."""
    lines = [f"id: {offset}"]
    if kind:
        lines.append(f"event: {kind}")
    lines += [f"data: {line}" for line in _LINE_END.split(text)]
    return ("\n".join(lines) + "\n\n").encode()


def opening() -> bytes:
    return f"retry: {RETRY_MS}\n\n".encode()


def end(next_offset: int) -> bytes:
    """The last event: the run has finished and the stream is read to its end (``data``: the next offset).
    No ``id``, so a client's last event id stays the last chunk's."""
    return f"event: end\ndata: {next_offset}\n\n".encode()
