"""The pod's log shipper: the runner's stdout and stderr, kept in the run's store from outside the runner.

``durablerun pod`` starts it first (:func:`start`): a child process, this file run as a script, whose
pipes take the places of fds 1 and 2, so whatever the runner and its steps' subprocesses write goes
through it. It writes every byte on at once to the container's own stdout or stderr (``kubectl logs``
shows what it showed), and stores whole lines as the attempt's logs
(:mod:`durablerun._private.storage.logs`) every second or 64 KiB, once the runner has told it the
store on a control pipe (:meth:`Shipper.ship_to`; the lines before wait, within the attempt's bound).

It starts light, because it starts beside the runner before the runner has taken its lease: run as
``python -I <this file>`` (not ``-m``: importing the durablerun package costs 0.4 s of CPU) with
standard-library imports only, and at a lower priority (:data:`NICE`). It imports the store's code
(pydantic, boto3 for S3) only once the runner has named the store and a line waits to be stored.

Because it is another process, a runner killed by SIGKILL or the OOM killer loses nothing it had
written: the shipper reads to the end of its pipes and stores the rest. (Where the runner is its
container's PID 1, the kernel kills the shipper with it: then the last second is lost.) A runner
that ends by itself closes its ends and waits up to :data:`EXIT_WAIT` for the shipper, so its exit
code and termination message stay its own. The shipper never fails an attempt: a store that
cannot be written gets one line on stderr, and the shipper goes on forwarding.

Credentials come from the environment the shipper inherits, as the runner's do; the control pipe
carries the store's URI and options, never a secret. ``DURABLERUN_SHIP_LOGS=0`` turns it off.

Standard library only at the top of this module: the runner imports it too (:class:`Shipper`).
"""

from __future__ import annotations

import contextlib
import json
import os
import selectors
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from durablerun import resource
    from durablerun._private.records import layout
    from durablerun._private.storage import logs

#: Store what is pending at least this often (seconds), or as soon as this much is pending (bytes).
SHIP_EVERY = 1.0
SHIP_BYTES = 64 * 1024
#: After the runner has gone, how long a step's leftover child process may keep the pipes open (seconds).
DRAIN_GRACE = 1.0
#: How long the runner waits for the shipper to store the last lines when it ends by itself (seconds).
EXIT_WAIT = 2.0
#: A store that fails once the runner has gone gets this many more tries, a SHIP_EVERY apart.
ENDING_TRIES = 3
#: A line longer than this is stored in pieces of this size (a runaway line must not hold the rest back).
LINE_PIECE = 64 * 1024
#: The shipper's niceness, above the runner's: the runner's start and lease renewals come first.
NICE = 10
#: Where the durablerun package the runner runs is found: the child looks there, not on PYTHONPATH (-I).
_PACKAGE_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))


class Shipper:
    """The runner's side: the shipper process and the control pipe to it."""

    def __init__(self, process: subprocess.Popen[bytes], control: int, saved: tuple[int, int]) -> None:
        self.process = process
        self.control: int | None = control
        self.saved: tuple[int, int] | None = saved
        self._lock = threading.Lock()
        threading.Thread(target=self._watch, name="log-shipper-watch", daemon=True).start()

    def ship_to(self, checkpoint: resource.Checkpoint, run: layout.RunRef, attempt: int, writer: str) -> None:
        """From now on, store the logs as ``attempt`` of DurableRun ``writer`` (its uid) in ``run``'s root in
        ``checkpoint``'s store."""
        if self.control is None:
            return
        message = {"checkpoint": checkpoint.model_dump(mode="json"), "attempt": attempt, "writer": writer,
                   "run": {"namespace": run.namespace, "name": run.name, "uid": run.uid}}
        with contextlib.suppress(OSError):  # a shipper that died must not fail the attempt
            os.write(self.control, json.dumps(message).encode() + b"\n")

    def close(self) -> None:
        """The runner ends: give the container's stdout and stderr back, let the shipper store the rest."""
        self._restore()
        if self.control is not None:
            os.close(self.control)
            self.control = None
        try:
            self.process.wait(timeout=EXIT_WAIT)
        except subprocess.TimeoutExpired:
            print(f"durablerun: the log shipper did not finish within {EXIT_WAIT:g}s; the attempt's last "
                  "lines may be missing from its stored logs", file=sys.stderr)

    def _watch(self) -> None:
        # A shipper gone before the runner (killed on its own) would turn every print into a BrokenPipeError:
        # the runner writes to the container's own fds again.
        self.process.wait()
        if self._restore():
            print(f"durablerun: the log shipper exited ({self.process.returncode}); the rest of this attempt's "
                  "logs are not stored", file=sys.stderr)

    def _restore(self) -> bool:
        """Fds 1 and 2 back to the container's own (late lines, an exit traceback, still reach kubectl logs);
        the pipes' last write ends are then a step's leftover children's, if any (the shipper's DRAIN_GRACE)."""
        with self._lock:
            if self.saved is None:
                return False
            for stream in (sys.stdout, sys.stderr):
                with contextlib.suppress(OSError, ValueError):
                    stream.flush()
            for fd, saved in zip((1, 2), self.saved, strict=True):
                os.dup2(saved, fd)
                os.close(saved)
            self.saved = None
            return True


