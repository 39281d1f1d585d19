"""Serving one run's output stream as Server-Sent Events, once the ingress has checked the token: the
connection caps (per run and in all), the pump from the store's reader to the client, and the cut-off for a
client that takes nothing.

The pump writes each chunk as it is read, a comment while idle, and ``end`` once the run has finished and the
stream is read to its end. A write waits at most ``write_timeout`` for the client to take what aiohttp has
buffered for it, so a client that never reads costs a bounded buffer, not memory that grows.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass

from aiohttp import web

from durablerun import streams
from durablerun_operator.ingress import sse
from durablerun_operator.ingress.counters import LATENCY, REQUESTS, STREAMS_OPEN

log = logging.getLogger("durablerun.ingress")


class Busy(Exception):
    """Refused for the connection caps: 429 (this run's) or 503 (the ingress's)."""

    def __init__(self, status: int, reason: str) -> None:
        super().__init__(reason)
        self.status, self.reason = status, reason


class Connections:
    """Open stream connections, per run (namespace/name/uid) and in all; a run's entry goes with its last."""

    def __init__(self, max_per_run: int, max_total: int) -> None:
        self.max_per_run, self.max_total = max_per_run, max_total
        self._open: dict[str, int] = {}

    @property
    def total(self) -> int:
        return sum(self._open.values())

    def take(self, run: str) -> None:
        if self.total >= self.max_total:
            raise Busy(503, f"the ingress serves {self.max_total} streams at once; retry later")
        if self._open.get(run, 0) >= self.max_per_run:
            raise Busy(429, f"this run's streams are read by {self.max_per_run} connections at once; retry later")
        self._open[run] = self._open.get(run, 0) + 1
        STREAMS_OPEN.inc()

    def release(self, run: str) -> None:
        left = self._open.get(run, 0) - 1
        if left > 0:
            self._open[run] = left
        else:
            self._open.pop(run, None)
        STREAMS_OPEN.dec()


class _SlowReader(Exception):
    """The client took nothing for ``write_timeout`` while the buffer was full."""


@dataclass(frozen=True)
class Pacing:
    #: Seconds a client may take to accept what is written before its connection is dropped.
    write_timeout: float
    #: Seconds between comments sent while the stream is idle.
    heartbeat: float


async def serve(request: web.Request, reader: streams.RunStream, first: streams.Advance, *, expires: int,
                pacing: Pacing, clock: Callable[[], float], started: float, where: str) -> web.StreamResponse:
    """Answer ``request`` with the stream ``reader`` reads (``first``: its first read), until the run has
    finished and the stream is read to its end, the token expires (``expires``, by ``clock``), or the client
    goes. ``reader`` is closed on return."""
    response = web.StreamResponse(headers={"Content-Type": "text/event-stream; charset=utf-8",
                                           "Cache-Control": "no-store", "X-Accel-Buffering": "no"})
    try:
        await response.prepare(request)
        REQUESTS.labels("streamed").inc()
        LATENCY.observe(time.monotonic() - started)  # time to the first byte: the rest is the client's
        await _send(response, sse.opening(), pacing)
        await _pump(request, response, reader, first, expires, pacing, clock)
    except _SlowReader:
        REQUESTS.labels("slow_reader").inc()
        log.info("%s: dropped a client that took no data for %.0f s", where, pacing.write_timeout)
        if request.transport is not None:
            request.transport.abort()  # its buffered bytes go with it
    except ConnectionResetError:
        pass  # the client went away
    except Exception:
        log.exception("%s failed; its client may reconnect with Last-Event-ID", where)
        if request.transport is not None:
            request.transport.abort()  # not an end event: the client resumes where it was
    finally:
        await asyncio.to_thread(reader.close)
    return response


async def _pump(request: web.Request, response: web.StreamResponse, reader: streams.RunStream,
                step: streams.Advance, expires: int, pacing: Pacing, clock: Callable[[], float]) -> None:
    wait, quiet_since = streams.POLL_FIRST_SECONDS, time.monotonic()
    while True:
        for read in step.reads:
            kind = "superseded" if read.standing == streams.Standing.SUPERSEDED else None
            await _send(response, sse.event(read.chunk.offset, read.chunk.text, kind), pacing)
            quiet_since = time.monotonic()
        if step.done:
            await _send(response, sse.end(reader.next_offset), pacing)
            await response.write_eof()
            return
        if clock() >= expires or request.transport is None or request.transport.is_closing():
            return  # an expired token reads no more (a reconnect is refused); a gone client needs nothing
        if not step.behind:
            wait = streams.next_wait(wait, step)
            if time.monotonic() - quiet_since >= pacing.heartbeat:
                await _send(response, sse.HEARTBEAT, pacing)
                quiet_since = time.monotonic()
            await asyncio.sleep(wait)
        step = await asyncio.to_thread(reader.advance)


async def _send(response: web.StreamResponse, data: bytes, pacing: Pacing) -> None:
    """Write ``data``, waiting for the client to take what is buffered at most ``write_timeout``."""
    try:
        await asyncio.wait_for(response.write(data), pacing.write_timeout)
    except TimeoutError:
        raise _SlowReader() from None
