"""Span export out of the runner's interpreter: a child process runs OpenTelemetry's OTLP exporter, fed
finished spans through a pipe.

Why a process: the SDK's exporter spends about 45 µs of CPU per span (protobuf encoding, the HTTP post).
On a thread of the runner it holds the GIL the steps need, and a trivial step took a fifth longer
(bench/RESULTS.md, section 5). The runner now pays one C ``json`` encoding and one ``write(2)`` per span;
the child (this file run as a script, started by :func:`start`) rebuilds each span as a
``ReadableSpan`` and hands it to the SDK's own ``BatchSpanProcessor`` and ``OTLPSpanExporter``, so the
``OTEL_*`` settings (headers, TLS, timeouts, retries, resource attributes, batch queue) mean what they mean
anywhere else. The child's CPU and memory count against the runner's container.

The wire: one JSON array a line, a :data:`Span`, or for a step's span (nearly every line) a :data:`Step`:
its values without their attributes' names, which the child adds, so the runner builds one flat tuple per
step and encodes no key. The pipe is the only buffer on the runner's side. Its
write end is non-blocking: a span that does not fit is dropped and counted, never waited for, so a slow
or unreachable collector cannot hold up a step (the child drains the pipe into the SDK's bounded queue
as fast as it comes; the pipe fills only when the child is starved or stopped). A buffer in the runner
would need a thread to drain it, which is the cost this module removes.

At the attempt's end the runner closes the pipe; the child exports what it holds for
:func:`flush_seconds` at most, prints how many spans were delivered and exits. It also exits if the
runner dies: the pipe's end (EOF) or, should a process forked from the runner still hold the pipe, the
parent-death signal.

The child's environment is the ``OTEL_*`` variables and what Python and an HTTP client need (the path, a
proxy, a CA bundle); never the runner's credentials for the store or anything else.
"""

from __future__ import annotations

import contextlib
import ctypes
import fcntl
import json
import os
import select
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace import ReadableSpan, SpanProcessor
    from opentelemetry.sdk.trace.export import SpanExporter, SpanExportResult

#: One finished span: name, span id, parent span id (0: a root), start and end (ns since the epoch),
#: attributes, events (``[name, time_ns, attributes]``), and the error status's description (None: unset).
Span = tuple[str, int, int, int, int, Mapping[str, Any], Sequence[Sequence[Any]], str | None]
#: A step's span, in the order of :data:`STEP_ATTRIBUTES` after the first four: span id, parent span id, start
#: and end (ns); the step's name, position, attempts, ok, journal seq, result bytes, cost in USD (None: no
#: cost), tokens, error type (None: it succeeded), whether it ran again after a killed attempt; and its
#: retries, ``[time_ns, attempt]`` each. Its first value, a number, tells it from a Span, whose is a name.
Step = tuple[int, int, int, int, str, str, int, bool, int, int, float | None, int, str | None, bool,
             Sequence[Sequence[int]]]
#: The attributes of a step's span, named by the child, in the Step's order.
STEP_ATTRIBUTES = ("durablerun.step.name", "durablerun.step.position", "durablerun.step.attempts",
                   "durablerun.step.ok", "durablerun.journal.seq", "durablerun.step.result_bytes",
                   "durablerun.cost.usd", "durablerun.cost.tokens", "error.type", "durablerun.step.reexecuted")
#: The instrumentation scope of every span.
SCOPE = "durablerun"
#: After the pipe's end, the child exports what it holds for this long at most, unless
#: OTEL_BSP_EXPORT_TIMEOUT says otherwise (:func:`flush_seconds`). Not that setting's default of 30 s:
#: every attempt's end waits for it, and a pod being deleted has its grace period to spend.
FLUSH_SECONDS = 2.0
#: The batch processor exports what it holds this often unless OTEL_BSP_SCHEDULE_DELAY says otherwise. Not that
#: setting's default of 5 s: a container killed whole (SIGKILL, a lost node) takes the child and what it holds
#: with it, so this bounds how many of a killed attempt's spans are lost. The next attempt ends the killed one's
#: own span from the journal (tracing.py); its steps' spans only the child had.
SCHEDULE_DELAY_MS = 1000
#: The runner waits for the child's start (importing OpenTelemetry, under a second on a busy machine, but
#: the child runs niced) this long at most besides its flush. Then it kills it.
START_SECONDS = 4.0
#: The runner's wait for the child, by default.
EXIT_SECONDS = FLUSH_SECONDS + START_SECONDS
#: The child reads the pipe this often at most: 50 ms of spans at thousands a second fit it many times over.
READ_EVERY = 0.05
#: The pipe's capacity asked for: Linux's limit for an unprivileged process by default (pipe-max-size);
#: some 2,500 step spans while the child starts.
PIPE_BYTES = 1 << 20
#: What the child's environment keeps besides OTEL_*: Python's own, and what an HTTP client reads.
CHILD_ENV = ("PATH", "PYTHONPATH", "LANG", "LC_ALL", "LC_CTYPE", "TZ", "HTTP_PROXY", "HTTPS_PROXY", "NO_PROXY",
             "http_proxy", "https_proxy", "no_proxy", "SSL_CERT_FILE", "SSL_CERT_DIR", "REQUESTS_CA_BUNDLE",
             "CURL_CA_BUNDLE")