def start(limit: int) -> Shipper | None:
    """Put the shipper between the runner's fds 1 and 2 and the container's, keeping at most ``limit`` bytes
    of text (layout.LOG_ATTEMPT_BYTES); None when it cannot start."""
    out_r, out_w = os.pipe()
    err_r, err_w = os.pipe()
    control_r, control_w = os.pipe()
    try:
        # -I: neither this file's folder nor PYTHON* settings shape the child's imports; it finds the store's
        # code, when it needs it, where the runner's is (_PACKAGE_ROOT).
        process = subprocess.Popen(
            [sys.executable, "-I", __file__, str(out_r), str(err_r), str(control_r), str(limit), _PACKAGE_ROOT],
            pass_fds=(out_r, err_r, control_r), stdin=subprocess.DEVNULL)
    except OSError as error:
        for fd in (out_r, out_w, err_r, err_w, control_r, control_w):
            os.close(fd)
        print(f"durablerun: the log shipper did not start ({error}); this attempt's logs are not stored",
              file=sys.stderr)
        return None
    for fd in (out_r, err_r, control_r):
        os.close(fd)
    for stream in (sys.stdout, sys.stderr):
        stream.flush()
    saved = (os.dup(1), os.dup(2))
    for fd, pipe in ((1, out_w), (2, err_w)):
        os.dup2(pipe, fd)
        os.close(pipe)
    # (os.pipe and os.dup make fds a step's subprocesses do not inherit: only the runner holds the control
    # pipe and the container's own fds; dup2 makes 1 and 2 inheritable, so the subprocesses write to the pipes.)
    return Shipper(process, control_w, saved)


# --- the shipper process ---------------------------------------------------------------------------------


class Lines:
    """An attempt's text on its way to the store, whole lines at a time so that stdout and stderr never
    interleave inside a line, at most ``limit`` bytes of it; what comes after is counted, and the last line
    says what was dropped. Thread-safe: one feeder, one shipper."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.accepted = 0
        self.dropped_bytes = 0
        self.dropped_lines = 0
        self._partial: dict[int, bytearray] = {}
        self._pending = bytearray()
        self._lock = threading.Lock()

    def feed(self, stream: int, data: bytes) -> None:
        """Bytes the runner wrote to ``stream`` (1: stdout, 2: stderr)."""
        with self._lock:
            partial = self._partial.setdefault(stream, bytearray())
            partial += data
            end = partial.rfind(b"\n") + 1
            if end == 0 and len(partial) >= LINE_PIECE:
                end = LINE_PIECE
            if end:
                self._accept(bytes(partial[:end]))
                del partial[:end]

    def pending(self) -> int:
        """Bytes of whole lines waiting to be stored."""
        return len(self._pending)

    def ship(self, store: Callable[[bytes], object]) -> int:
        """Hand what is pending to ``store``; return its size (0: nothing pending). What ``store`` raises is
        raised, and the text stays pending, to try again."""
        with self._lock:
            data = bytes(self._pending)
        if not data:
            return 0
        store(data)  # outside the lock: a slow store must not stop the feeder
        with self._lock:
            del self._pending[:len(data)]
        return len(data)

    def close(self) -> None:
        """The runner is gone: its unfinished lines, and what was dropped, join what is left to store."""
        with self._lock:
            for partial in self._partial.values():
                if partial:
                    self._accept(bytes(partial) + b"\n")
            self._partial.clear()
            if self.dropped_bytes:
                self._pending += (f"[durablerun: {self.dropped_bytes} more bytes in {self.dropped_lines} lines "
                                  f"were not kept: an attempt keeps {self.limit} bytes of logs]\n").encode()
                self.dropped_bytes = self.dropped_lines = 0

    def _accept(self, text: bytes) -> None:
        if self.accepted + len(text) > self.limit:
            self.dropped_bytes += len(text)
            self.dropped_lines += text.count(b"\n")
            return
        self.accepted += len(text)
        self._pending += text


def _say(message: str) -> None:
    with contextlib.suppress(OSError):
        os.write(2, f"durablerun log shipper: {message}\n".encode())


def _forward(fd: int, data: bytes) -> None:
    """All of ``data`` to the container's ``fd``; a reader that went away must not stop the shipping."""
    with contextlib.suppress(OSError):
        while data:
            data = data[os.write(fd, data):]


