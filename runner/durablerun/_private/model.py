"""The model layer: the runner's plain data, shared by every layer above it.

Journal records and the run's totals, the engine's configuration, and what an
attempt reports (how it started, how it ended, what a Waiting run waits for).
Nothing here does IO, holds a thread, or imports anything of the runner but
the codec and the shared contract (:mod:`durablerun.api`).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from decimal import Decimal
from typing import Any

from durablerun._private import codec
from durablerun.api import AbortReason, Outcome, format_time, parse_time


@dataclass
class Totals:
    """The run's journaled counters."""

    usd: Decimal = Decimal(0)
    tokens: int = 0
    steps: int = 0

    def to_json(self) -> dict[str, Any]:
        return {"usd": str(self.usd), "tokens": self.tokens, "steps": self.steps}

    @classmethod
    def from_json(cls, data: dict[str, Any] | None) -> Totals:
        if not data:
            return cls()
        return cls(Decimal(str(data.get("usd", "0"))), int(data.get("tokens", 0)),
                   int(data.get("steps", 0)))

    def copy(self) -> Totals:
        return Totals(self.usd, self.tokens, self.steps)


@dataclass
class Record:
    seq: int
    data: dict[str, Any]
    body: bytes | None = None
    #: The decoded value was handed to the workflow once; hand out copies after that.
    handed: bool = False

    @property
    def pos(self) -> str:
        return str(self.data["pos"])

    @property
    def kind(self) -> str:
        return str(self.data["kind"])

    @property
    def name(self) -> str:
        return str(self.data.get("name", ""))

    def raw(self) -> bytes:
        if self.body is None:
            self.body = codec.dumps(self.data)
        return self.body

    def value(self) -> Any:
        """The record's inline ``value`` as plain JSON (records written in this
        process keep it encoded until someone asks)."""
        value = self.data.get("value")
        raw = getattr(value, "data", None)
        if isinstance(raw, bytes):
            return codec.loads(raw, what=f"record {self.seq}")
        return value


@dataclass(frozen=True)
class EngineConfig:
    """Tuning of the engine. Every field has a safe default."""

    #: Save a snapshot every this many journal records (``checkpoint.snapshotEvery``).
    snapshot_every: int = 100
    #: Results bigger than this (bytes of JSON) are stored as their own object.
    inline_result_max: int = 256 * 1024
    #: Results bigger than this fail the step, without retries.
    result_hard_limit: int = 64 * 1024 * 1024
    #: Sleeps (and waits for a wake time) up to this long happen in process.
    inline_sleep_max: timedelta = timedelta(seconds=60)
    #: First delay between retries of a failing step; doubles per retry (with jitter).
    retry_initial: timedelta = timedelta(seconds=1)
    #: Upper bound of the delay between retries.
    retry_max: timedelta = timedelta(seconds=60)
    #: After a stop request, running steps get this long to finish and be journaled.
    stop_grace: timedelta = timedelta(seconds=20)
    #: Interval of heartbeat progress events.
    heartbeat_interval: timedelta = timedelta(seconds=10)
    #: The workflow code's version; default: a hash of the workflow module's source.
    code_version: str | None = None
    #: Run sync step functions in worker threads (so they can overlap and be abandoned).
    sync_steps_in_threads: bool = True
    #: Worker threads for sync steps.
    max_sync_threads: int = 32
    #: Asked before every journal write: a reason when this process may no longer
    #: write (e.g. its lease lapsed while it was paused), None when it may. A
    #: reason fences the attempt before anything is written.
    write_guard: Callable[[], str | None] | None = None
    #: How a user raises policy field ``f`` where the run runs, for abort messages
    #: (the CLI names its flags, the runner pod a kubectl patch); None: generic advice.
    policy_advice: Callable[[str], str] | None = None
    #: Time the run was active before this attempt (on Kubernetes: status.activeSeconds, the time it had a
    #: pod). Set: maxDuration counts that plus this attempt. None: it counts from the run's first start.
    active_before: timedelta | None = None
    #: A retried run (on Kubernetes: status.retryTime): a step whose failure was journaled before this moment
    #: is executed again instead of replayed as a failure. None: journaled failures replay as they are.
    rerun_failed_before: datetime | None = None


@dataclass(frozen=True)
class WaitingFor:
    """What a Waiting run waits for: an event (maybe with a deadline) or a wake time."""

    event: str | None = None
    deadline: datetime | None = None
    wake_time: datetime | None = None
    since: datetime | None = None

    def to_json(self) -> dict[str, Any]:
        return {
            "event": self.event,
            "deadline": format_time(self.deadline, precise=True) if self.deadline else None,
            "wakeTime": format_time(self.wake_time, precise=True) if self.wake_time else None,
            "since": format_time(self.since, precise=True) if self.since else None,
        }

    @classmethod
    def from_json(cls, data: dict[str, Any] | None) -> WaitingFor | None:
        if not data:
            return None

        def t(key: str) -> datetime | None:
            v = data.get(key)
            return parse_time(v) if v else None

        return cls(data.get("event"), t("deadline"), t("wakeTime"), t("since"))


@dataclass(frozen=True)
class AttemptResult:
    """How one attempt ended. Exactly one per attempt."""

    outcome: Outcome
    message: str
    abort_reason: AbortReason | None = None
    #: The workflow's return value (Completed only).
    result: Any = None
    waiting: WaitingFor | None = None
    totals: Totals = field(default_factory=Totals)
    #: Journal records written so far (the next sequence number).
    journal_records: int = 0
    #: Qualified name of the error behind a Failed / UsageError outcome.
    error_type: str | None = None
    #: A budget the totals went past (a step charged it after the check before it), else None.
    overshoot: str | None = None
    #: Completed: where the result is stored (api.RunResult's fields: ref, size, sha256, and
    #: inline, its JSON text, when at most api.RESULT_INLINE_MAX bytes).
    result_info: dict[str, Any] | None = None

    @property
    def exit_code(self) -> int:
        return self.outcome.exit_code

    def to_json(self) -> dict[str, Any]:
        return {
            "outcome": self.outcome.value,
            "message": self.message,
            "abortReason": self.abort_reason.value if self.abort_reason else None,
            "waitingFor": self.waiting.to_json() if self.waiting else None,
            "cost": {"usd": str(self.totals.usd), "tokens": self.totals.tokens},
            "steps": self.totals.steps,
            "journalRecords": self.journal_records,
            "errorType": self.error_type,
            "overshoot": self.overshoot,
            "resultRef": self.result_info["ref"] if self.result_info else None,
        }

    def termination_message(self) -> str:
        """Compact JSON for the container's termination message (under 4 KiB)."""
        doc = self.to_json()
        text = json.dumps(doc, separators=(",", ":"))
        if len(text.encode()) > 3800:
            doc["message"] = self.message[:2000] + " ..."
            text = json.dumps(doc, separators=(",", ":"))
        return text


@dataclass(frozen=True)
class RunStarted:
    run: str
    attempt_id: str
    journal_records: int
    resumed: bool
    objects_read: int
    code_version: str
    #: The workflow generation the attempt resumes (0 until ctx.continue_as_new is called).
    generation: int = 0
    #: Sequence number of the record the loaded journal starts at (its last continuation).
    first_loaded: int = 0
