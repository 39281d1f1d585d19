"""The model layer: the runner's plain data, shared by every layer above it.

It is one module of over 400 lines because the layers above import these plain
types together, and a record class is read beside ``decode_record``, which must
know every kind.

Journal records and the run's totals, the engine's configuration, and what an
attempt reports (how it started, how it ended, what a Waiting run waits for).
Nothing here does IO, holds a thread, or imports anything of the runner but
the codec and the shared contract (:mod:`durablerun.api`).
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from decimal import Decimal
from typing import Any, ClassVar, NamedTuple

from durablerun import errors
from durablerun._private.records import codec
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
        """Raises ValueError on anything the writer never writes (a NaN or negative amount, a count that is
        not a whole number >= 0)."""
        if not data:
            return cls()
        return cls(money(data.get("usd", "0")), count(data.get("tokens", 0)), count(data.get("steps", 0)))

    def copy(self) -> Totals:
        return Totals(self.usd, self.tokens, self.steps)


def money(value: Any) -> Decimal:
    """An amount of US dollars as records carry it (a decimal string): finite and not negative."""
    if not isinstance(value, str | int) or isinstance(value, bool):
        raise ValueError(f"an amount must be a decimal string, not {value!r}")
    usd = Decimal(value)  # raises InvalidOperation (an ArithmeticError) on text that is no number
    if not usd.is_finite() or usd < 0:
        raise ValueError(f"an amount must be finite and not negative, not {value!r}")
    return usd


def count(value: Any) -> int:
    """A count as records carry it (tokens, steps, attempts): a whole JSON number, not negative."""
    if not isinstance(value, int) or isinstance(value, bool) or value < 0:
        raise ValueError(f"a count must be a whole number >= 0, not {value!r}")
    return value


def _text(value: Any) -> str:
    if not isinstance(value, str):
        raise ValueError(f"expected a string, not {value!r}")
    return value


def seconds(value: Any) -> float:
    """A time or duration as records carry it (Unix seconds): a finite number."""
    if not isinstance(value, int | float) or isinstance(value, bool) or not math.isfinite(value):
        raise ValueError(f"seconds must be a finite number, not {value!r}")
    return float(value)


@dataclass(slots=True)
class Cost:
    """Cost a record charged (a step's own, plus what was charged outside steps since the last record)."""

    usd: Decimal
    tokens: int

    def to_json(self) -> dict[str, Any]:
        return {"usd": str(self.usd), "tokens": self.tokens}


# --- journal records (layout v1) ------------------------------------------------------------
#
# One JSON object per journal position. Every record starts with ``seq``, ``pos``, ``kind``
# and ``name``, goes on with the fields of its kind (below, in their order on the wire) and
# ends with ``w`` (the attempt that wrote it), ``at`` (unix seconds), ``cost`` (when it
# charged any) and ``totals`` (the run's totals with it). A result (a step's, a
# continuation's input, the workflow's) is inline as ``value``, written last, or, when big,
# a blob reference ``ref`` ({"sha256", "size"}); ``model`` names its pydantic class.
# tests/sdk/golden/ pins the format: records written today are byte for byte layout v1's.


@dataclass(slots=True, kw_only=True, eq=False)
class Record:
    """A journal record; the subclasses are its kinds (``kind`` on the wire)."""

    kind: ClassVar[str] = ""
    seq: int = -1
    pos: str
    name: str
    w: str = ""
    at: float = 0.0
    cost: Cost | None = None
    totals: Totals = field(default_factory=Totals)
    #: The record's JSON as stored (set when it is written or read).
    body: bytes | None = None
    #: The decoded value was handed to the workflow once; hand out copies after that.
    handed: bool = False

    def _fields(self) -> dict[str, Any]:
        """The fields of this kind, in their order on the wire."""
        return {}

    def raw(self) -> bytes:
        """The record's JSON: as read, or encoded once."""
        if self.body is None:
            self.body = self.encode()
        return self.body

    def encode(self) -> bytes:
        data: dict[str, Any] = {"seq": self.seq, "pos": self.pos, "kind": self.kind,
                                "name": self.name, **self._fields(), "w": self.w, "at": self.at}
        if self.cost is not None:
            data["cost"] = self.cost.to_json()
        data["totals"] = self.totals.to_json()
        return codec.dumps(data)


class Payload(NamedTuple):
    """How a record carries a result: its JSON inline (``encoded``), or a blob ``ref``."""

    encoded: bytes | None
    ref: dict[str, Any] | None
    model: str | None


@dataclass(slots=True, kw_only=True, eq=False)
class ResultRecord(Record):
    """A record that carries a result: inline ``value`` (written last) or a blob ``ref``."""

    #: The result's JSON, still encoded (records written in this process).
    encoded: bytes | None = None
    #: The result, decoded (records read from the store).
    value: Any = None
    ref: dict[str, Any] | None = None
    model: str | None = None

    def _result_fields(self) -> dict[str, Any]:
        out: dict[str, Any] = {}
        if self.ref is not None:
            out["ref"] = self.ref
        if self.model is not None:
            out["model"] = self.model
        return out

    def encode(self) -> bytes:
        if self.ref is not None:
            return Record.encode(self)
        head = Record.encode(self)[:-1]
        return head + b',"value":' + self.inline_json() + b"}"

    def set_result(self, payload: Payload) -> None:
        self.encoded, self.ref, self.model = payload

    def inline_json(self) -> bytes:
        """The inline result's JSON (not for a blob reference)."""
        return self.encoded if self.encoded is not None else codec.dumps(self.value)


#: A str as JSON, escaped as codec.dumps escapes it (ensure_ascii=False): json's C encoder when present.
_json_str: Callable[[str], str] = json.encoder.encode_basestring


def _finite(x: float) -> str:
    """A float as JSON writes it (its repr); NaN and infinities are not JSON, as codec.dumps refuses them."""
    if x - x != 0.0:
        raise ValueError(f"Out of range float values are not JSON compliant: {x!r}")
    return repr(x)


@dataclass(slots=True, kw_only=True, eq=False)
class StepRecord(ResultRecord):
    """``step``: a step's outcome: ``ok`` and its result, or the ``error`` it failed with."""

    kind: ClassVar[str] = "step"
    ok: bool = True
    #: A failed step: {"type", "module", "message"}.
    error: dict[str, Any] | None = None
    attempts: int = 1
    dur: float = 0.0

    def _fields(self) -> dict[str, Any]:
        out: dict[str, Any] = {"ok": self.ok}
        if self.ok:
            out.update(self._result_fields())
        else:
            out["error"] = self.error
        out["attempts"] = self.attempts
        out["dur"] = self.dur
        return out

    def encode(self) -> bytes:
        t = self.totals
        if (self.ok and self.ref is None and self.cost is None and self.encoded is not None
                and type(self.at) is float and type(self.dur) is float
                and type(t.tokens) is int and type(t.steps) is int):
            # The hot path (every step that succeeded, its result inline): the bytes encode_dict would give
            # (tests/sdk/test_golden.py holds the two together), written out directly, which costs a third
            # of encoding the dict. Strings are escaped by json's own encoder.
            model = f'"model":{_json_str(self.model)},' if self.model is not None else ""
            head = (f'{{"seq":{self.seq:d},"pos":{_json_str(self.pos)},"kind":"step","name":'
                    f'{_json_str(self.name)},"ok":true,{model}"attempts":{self.attempts:d},"dur":{_finite(self.dur)},'
                    f'"w":{_json_str(self.w)},"at":{_finite(self.at)},"totals":{{"usd":{_json_str(str(t.usd))},'
                    f'"tokens":{t.tokens:d},"steps":{t.steps:d}}},"value":')
            return head.encode() + self.encoded + b"}"
        return self.encode_dict()

    def encode_dict(self) -> bytes:
        """Any step record: one flat dict, in the order of _fields and Record.encode."""
        data: dict[str, Any] = {"seq": self.seq, "pos": self.pos, "kind": "step",
                                "name": self.name, "ok": self.ok}
        if not self.ok:
            data["error"] = self.error
        elif self.ref is not None:
            data["ref"] = self.ref
        if self.ok and self.model is not None:
            data["model"] = self.model
        data["attempts"] = self.attempts
        data["dur"] = self.dur
        data["w"] = self.w
        data["at"] = self.at
        if self.cost is not None:
            data["cost"] = self.cost.to_json()
        data["totals"] = self.totals.to_json()
        if not self.ok or self.ref is not None:
            return codec.dumps(data)
        return codec.dumps(data)[:-1] + b',"value":' + self.inline_json() + b"}"


@dataclass(slots=True, kw_only=True, eq=False)
class ValueRecord(Record):
    """``value``: what ctx.now() (``name`` "now") or ctx.uuid() ("uuid") returned."""

    kind: ClassVar[str] = "value"
    value: str = ""

    def _fields(self) -> dict[str, Any]:
        return {"value": self.value}


@dataclass(slots=True, kw_only=True, eq=False)
class SleepRecord(Record):
    """``sleep``: when a ctx.sleep() wakes up (``wake_at``, RFC 3339)."""

    kind: ClassVar[str] = "sleep"
    wake_at: str = ""

    def _fields(self) -> dict[str, Any]:
        return {"wake_at": self.wake_at}


@dataclass(slots=True, kw_only=True, eq=False)
class WaitRecord(Record):
    """``wait``: a ctx.wait_for_event() began, with its ``deadline`` (RFC 3339, or null)."""

    kind: ClassVar[str] = "wait"
    deadline: str | None = None

    def _fields(self) -> dict[str, Any]:
        return {"deadline": self.deadline}


@dataclass(slots=True, kw_only=True, eq=False)
class EventRecord(Record):
    """``event``: the wait at the same position ended: the event's payload, or its timeout."""

    kind: ClassVar[str] = "event"
    ok: bool = True
    value: Any = None
    event_id: str | None = None
    timeout: bool = False

    def _fields(self) -> dict[str, Any]:
        if self.ok:
            return {"ok": True, "value": self.value, "event_id": self.event_id}
        return {"ok": False, "timeout": self.timeout}


@dataclass(slots=True, kw_only=True, eq=False)
class PatchRecord(Record):
    """``patch``: a ctx.patched() marker (``name`` is the change id)."""

    kind: ClassVar[str] = "patch"


@dataclass(slots=True, kw_only=True, eq=False)
class ContinueRecord(ResultRecord):
    """``continue``: ctx.continue_as_new() ended a generation; ``gen`` starts, with this input."""

    kind: ClassVar[str] = "continue"
    gen: int = 1

    def _fields(self) -> dict[str, Any]:
        return {"gen": self.gen, **self._result_fields()}


@dataclass(slots=True, kw_only=True, eq=False)
class CompleteRecord(ResultRecord):
    """``complete``: the workflow's result (at position ``end``)."""

    kind: ClassVar[str] = "complete"

    def _fields(self) -> dict[str, Any]:
        return self._result_fields()


RECORD_KINDS: dict[str, type[Record]] = {
    cls.kind: cls for cls in (StepRecord, ValueRecord, SleepRecord, WaitRecord, EventRecord,
                              PatchRecord, ContinueRecord, CompleteRecord)
}


def decode_record(seq: int, data: Any, body: bytes, where: str) -> Record:
    """The typed record of a stored record's JSON ``data`` (its bytes: ``body``).

    Raises CorruptionError when it is not a layout-v1 record stored at ``seq``.
    """
    if not isinstance(data, dict) or data.get("seq") != seq:
        claimed = data.get("seq") if isinstance(data, dict) else "?"
        raise errors.CorruptionError(
            f"journal record claims seq {claimed} but is stored at {seq}", key=where)
    kind = data.get("kind")
    cls = RECORD_KINDS.get(kind) if isinstance(kind, str) else None
    if cls is None:
        raise errors.CorruptionError(
            f"journal record {seq} has unknown kind {data.get('kind')!r}", key=where)
    try:
        return _decode(cls, seq, data, body)
    except (KeyError, TypeError, ValueError, AttributeError, ArithmeticError) as e:
        # A record the writer never writes (a field missing, of the wrong type, NaN): damage or a
        # hand-edit, named as such rather than surfacing as a KeyError in the middle of a replay.
        raise errors.CorruptionError(f"journal record {seq} ({cls.kind}) is malformed: {e!s}", key=where) from e


def _decode(cls: type[Record], seq: int, data: dict[str, Any], body: bytes) -> Record:
    cost = data.get("cost")
    common: dict[str, Any] = {
        "seq": seq, "pos": _text(data["pos"]), "name": str(data.get("name", "")),
        "w": str(data.get("w", "")), "at": seconds(data.get("at", 0)),
        "cost": Cost(money(cost.get("usd", "0")), count(cost.get("tokens", 0))) if cost else None,
        "totals": Totals.from_json(data.get("totals")), "body": body,
    }
    get = data.get
    if cls is StepRecord:
        return StepRecord(**common, ok=bool(get("ok")), value=get("value"), ref=get("ref"),
                          model=get("model"), error=get("error"), attempts=count(get("attempts", 1)),
                          dur=seconds(get("dur", 0)))
    if cls is ValueRecord:
        return ValueRecord(**common, value=str(data["value"]))
    if cls is SleepRecord:
        return SleepRecord(**common, wake_at=str(data["wake_at"]))
    if cls is WaitRecord:
        return WaitRecord(**common, deadline=get("deadline"))
    if cls is EventRecord:
        return EventRecord(**common, ok=bool(get("ok")), value=get("value"),
                           event_id=get("event_id"), timeout=bool(get("timeout")))
    if cls is ContinueRecord:
        gen = get("gen")
        if not isinstance(gen, int) or isinstance(gen, bool) or gen < 1:
            raise ValueError("a continuation needs a generation number >= 1")
        return ContinueRecord(**common, gen=gen, value=get("value"), ref=get("ref"),
                              model=get("model"))
    if cls is CompleteRecord:
        return CompleteRecord(**common, value=get("value"), ref=get("ref"), model=get("model"))
    return cls(**common)


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
    #: On a store whose journal writes several records in one request (S3): records committed while a
    #: write is in flight go out together in the next one (each still durable before its step returns).
    #: False: one request per record (the bench compares the two).
    group_commit: bool = True
    #: Output streams (``ctx.stream``): a stream's buffered writes become a chunk once they reach this many
    #: bytes, or once the oldest is this many seconds old (and always before their step is journaled).
    stream_batch_bytes: int = 64 * 1024
    stream_batch_seconds: float = 0.25
    #: Bytes a stream holds in memory before its writes wait for the store (bounded memory).
    stream_buffer_bytes: int = 1024 * 1024
    #: The largest single write, in bytes (so the largest chunk); a bigger one fails its step for good.
    stream_max_write_bytes: int = 256 * 1024
    #: Chunks a stream may hold, over all attempts; past it the writing step fails for good.
    stream_max_chunks: int = 100_000
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
    #: How the run asks for child runs and signals (durablerun._private.engine.children.RunBroker): the runner pod
    #: sets it; None (a local run): ctx.start_child and ctx.signal fail, saying they need the operator.
    runs: Any = None
    #: Set (durablerun._private.tools.replayer): the attempt only replays. It executes no step, sleeps and waits for
    #: nothing and writes nothing; where the journal ends or diverges it stops, and says so here.
    replay: ReplayProbe | None = None


@dataclass(frozen=True)
class Divergence:
    """Where new code first asks for something other than what the journal holds."""

    position: str
    #: What the journal holds there ("step 'plan'"), and what the code asks for ("step 'plan-v2'";
    #: "nothing" when the workflow finished without reaching it).
    expected: str
    found: str
    message: str


@dataclass
class ReplayProbe:
    """What a replay-only attempt (``EngineConfig.replay``) found; filled in by the runtime."""

    #: The first divergence, if any (concurrent branches may find several: the first one found).
    divergence: Divergence | None = None
    #: The first operation past the journal's end ("step 'review' at position 4"): the run would go on there.
    end: str | None = None


@dataclass(frozen=True)
class WaitingFor:
    """What a Waiting run waits for: an event (maybe with a deadline) or a wake time."""

    event: str | None = None
    deadline: datetime | None = None
    wake_time: datetime | None = None
    since: datetime | None = None
    #: Saga compensations registered and not run when the wait began (what an abort meanwhile undoes).
    compensations: int = 0
    #: The policy.askAt field the run reached: it waits for a person to raise it.
    budget: str | None = None
    #: The model quota a call found no room in: the run waits until its wake time, when the room is due.
    quota: str | None = None

    def to_json(self) -> dict[str, Any]:
        doc: dict[str, Any] = {
            "event": self.event,
            "deadline": format_time(self.deadline, precise=True) if self.deadline else None,
            "wakeTime": format_time(self.wake_time, precise=True) if self.wake_time else None,
            "since": format_time(self.since, precise=True) if self.since else None,
        }
        if self.compensations:
            doc["compensations"] = self.compensations
        if self.budget:
            doc["budget"] = self.budget
        if self.quota:
            doc["quota"] = self.quota
        return doc

    @classmethod
    def from_json(cls, data: dict[str, Any] | None) -> WaitingFor | None:
        if not data:
            return None

        def t(key: str) -> datetime | None:
            v = data.get(key)
            return parse_time(v) if v else None

        return cls(data.get("event"), t("deadline"), t("wakeTime"), t("since"), budget=data.get("budget"),
                   quota=data.get("quota"))


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
    #: Completed: where the result is stored (resource.RunResult's fields: ref, size, sha256, and
    #: inline, its JSON text, when at most resource.RESULT_INLINE_MAX bytes).
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
    #: The journal as loaded (from ``first_loaded`` on): read it, never change it.
    journal: Sequence[Record] = ()