def open_parts(message: bytes, package_root: str) -> logs.AttemptParts:
    """The attempt's parts in the store a :meth:`Shipper.ship_to` message names. The store's code is
    imported here, the first time there is something to store, from the runner's own ``package_root``."""
    if package_root not in sys.path:
        sys.path.insert(0, package_root)
    from durablerun import resource
    from durablerun._private.records import layout
    from durablerun._private.storage import logs, stores

    named = json.loads(message)
    store = stores.runner_store(resource.Checkpoint.model_validate(named["checkpoint"]))
    return logs.AttemptParts(store.backend, layout.RunRef(**named["run"]), int(named["attempt"]),
                             str(named["writer"]))


class _Store(threading.Thread):
    """Opens the store and stores the pending lines every SHIP_EVERY or SHIP_BYTES, apart from the
    forwarding: a slow store (its imports, S3's retries) must never hold up the runner's writes."""

    def __init__(self, lines: Lines, package_root: str) -> None:
        super().__init__(name="log-store", daemon=True)
        self.lines = lines
        self.package_root = package_root
        self.destination: bytes | None = None
        self.parts: logs.AttemptParts | None = None
        self.wake = threading.Event()
        self.ending = threading.Event()
        self.failing = False
        self.given_up = False

    def to(self, destination: bytes) -> None:
        self.destination = destination
        self.wake.set()

    def run(self) -> None:
        tries_left = ENDING_TRIES
        while tries_left:
            self.wake.wait(SHIP_EVERY)
            self.wake.clear()
            ending = self.ending.is_set()  # after clear(): the wake that comes with the end is never missed
            if self.destination is not None and self.parts is None and self.lines.pending() and not self.given_up:
                self._open(self.destination)
            self._ship_once()
            if ending:
                if self.given_up or not self.lines.pending():
                    return
                tries_left -= 1  # the store failed at the end: try again, a few times, while the runner waits

    def _open(self, destination: bytes) -> None:
        try:
            self.parts = open_parts(destination, self.package_root)
        except Exception as error:
            self.given_up = True
            _say(f"cannot open the store for the logs ({type(error).__name__}: {error}); they are not stored")

    def _ship_once(self) -> None:
        if self.given_up or self.parts is None:
            return
        from durablerun._private.storage import logs  # open_parts imported it

        try:
            self.lines.ship(self.parts.store)
        except logs.PartTaken as taken:
            self.given_up = True
            _say(f"{taken}; this attempt's logs are no longer stored (kubectl logs still has them)")
        except Exception as error:  # the store's trouble is never the attempt's
            if not self.failing:
                _say(f"cannot store the logs ({type(error).__name__}: {error}); trying again, the attempt "
                     "goes on")
            self.failing = True
        else:
            self.failing = False


def serve(out: int, err: int, control: int, lines: Lines, package_root: str) -> None:
    """Forward ``out`` and ``err`` to fds 1 and 2 and store their lines, until the runner has gone."""
    shipper = _Store(lines, package_root)
    shipper.start()
    selector = selectors.DefaultSelector()
    targets = {out: 1, err: 2}
    for fd in (out, err, control):
        os.set_blocking(fd, False)
        selector.register(fd, selectors.EVENT_READ)
    commands, deadline = b"", None
    while targets and (deadline is None or time.monotonic() < deadline):
        timeout = None if deadline is None else max(0.0, deadline - time.monotonic())
        for key, _ in selector.select(timeout):
            fd = int(key.fd)
            try:
                data = os.read(fd, 65536)
            except BlockingIOError:
                continue
            if not data:  # its writers are gone
                selector.unregister(fd)
                os.close(fd)
                targets.pop(fd, None)
                if fd == control:  # the runner ended, or was killed: its steps' children get a moment
                    deadline = time.monotonic() + DRAIN_GRACE
                continue
            if fd == control:
                commands += data
                if b"\n" in commands:
                    shipper.to(commands.split(b"\n", 1)[0])
                continue
            _forward(targets[fd], data)
            lines.feed(targets[fd], data)
            if lines.pending() >= SHIP_BYTES:
                shipper.wake.set()
    lines.close()
    shipper.ending.set()
    shipper.wake.set()
    if shipper.destination is not None:
        shipper.join()


def main(argv: list[str]) -> int:
    # The runner first: its start and its lease renewals must never wait for the shipper's CPU.
    with contextlib.suppress(OSError):
        os.nice(NICE)
    # The runner's signals are the runner's: a SIGTERM to the pod's processes stops the runner at its next
    # step boundary, and the shipper must keep forwarding until the runner has ended.
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    out, err, control, limit = (int(a) for a in argv[:4])
    serve(out, err, control, Lines(limit), argv[4])
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