#: The child's niceness, above the runner's: its exporter's threads inherit it.
EXPORT_NICE = 10
_PR_SET_PDEATHSIG = 1
# The C encoder (no indent), no cycle check: a span is built by this package from plain values.
_encode = json.JSONEncoder(separators=(",", ":"), check_circular=False).encode


class SpanPipe:
    """The runner's end: spans to the child's pipe, without ever blocking. Thread-safe (model calls end
    spans from steps' threads)."""

    def __init__(self, fd: int, process: subprocess.Popen[bytes] | None = None, *,
                 exit_seconds: float = EXIT_SECONDS) -> None:
        self.fd = fd
        self.process = process
        self.exit_seconds = exit_seconds
        self.sent = 0  # spans handed to send, dropped or not
        self.dropped = 0
        self._rest = b""  # the unwritten end of a line longer than the pipe took (lines over PIPE_BUF)
        self._lock = threading.Lock()

    def send(self, span: Span | Step) -> None:
        data = (_encode(span) + "\n").encode()
        with self._lock:
            self.sent += 1
            if self.fd < 0:  # closed: a model call from a step's thread that outlived its attempt
                self.dropped += 1
                return
            if self._rest:  # finish the line the pipe took part of, or the stream loses its framing
                written = self._write(self._rest)
                self._rest = self._rest[written:]
                if self._rest:
                    self.dropped += 1
                    return
            written = self._write(data)
            if written == 0:
                self.dropped += 1
            elif written < len(data):
                self._rest = data[written:]

    def _write(self, data: bytes) -> int:
        try:
            return os.write(self.fd, data)
        except BlockingIOError:  # full: drop, never wait
            return 0
        except BrokenPipeError:  # the child is gone
            self._rest = b""
            return 0

    def close(self, seconds: float | None = None) -> int:
        """End the stream and wait ``seconds`` (by default its start and flush) at most for the child to
        deliver what it holds; the spans it delivered (0 if it did not say in time: it is killed)."""
        deadline = time.monotonic() + (self.exit_seconds if seconds is None else seconds)
        with self._lock:
            if self.fd < 0:
                return 0
            while self._rest and (left := deadline - time.monotonic()) > 0:
                select.select([], [self.fd], [], left)
                written = self._write(self._rest)
                self._rest = self._rest[written:]
            os.close(self.fd)
            self.fd = -1  # the number may be reused by the next file opened
        if self.process is None:
            return 0
        try:
            out, _ = self.process.communicate(timeout=max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            self.process.kill()
            out, _ = self.process.communicate()
        try:
            return int(json.loads((out or b"").splitlines()[-1])["delivered"])
        except (ValueError, IndexError, KeyError, TypeError):
            return 0


def start(trace_id: int, env: Mapping[str, str]) -> SpanPipe:
    """Start the export child for trace ``trace_id`` with the ``OTEL_*`` settings of ``env``.

    Raises OSError if it cannot start."""
    read, write = os.pipe()  # both close-on-exec: the child gets `read` as its stdin and nothing else
    with contextlib.suppress(OSError):  # a lower pipe-max-size: the default 64 KiB still holds some 150 spans
        fcntl.fcntl(write, fcntl.F_SETPIPE_SZ, PIPE_BYTES)
    try:
        # This file as a script, not `-m` this module: importing the durablerun package would double the
        # child's start (0.25 s of CPU). -P: the file's directory is not put on the path (its modules' names
        # would hide others'). In "/": nothing of the workflow's project directory is seen.
        process = subprocess.Popen([sys.executable, "-P", __file__, f"{trace_id:032x}", str(os.getpid())],
                                   stdin=read, stdout=subprocess.PIPE, env=child_env(env), cwd="/")
    except BaseException:
        os.close(write)
        raise
    finally:
        os.close(read)
    os.set_blocking(write, False)
    return SpanPipe(write, process, exit_seconds=flush_seconds(env) + START_SECONDS)


def flush_seconds(env: Mapping[str, str]) -> float:
    """The child's flush at the end: OTEL_BSP_EXPORT_TIMEOUT (milliseconds) if set to a number, else
    :data:`FLUSH_SECONDS`."""
    try:
        return max(0.0, float(env["OTEL_BSP_EXPORT_TIMEOUT"]) / 1000)
    except (KeyError, ValueError):
        return FLUSH_SECONDS


def child_env(env: Mapping[str, str]) -> dict[str, str]:
    """The child's environment: ``env``'s OTEL_* and :data:`CHILD_ENV`."""
    return {k: v for k, v in env.items() if k.startswith("OTEL_") or k in CHILD_ENV}


class Counting:
    """A SpanExporter around the real one, counting the spans it delivered (OpenTelemetry's processors only
    call these three methods)."""

    def __init__(self, inner: SpanExporter) -> None:
        self.inner = inner
        self.delivered = 0

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        from opentelemetry.sdk.trace.export import SpanExportResult

        result = self.inner.export(spans)
        if result is SpanExportResult.SUCCESS:
            self.delivered += len(spans)  # one export at a time: the processor's export lock
        return result

    def shutdown(self) -> None:
        self.inner.shutdown()

    def force_flush(self, timeout_millis: int = 30000) -> bool:
        return self.inner.force_flush(timeout_millis)


def pipeline(env: Mapping[str, str], exporter: SpanExporter | None = None) -> tuple[SpanProcessor, Counting]:
    """OpenTelemetry's batch processor (its bounded queue, OTEL_BSP_*) in front of ``exporter``, by default
    the OTLP/HTTP one configured by ``env``'s OTEL_* variables; and the count of spans it delivered."""
    from opentelemetry.sdk.trace.export import BatchSpanProcessor

    if exporter is None:
        import logging

        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

        exporter = OTLPSpanExporter()
        # Its retries are warnings per batch; the runner reports what was not delivered, once, instead.
        logging.getLogger("opentelemetry.exporter.otlp").setLevel(logging.ERROR)
    counting = Counting(exporter)
    delay = None if "OTEL_BSP_SCHEDULE_DELAY" in env else SCHEDULE_DELAY_MS  # None: the SDK reads the variable
    return BatchSpanProcessor(counting, schedule_delay_millis=delay), counting  # type: ignore[arg-type]  # the three methods it calls


def resource(env: Mapping[str, str]) -> Resource:
    """OTEL_SERVICE_NAME and OTEL_RESOURCE_ATTRIBUTES; the service is "durablerun" if they name none."""
    from opentelemetry.sdk.resources import Resource

    named = env.get("OTEL_SERVICE_NAME") or "service.name=" in env.get("OTEL_RESOURCE_ATTRIBUTES", "")
    created = Resource.create({} if named else {"service.name": "durablerun"})
    digest = hash(created)

    class Hashed(Resource):
        """The SDK hashes a resource by JSON-encoding its attributes, and its exporter hashes each span's to
        group them: every span here shares this one, so its hash is computed once."""

        def __hash__(self) -> int:
            return digest

    return Hashed(created.attributes, created.schema_url)


class Rebuild:
    """Spans off the wire, as the SDK's ReadableSpans of trace ``trace_id``."""

    def __init__(self, trace_id: int, resource: Resource) -> None:
        from opentelemetry.sdk.trace import Event, ReadableSpan
        from opentelemetry.sdk.util.instrumentation import InstrumentationScope
        from opentelemetry.trace import SpanContext, Status, StatusCode, TraceFlags

        self.trace_id = trace_id
        self.resource = resource
        self.scope = InstrumentationScope(SCOPE)
        self.flags = TraceFlags(TraceFlags.SAMPLED)
        self.span_type, self.event_type, self.context_type = ReadableSpan, Event, SpanContext
        self.unset, self.status, self.error_code = Status(StatusCode.UNSET), Status, StatusCode.ERROR

    def __call__(self, span: Sequence[Any]) -> ReadableSpan:
        if not isinstance(span[0], str):
            span = self.step(span)
        name, span_id, parent, start, end, attributes, events, error = span
        context = self.context_type(self.trace_id, span_id, is_remote=False, trace_flags=self.flags)
        return self.span_type(
            name, context=context,
            parent=self.context_type(self.trace_id, parent, is_remote=False, trace_flags=self.flags) if parent
            else None,
            resource=self.resource, attributes=attributes, instrumentation_scope=self.scope,
            events=[self.event_type(n, a, t) for n, t, a in events],
            status=self.unset if error is None else self.status(self.error_code, error),
            start_time=start, end_time=end)

    @staticmethod
    def step(step: Sequence[Any]) -> Span:
        """A :data:`Step` as the Span it stands for."""
        span_id, parent, start, end, *values, retries = step
        name, error = values[0], values[8]
        attributes = {k: v for k, v in zip(STEP_ATTRIBUTES, values, strict=True) if v is not None}
        if "durablerun.cost.usd" not in attributes:  # no cost: no tokens either
            del attributes["durablerun.cost.tokens"]
        if not attributes["durablerun.step.reexecuted"]:
            del attributes["durablerun.step.reexecuted"]
        events = [["retry", at, {"durablerun.step.attempt": attempt}] for at, attempt in retries]
        return f"step {name}", span_id, parent, start, max(start, end), attributes, events, error


class InProcess:
    """Spans exported by a processor in this process (an exporter handed in: tests); no pipe, no child."""

    def __init__(self, trace_id: int, env: Mapping[str, str], exporter: SpanExporter) -> None:
        self.processor, self.counting = pipeline(env, exporter)
        self.flush = flush_seconds(env)
        self.rebuild = Rebuild(trace_id, resource(env))
        self.sent = 0
        self.dropped = 0

    def send(self, span: Span | Step) -> None:
        self.sent += 1
        self.processor.on_end(self.rebuild(span))

    def close(self, seconds: float | None = None) -> int:
        _bounded(self.processor.shutdown, self.flush if seconds is None else seconds)
        return self.counting.delivered


def _bounded(call: Any, seconds: float) -> None:
    """``call()`` for ``seconds`` at most (OpenTelemetry's flush ignores its timeout)."""
    worker = threading.Thread(target=call, name="durablerun-trace-flush", daemon=True)
    worker.start()
    worker.join(seconds)


# --- the child ---------------------------------------------------------------------------------------


class _ParentGone(Exception):
    pass


def _die_with(parent: int) -> None:
    """Raise _ParentGone when the runner dies, even if a process it forked still holds the pipe open."""
    def on_term(signum: int, frame: Any) -> None:
        # PR_SET_PDEATHSIG fires when the runner's *thread* that started us ends, too: the runner is gone
        # only if we were handed to another parent. Otherwise it closes the pipe when its attempt ends.
        if os.getppid() != parent:
            raise _ParentGone

    signal.signal(signal.SIGTERM, on_term)
    with contextlib.suppress(OSError, AttributeError):  # not Linux: the pipe's end is the signal
        ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGTERM, 0, 0, 0)
    if os.getppid() != parent:  # it died before we asked
        raise _ParentGone


