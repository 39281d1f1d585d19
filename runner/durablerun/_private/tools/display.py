"""What ``durablerun run`` shows while it runs: a live status line on a terminal,
plain lines otherwise."""

from __future__ import annotations

import shutil
import sys
import threading
import time
from decimal import Decimal
from typing import IO

from durablerun._private.engine.sinks import ProgressSink
from durablerun._private.records.model import AttemptResult, RunStarted


def retrying_line(position: str, name: str, attempt: int, delay: float, error: str) -> str:
    return f"step {position} {name!r} attempt {attempt} raised {error}: retrying in {delay:.2f}s"


def failed_text(position: str, name: str, attempts: int, traceback: str) -> str:
    tries = "attempt" if attempts == 1 else "attempts"
    return f"step {position} {name!r} failed after {attempts} {tries}; its traceback:\n{traceback}"


class PlainProgress(ProgressSink):
    """One line per step: for logs and pipes."""

    def __init__(self, stream: IO[str] | None = None) -> None:
        self.stream = stream or sys.stderr

    def _line(self, text: str) -> None:
        self.stream.write(f"durablerun: {text}\n")
        self.stream.flush()

    def run_started(self, *, info: RunStarted) -> None:
        if info.resumed:
            gen = (f", generation {info.generation} (read from record {info.first_loaded})"
                   if info.generation else "")
            self._line(f"resuming {info.run}: {info.journal_records} journal records{gen} "
                       f"({info.objects_read} objects read)")
        else:
            self._line(f"starting {info.run}")

    def step_completed(
        self, *, position: str, name: str, seq: int, ok: bool, duration: float
    ) -> None:
        state = "done" if ok else "FAILED"
        self._line(f"step {position} {name!r} {state} in {duration:.3f}s")

    def step_retrying(self, *, position: str, name: str, attempt: int, delay: float, error: str) -> None:
        self._line(retrying_line(position, name, attempt, delay, error))

    def step_failed(self, *, position: str, name: str, attempts: int, traceback: str) -> None:
        self._line(failed_text(position, name, attempts, traceback))

    def continued_as_new(self, *, generation: int, seq: int) -> None:
        self._line(f"continued as new: generation {generation} starts after journal record {seq}")

    def warning(self, message: str) -> None:
        self._line(f"warning: {message}")


class TtyProgress(ProgressSink):
    """A single redrawn status line: steps done, the current step, cost."""

    def __init__(self, stream: IO[str] | None = None) -> None:
        self.stream = stream or sys.stderr
        self.done = 0
        self.current = ""
        self.usd = Decimal(0)
        self.tokens = 0
        self.generation = 0
        self.total: int | None = None
        self.started = time.monotonic()
        self._lock = threading.Lock()
        self._last_draw = 0.0

    def _draw(self, force: bool = False) -> None:
        now = time.monotonic()
        if not force and now - self._last_draw < 0.05:
            return
        self._last_draw = now
        width = shutil.get_terminal_size((80, 20)).columns
        gen = f"gen {self.generation} · " if self.generation else ""
        done = f"{self.done}/{self.total}" if self.total else str(self.done)
        text = (f"⏵ {done} steps · {gen}now: {self.current or '-'} · ${self.usd} · "
                f"{self.tokens} tokens · {now - self.started:.0f}s")
        with self._lock:
            self.stream.write("\r\x1b[2K" + text[: max(10, width - 1)])
            self.stream.flush()

    def run_started(self, *, info: RunStarted) -> None:
        verb = "resuming" if info.resumed else "starting"
        self.generation = info.generation
        gen = f", generation {info.generation}" if info.generation else ""
        self.stream.write(f"{verb} {info.run} ({info.journal_records} journal records{gen})\n")

    def step_started(self, *, position: str, name: str, attempt: int) -> None:
        self.current = name if attempt == 1 else f"{name} (try {attempt})"
        self._draw()

    def step_completed(
        self, *, position: str, name: str, seq: int, ok: bool, duration: float
    ) -> None:
        # The run's step count comes with cost_updated (right before this): resumes included.
        if not ok:
            self.stream.write(f"\r\x1b[2Kstep {position} {name!r} FAILED\n")
        self._draw()

    def step_retrying(self, *, position: str, name: str, attempt: int, delay: float, error: str) -> None:
        self.stream.write(f"\r\x1b[2K{retrying_line(position, name, attempt, delay, error)}\n")

    def step_failed(self, *, position: str, name: str, attempts: int, traceback: str) -> None:
        self.stream.write(f"\r\x1b[2K{failed_text(position, name, attempts, traceback)}\n")

    def cost_updated(self, *, usd: Decimal, tokens: int, steps: int) -> None:
        self.usd, self.tokens, self.done = usd, tokens, steps
        self._draw()

    def continued_as_new(self, *, generation: int, seq: int) -> None:
        self.generation = generation
        self._draw()

    def total_steps_updated(self, *, total: int | None, steps: int) -> None:
        self.total, self.done = total, steps
        self._draw()

    def warning(self, message: str) -> None:
        self.stream.write(f"\r\x1b[2Kwarning: {message}\n")

    def run_finished(self, *, result: AttemptResult) -> None:
        self._draw(force=True)
        self.stream.write("\n")
        self.stream.flush()