def main(argv: Sequence[str]) -> int:
    trace_id, parent = int(argv[0], 16), int(argv[1])
    # The steps come first: where this process and the runner share a CPU, the scheduler gives the runner
    # most of it and the export its slack (an unprivileged process may lower its own priority).
    with contextlib.suppress(OSError):
        os.nice(EXPORT_NICE)
    # Ctrl-C reaches the runner's whole process group; the runner then ends its attempt and closes the pipe.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    processor, counting = pipeline(os.environ)
    rebuild = Rebuild(trace_id, resource(os.environ))
    received, rest = 0, b""

    def take() -> bool:
        """Hand the spans of the next chunk on the pipe to the processor; False at its end."""
        nonlocal received, rest
        chunk = os.read(0, 1 << 16)
        *lines, rest = (rest + chunk).split(b"\n")
        for line in lines:
            try:
                span = rebuild(json.loads(line))
            except (ValueError, TypeError):  # not a span: never expected, the stream goes on
                continue
            processor.on_end(span)
            received += 1
        return bool(chunk)

    try:
        _die_with(parent)
        while take():
            # A write wakes a reader only when one waits on the pipe: reading a few times a second, not per
            # span, spares the runner a wake-up of this process, and a switch of its CPU, per step.
            time.sleep(READ_EVERY)
    except _ParentGone:  # what the runner wrote before it died is in the pipe: take it, without waiting
        os.set_blocking(0, False)
        with contextlib.suppress(BlockingIOError):
            while take():
                pass
    signal.signal(signal.SIGTERM, signal.SIG_IGN)  # the flush below is bounded
    _bounded(processor.shutdown, flush_seconds(os.environ))
    with contextlib.suppress(BrokenPipeError):  # the runner is gone
        print(json.dumps({"received": received, "delivered": counting.delivered}), flush=True)
    os._exit(0)  # not waiting for an export still retrying: its flush was its time


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
