"""ctx.continue_as_new: generations of a workflow, and a resume that reads only the last one."""

from __future__ import annotations

import re
import threading
from collections import Counter
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from typing import Any

import pytest

from durablerun import DurableContext, EventTimeout, ResultNotSerializableError, StepError
from durablerun._private.records import codec, layout
from durablerun._private.records.model import ContinueRecord, Record
from durablerun._private.storage.journal import RunStore
from durablerun.api import AbortReason, Outcome
from durablerun.engine import AttemptResult, EngineConfig, Run, RunStarted
from durablerun.resource import Policy
from durablerun.sinks import ProgressSink
from durablerun.stores import RunRef, Store
from tests.helpers.local_runs import StoreSpec, wait_until

from .helpers import FAST, REF, Ledger, attempt


class Started(ProgressSink):
    def __init__(self) -> None:
        self.infos: list[RunStarted] = []
        self.continued: list[tuple[int, int]] = []

    def run_started(self, *, info: RunStarted) -> None:
        self.infos.append(info)

    def continued_as_new(self, *, generation: int, seq: int) -> None:
        self.continued.append((generation, seq))


def all_records(store: Store, ref: RunRef = REF) -> list[Record]:
    rs = store.run_store(ref)
    try:
        return rs.read_all()
    finally:
        rs.close()


# --- the loop every test below builds on -------------------------------------------------------


def looping(ledger: Ledger, *, every: int, total: int, wait: bool = True,
            history: bool = True) -> Any:
    """``total`` steps, ``every`` per generation; each generation waits for ``go-<gen>``
    half way (so an attempt ends and the next resumes inside every generation). With
    ``history`` the input carries every idempotency key and uuid so far."""

    async def wf(ctx: DurableContext, state: dict[str, Any]) -> Any:
        i, gen = state.get("i", 0), state.get("gen", 0)
        keys, stamps = list(state.get("keys", [])), list(state.get("stamps", []))
        stamps.append(str(ctx.uuid()))

        def work(n: int) -> dict[str, Any]:
            ledger.hit(n)
            ctx.add_cost(usd=Decimal("0.01"), tokens=10)
            return {"n": n, "key": ctx.idempotency_key()}

        for j in range(every):
            if i >= total:
                return {"i": i, "keys": keys, "stamps": stamps, "gen": gen}
            if wait and j == every // 2:
                await ctx.wait_for_event(f"go-{gen}")
            out = await ctx.step("work", work, i)
            assert out["n"] == i
            keys.append(out["key"])
            i += 1
        await ctx.continue_as_new({"i": i, "gen": gen + 1, "keys": keys if history else [],
                                   "stamps": stamps if history else []})

    return wf


def run_to_end(store: Store, wf: Any, *, ref: RunRef = REF, config: EngineConfig = FAST,
               policy: Policy | None = None, limit: int = 200) -> tuple[AttemptResult, int]:
    """Attempt, sending each event the run waits for, until it stops waiting."""
    attempts = 0
    while True:
        r = attempt(store, wf, ref=ref, config=config, policy=policy)
        attempts += 1
        if r.outcome != Outcome.WAITING or r.waiting is None or r.waiting.event is None:
            return r, attempts
        assert store.put_event(run=ref, name=r.waiting.event, payload=None)
        assert attempts < limit


def test_a_loop_runs_across_generations_and_resumes_inside_each(store_spec: StoreSpec) -> None:
    store = store_spec.open()
    ledger = Ledger()
    wf = looping(ledger, every=6, total=22)
    r, attempts = run_to_end(store, wf)
    assert r.outcome == Outcome.COMPLETED, r.message
    assert attempts == 5  # one Waiting attempt per generation, then the last one completes
    assert r.result["i"] == 22
    assert r.result["gen"] == 3
    # Every step executed exactly once, across generations and resumes.
    assert ledger.calls == Counter({n: 1 for n in range(22)})
    # Totals carry across generations.
    assert r.totals.steps == 22
    assert r.totals.usd == Decimal("0.22")
    assert r.totals.tokens == 220
    # Idempotency keys never repeat: each generation prefixes its positions.
    keys = r.result["keys"]
    assert len(set(keys)) == 22
    for n, key in enumerate(keys):
        gen = n // 6
        assert re.fullmatch(rf"{re.escape(REF.key)}:{gen}/\d+:work" if gen else
                            rf"{re.escape(REF.key)}:\d+:work", key), key
    # ctx.uuid: one per generation, different in each, the same on every replay.
    assert len(r.result["stamps"]) == 4
    assert len(set(r.result["stamps"])) == 4
    # The journal: each generation's records carry its prefix; a continuation ends it.
    records = all_records(store)
    conts = [rec for rec in records if rec.kind == "continue"]
    assert [rec.gen for rec in conts] == [1, 2, 3]
    gen = 0
    for rec in records:
        if isinstance(rec, ContinueRecord):
            assert ("/" in rec.pos) == (gen > 0)
            gen = rec.gen
        elif rec.kind != "complete":
            assert rec.pos.startswith(f"{gen}/") if gen else "/" not in rec.pos, rec.raw()
    # Re-running a completed run returns its result without running anything.
    again = attempt(store, wf)
    assert again.outcome == Outcome.COMPLETED
    assert again.result == r.result
    assert sum(ledger.calls.values()) == 22


def test_in_one_attempt_the_generations_run_back_to_back_and_memory_stays_bounded(
    mem: Store,
) -> None:
    ledger = Ledger()
    held: list[int] = []
    run_box: list[Run] = []

    class Probe(Started):
        def continued_as_new(self, *, generation: int, seq: int) -> None:
            super().continued_as_new(generation=generation, seq=seq)
            core = run_box[0]._core
            assert core is not None
            held.append(len(core.live.loaded.records))

    probe = Probe()
    run = Run(store=mem, run=REF, workflow=looping(ledger, every=25, total=250, wait=False),
              input={}, config=FAST, sinks=[probe])
    run_box.append(run)
    r = run.run_attempt()
    assert r.outcome == Outcome.COMPLETED, r.message
    assert r.totals.steps == 250
    assert [g for g, _ in probe.continued] == list(range(1, 11))
    # The attempt keeps only the current generation's records, not the whole history.
    assert held == [1] * 10
    assert ledger.calls == Counter({n: 1 for n in range(250)})


# --- what a resume reads ----------------------------------------------------------------------------


class Reads:
    """Counts what a load reads: store keys, journal records decoded, bytes unsealed."""

    def __init__(self, store: Store, monkeypatch: pytest.MonkeyPatch) -> None:
        self.keys: list[str] = []
        self.decoded: list[int] = []
        self.unsealed = 0
        backend = store.backend
        for name in ("get", "get_versioned"):
            original = getattr(backend, name)
            monkeypatch.setattr(backend, name, self._wrap_one(original))
        original_many = backend.get_many
        monkeypatch.setattr(backend, "get_many", self._wrap_many(original_many))
        real_decode = RunStore._decode_record
        real_unseal = codec.unseal

        def decode(rs: RunStore, seq: int, sealed: bytes, where: str) -> Record:
            self.decoded.append(seq)
            return real_decode(rs, seq, sealed, where)

        def unseal(data: bytes, *, what: str) -> bytes:
            self.unsealed += len(data)
            return real_unseal(data, what=what)

        monkeypatch.setattr(RunStore, "_decode_record", decode)
        monkeypatch.setattr(codec, "unseal", unseal)

    def _wrap_one(self, fn: Callable[[str], Any]) -> Callable[[str], Any]:
        def wrapped(key: str) -> Any:
            self.keys.append(key)
            return fn(key)
        return wrapped

    def _wrap_many(self, fn: Callable[[Any], Any]) -> Callable[[Any], Any]:
        def wrapped(keys: Any) -> Any:
            self.keys.extend(keys)
            return fn(keys)
        return wrapped

    def clear(self) -> None:
        self.keys, self.decoded, self.unsealed = [], [], 0


def _pointer(store: Store, ref: RunRef) -> dict[str, Any]:
    key = store.run_store(ref).key(layout.SNAPSHOT)
    raw = store.backend.get(key)
    assert raw is not None
    return dict(codec.loads(codec.unseal(raw, what=key), what=key))


def test_a_resume_reads_only_the_last_generation(store_spec: StoreSpec,
                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    """After 3 or after 30 generations of the same size, a resume reads the same objects
    and decodes the same records: those of the last generation, never an earlier one."""
    store = store_spec.open()
    measured: dict[int, tuple[int, int, int]] = {}
    for gens in (3, 30):
        ref = RunRef.local(f"gens-{gens}")
        ledger = Ledger()
        every = 10
        total = every * gens
        wf = looping(ledger, every=every, total=total, history=False)
        # Run every generation but the last to its end, without attempts in between.
        for g in range(gens):
            store.put_event(run=ref, name=f"go-{g}", payload=None)
        last = f"go-{gens - 1}"
        store.run_store(ref).backend.delete([store.run_store(ref).key(layout.event_key(last))])
        r = attempt(store, wf, ref=ref)
        assert r.outcome == Outcome.WAITING, r.message
        assert r.waiting is not None
        assert r.waiting.event == last
        pointer = _pointer(store, ref)
        records = all_records(store, ref)
        base = max(rec.seq for rec in records if rec.kind == "continue")
        assert pointer["base"] == base
        assert all(c["first"] >= base for c in pointer["chunks"])

        reads = Reads(store, monkeypatch)
        sink = Started()
        store.put_event(run=ref, name=last, payload=None)
        reads.clear()
        done = attempt(store, wf, ref=ref, sinks=[sink])
        monkeypatch.undo()
        assert done.outcome == Outcome.COMPLETED, done.message
        assert done.result["i"] == total
        assert sum(ledger.calls.values()) == total
        info = sink.infos[0]
        assert info.generation == gens - 1
        assert info.first_loaded == base
        # Only the current pointer's chunks, and journal records after the snapshot.
        chunk_keys = [k for k in reads.keys if "/chunks/" in k]
        assert set(chunk_keys) == {store.run_store(ref).key(c["key"]) for c in pointer["chunks"]}
        assert all(seq > pointer["seq"] for seq in reads.decoded)
        assert reads.unsealed > 0
        measured[gens] = (info.objects_read, len(reads.decoded), reads.unsealed)
    (objects_3, decoded_3, bytes_3), (objects_30, decoded_30, bytes_30) = measured[3], measured[30]
    assert objects_30 == objects_3
    assert decoded_30 == decoded_3
    # Same sizes but for the digits of the counters the records carry.
    assert bytes_30 <= bytes_3 * 1.1, measured


def test_a_continuation_after_the_snapshot_is_found_in_the_tail_and_the_chunks_are_not_read(
    store_spec: StoreSpec, monkeypatch: pytest.MonkeyPatch,
) -> None:
    store = store_spec.open()

    async def wf(ctx: DurableContext, state: dict[str, Any]) -> Any:
        gen = state.get("gen", 0)
        for k in range(9):
            await ctx.step(f"g{gen}-{k}", lambda k=k: k)
        if gen == 0:
            await ctx.continue_as_new({"gen": 1})
        await ctx.step("after", lambda: "a")
        await ctx.wait_for_event("go")
        return gen

    # Snapshots every 8 records: gen 0 is 9 steps + the continuation (seq 9). The attempt
    # ends Waiting and saves a final snapshot; take the pointer back to before the
    # continuation, as if the process had died before any later snapshot.
    rs = store.run_store(REF)
    assert attempt(store, wf, config=EngineConfig(snapshot_every=8)).outcome == Outcome.WAITING
    pointer_key = rs.key(layout.SNAPSHOT)
    pointer = _pointer(store, REF)
    assert pointer["base"] == 9
    old = [rec for rec in all_records(store) if rec.seq <= 7]
    chunk_body = b"[\n" + b",\n".join(rec.raw() for rec in old) + b"\n]"
    chunk = layout.chunk_key(codec.sha256_hex(chunk_body))
    store.backend.create(rs.key(chunk), codec.seal(chunk_body))
    stale = {**pointer, "seq": 7, "base": 0, "chunks": [{"key": chunk, "first": 0, "last": 7}]}
    store.backend.put(pointer_key, codec.seal(codec.dumps(stale)))

    reads = Reads(store, monkeypatch)
    loaded = store.run_store(REF).load()
    monkeypatch.undo()
    assert not [k for k in reads.keys if "/chunks/" in k]
    assert loaded.base == 9
    assert loaded.records[0].kind == "continue"
    assert [rec.seq for rec in loaded.records] == list(range(9, 9 + len(loaded.records)))
    store.put_event(run=REF, name="go", payload=None)
    done = attempt(store, wf, config=EngineConfig(snapshot_every=8))
    assert done.outcome == Outcome.COMPLETED, done.message
    assert done.result == 1
    # The snapshot saved at the end starts at the continuation; the old chunk is still there.
    after = _pointer(store, REF)
    assert after["base"] == 9
    assert after["chunks"][0]["first"] == 9
    assert store.backend.get(rs.key(chunk)) is not None


def test_a_missing_chunk_falls_back_to_the_journal_from_the_last_continuation(
    store_spec: StoreSpec, monkeypatch: pytest.MonkeyPatch,
) -> None:
    store = store_spec.open()
    ledger = Ledger()
    wf = looping(ledger, every=8, total=40)
    for g in range(4):
        store.put_event(run=REF, name=f"go-{g}", payload=None)
    assert attempt(store, wf).outcome == Outcome.WAITING  # in generation 4, half way
    pointer = _pointer(store, REF)
    rs = store.run_store(REF)
    store.backend.delete([rs.key(pointer["chunks"][0]["key"])])
    warnings: list[str] = []

    class Warn(ProgressSink):
        def warning(self, message: str) -> None:
            warnings.append(message)

    reads = Reads(store, monkeypatch)
    store.put_event(run=REF, name="go-4", payload=None)
    done = attempt(store, wf, sinks=[Warn()])
    monkeypatch.undo()
    assert done.outcome == Outcome.COMPLETED, done.message
    assert done.result["i"] == 40
    assert sum(ledger.calls.values()) == 40
    assert any("read the whole journal" in w for w in warnings)
    assert min(reads.decoded) == pointer["base"]  # the journal from the continuation on only


# --- misuse and bad inputs ------------------------------------------------------------------------


def test_continue_as_new_inside_a_step_is_an_error(mem: Store) -> None:
    async def wf(ctx: DurableContext, input: Any) -> Any:
        async def bad() -> None:
            await ctx.continue_as_new({})

        await ctx.step("bad", bad)

    r = attempt(mem, wf)
    assert r.outcome == Outcome.FAILED
    assert "ctx.continue_as_new() was called inside a step" in r.message
    assert not [rec for rec in all_records(mem) if rec.kind == "continue"]


def test_continue_as_new_inside_a_gather_branch_is_an_error(mem: Store) -> None:
    async def branch(ctx: DurableContext) -> None:
        await ctx.step("one", lambda: 1)
        await ctx.continue_as_new({})

    async def wf(ctx: DurableContext, input: Any) -> Any:
        await ctx.gather(branch(ctx), ctx.step("other", lambda: 2))

    r = attempt(mem, wf)
    assert r.outcome == Outcome.FAILED
    assert "inside a ctx.gather branch (position 1.0)" in r.message
    assert "call it from the workflow function after the gather" in r.message
    assert not [rec for rec in all_records(mem) if rec.kind == "continue"]


def test_continue_as_new_with_a_step_still_running_is_an_error(mem: Store) -> None:
    import asyncio

    release = threading.Event()

    def slow() -> int:
        release.wait(10)
        return 1

    async def wf(ctx: DurableContext, input: Any) -> Any:
        task = asyncio.ensure_future(ctx.step("slow", slow))
        await asyncio.sleep(0.05)
        try:
            await ctx.continue_as_new({})
        finally:
            release.set()
            await task

    r = attempt(mem, wf)
    assert r.outcome == Outcome.FAILED
    assert "while 1 step(s) were still running" in r.message
    assert not [rec for rec in all_records(mem) if rec.kind == "continue"]


def test_an_input_that_is_not_json_is_named_clearly(mem: Store) -> None:
    async def wf(ctx: DurableContext, input: Any) -> Any:
        try:
            await ctx.continue_as_new({"when": object()})
        except ResultNotSerializableError as e:
            return str(e)
        return "continued"

    r = attempt(mem, wf)
    assert r.outcome == Outcome.COMPLETED
    assert r.result == (
        "the input given to ctx.continue_as_new() is a value that is not JSON-serializable: "
        "builtins.object at input['when']. Return JSON types (dict, list, str, int, float, "
        "bool, None) or a pydantic model.")


def test_an_input_over_the_hard_limit_fails_and_a_big_one_goes_to_a_blob(mem: Store) -> None:
    async def wf(ctx: DurableContext, state: dict[str, Any]) -> Any:
        if state.get("blob"):
            await ctx.wait_for_event("go")
            return len(state["blob"])
        await ctx.continue_as_new({"blob": "x" * state["size"]})

    config = EngineConfig(inline_result_max=1024, result_hard_limit=64 * 1024, snapshot_every=4)
    too_big = attempt(mem, wf, {"size": 100_000}, config=config)
    assert too_big.outcome == Outcome.FAILED
    assert "ctx.continue_as_new() is 100,0" in too_big.message
    assert "over the hard limit of 65,536 bytes" in too_big.message
    ref = RunRef.local("blob")
    assert attempt(mem, wf, {"size": 10_000}, ref=ref, config=config).outcome == Outcome.WAITING
    cont = [rec for rec in all_records(mem, ref) if rec.kind == "continue"]
    assert len(cont) == 1
    assert isinstance(cont[0], ContinueRecord)
    assert cont[0].ref is not None
    assert b'"value"' not in cont[0].raw()
    mem.put_event(run=ref, name="go", payload=None)
    done = attempt(mem, wf, {"size": 10_000}, ref=ref, config=config)
    assert done.result == 10_000


# --- the rest of the workflow API across generations ------------------------------------------------


def test_budgets_count_across_generations(mem: Store) -> None:
    ledger = Ledger()
    wf = looping(ledger, every=4, total=20, wait=False)
    r = attempt(mem, wf, policy=Policy(maxSteps=10))
    assert r.outcome == Outcome.ABORTED
    assert r.abort_reason == AbortReason.BUDGET_EXHAUSTED
    assert r.totals.steps == 10
    assert sum(ledger.calls.values()) == 10
    r2 = attempt(mem, wf, policy=Policy(costCeilingUSD="0.15"))
    assert r2.outcome == Outcome.ABORTED
    assert r2.totals.usd == Decimal("0.15")
    assert sum(ledger.calls.values()) == 15
    done = attempt(mem, wf)
    assert done.outcome == Outcome.COMPLETED
    assert done.totals.steps == 20
    assert ledger.calls == Counter({n: 1 for n in range(20)})


def test_cost_charged_outside_steps_before_a_continuation_counts_once(mem: Store) -> None:
    async def wf(ctx: DurableContext, state: dict[str, Any]) -> Any:
        gen = state.get("gen", 0)
        await ctx.step("s", lambda: gen)
        ctx.add_cost(usd=Decimal("1.00"), tokens=100)  # journaled with the next record
        if gen < 3:
            await ctx.continue_as_new({"gen": gen + 1})
        await ctx.wait_for_event("go")
        return gen

    r1 = attempt(mem, wf)
    assert r1.outcome == Outcome.WAITING
    mem.put_event(run=REF, name="go", payload=None)
    r2 = attempt(mem, wf)
    assert r2.outcome == Outcome.COMPLETED
    assert r2.totals.usd == Decimal("4.00")
    assert r2.totals.tokens == 400
    assert r2.totals.steps == 4


def test_events_consumed_in_an_earlier_generation_behave_as_without_continuation(
    store_spec: StoreSpec,
) -> None:
    """Events are the run's, not a generation's: waiting again for an event a previous
    generation consumed returns the same payload at once, as a second wait for it in one
    long generation does; a new event is waited for (and delivered) the same way too."""
    store = store_spec.open()

    async def plain(ctx: DurableContext, input: Any) -> Any:
        first = await ctx.wait_for_event("approval")
        await ctx.step("work", lambda: 1)
        again = await ctx.wait_for_event("approval")
        later = await ctx.wait_for_event("later")
        return [first, again, later]

    async def continuing(ctx: DurableContext, state: dict[str, Any]) -> Any:
        if "first" not in state:
            first = await ctx.wait_for_event("approval")
            await ctx.step("work", lambda: 1)
            await ctx.continue_as_new({"first": first})
        again = await ctx.wait_for_event("approval")
        later = await ctx.wait_for_event("later")
        return [state["first"], again, later]

    outcomes: dict[str, list[Any]] = {}
    for name, wf in (("plain", plain), ("continuing", continuing)):
        ref = RunRef.local(name)
        seen: list[Any] = []
        r = attempt(store, wf, ref=ref)
        seen.append((r.outcome, r.waiting.event if r.waiting else None))
        store.put_event(run=ref, name="approval", payload={"ok": name})
        r = attempt(store, wf, ref=ref)
        seen.append((r.outcome, r.waiting.event if r.waiting else None))
        store.put_event(run=ref, name="later", payload=2)
        r = attempt(store, wf, ref=ref)
        seen.append((r.outcome, r.result))
        outcomes[name] = seen
    assert outcomes["plain"] == [
        (Outcome.WAITING, "approval"), (Outcome.WAITING, "later"),
        (Outcome.COMPLETED, [{"ok": "plain"}, {"ok": "plain"}, 2])]
    assert outcomes["continuing"] == [
        (Outcome.WAITING, "approval"), (Outcome.WAITING, "later"),
        (Outcome.COMPLETED, [{"ok": "continuing"}, {"ok": "continuing"}, 2])]


def test_an_event_timeout_in_a_later_generation_keeps_its_deadline_across_resumes(
    mem: Store,
) -> None:
    async def wf(ctx: DurableContext, state: dict[str, Any]) -> Any:
        gen = state.get("gen", 0)
        await ctx.step("s", lambda: gen)
        if gen < 2:
            await ctx.continue_as_new({"gen": gen + 1})
        try:
            return await ctx.wait_for_event("review", timeout=timedelta(seconds=1.5))
        except EventTimeout:
            return "timed out"

    cfg = EngineConfig(inline_sleep_max=timedelta(milliseconds=50), snapshot_every=4)
    r1 = attempt(mem, wf, config=cfg)
    assert r1.outcome == Outcome.WAITING
    assert r1.waiting is not None
    deadline = r1.waiting.deadline
    assert deadline is not None
    r2 = attempt(mem, wf, config=cfg)  # still before the deadline: the same one, journaled
    if datetime.now(UTC) < deadline - timedelta(milliseconds=200):
        assert r2.outcome == Outcome.WAITING
        assert r2.waiting is not None
        assert r2.waiting.deadline == deadline
    wait_until(lambda: datetime.now(UTC) >= deadline, timeout=10, what="the deadline")
    assert attempt(mem, wf, config=cfg).result == "timed out"
    mem.put_event(run=REF, name="review", payload="too late")
    assert attempt(mem, wf, config=cfg).result == "timed out"


def test_a_long_sleep_in_a_later_generation_wakes_there(mem: Store) -> None:
    ledger = Ledger()

    async def wf(ctx: DurableContext, state: dict[str, Any]) -> Any:
        gen = state.get("gen", 0)
        await ctx.step(f"before-{gen}", lambda: ledger.hit(f"before-{gen}"))
        if gen < 2:
            await ctx.continue_as_new({"gen": gen + 1})
        await ctx.sleep(timedelta(seconds=1))
        return await ctx.step("after", lambda: ledger.hit("after") or "woke")

    cfg = EngineConfig(inline_sleep_max=timedelta(milliseconds=50), snapshot_every=4)
    r1 = attempt(mem, wf, config=cfg)
    assert r1.outcome == Outcome.WAITING
    assert r1.waiting is not None
    wake = r1.waiting.wake_time
    assert wake is not None
    wait_until(lambda: datetime.now(UTC) >= wake, timeout=10, what="the wake time")
    assert attempt(mem, wf, config=cfg).result == "woke"
    assert ledger.calls == Counter({"before-0": 1, "before-1": 1, "before-2": 1, "after": 1})


def test_retries_and_failures_in_a_later_generation(mem: Store) -> None:
    keys: list[str] = []
    tries = Counter[int]()

    async def wf(ctx: DurableContext, state: dict[str, Any]) -> Any:
        gen = state.get("gen", 0)

        def flaky() -> str:
            tries[gen] += 1
            keys.append(ctx.idempotency_key())
            if tries[gen] < 3:
                raise RuntimeError("try again")
            return "ok"

        assert await ctx.step("flaky", flaky) == "ok"
        if gen < 1:
            await ctx.continue_as_new({"gen": 1})
        try:
            await ctx.step("doomed", lambda: 1 / 0, retries=1)
        except StepError as e:
            return [e.step, e.type_name, e.attempts]
        return None

    r = attempt(mem, wf)
    assert r.result == ["doomed", "ZeroDivisionError", 2]
    # Stable across retries, different in each generation.
    assert keys == [f"{REF.key}:0:flaky"] * 3 + [f"{REF.key}:1/0:flaky"] * 3
    # A replay of the last generation raises the same journaled StepError without a call.
    assert attempt(mem, wf).result == ["doomed", "ZeroDivisionError", 2]
    assert tries == Counter({0: 3, 1: 3})


def test_patched_and_divergence_are_per_generation(mem: Store) -> None:
    async def v1(ctx: DurableContext, state: dict[str, Any]) -> Any:
        gen = state.get("gen", 0)
        await ctx.step("a", lambda: 1)
        if gen == 0:
            await ctx.continue_as_new({"gen": 1})
        await ctx.wait_for_event("go")
        await ctx.step("b", lambda: 2)
        return "v1"

    async def v2_diverges(ctx: DurableContext, state: dict[str, Any]) -> Any:
        await ctx.step("a", lambda: 1)
        if state.get("gen", 0) == 0:
            await ctx.continue_as_new({"gen": 1})
        await ctx.step("b-new", lambda: 2)  # where generation 1 journaled a wait
        return "v2"

    async def v3_continues_early(ctx: DurableContext, state: dict[str, Any]) -> Any:
        gen = state.get("gen", 0)
        await ctx.step("a", lambda: 1)
        await ctx.continue_as_new({"gen": gen + 1})  # generation 1 journaled more than this

    async def v4_patched(ctx: DurableContext, state: dict[str, Any]) -> Any:
        await ctx.step("a", lambda: 1)
        if state.get("gen", 0) == 0:
            await ctx.continue_as_new({"gen": 1})
        await ctx.wait_for_event("go")
        if ctx.patched("new-b"):
            await ctx.step("b-new", lambda: 2)
            return "v4-new"
        await ctx.step("b", lambda: 2)
        return "v4-old"

    assert attempt(mem, v1).outcome == Outcome.WAITING  # in generation 1, at the wait
    r = attempt(mem, v2_diverges)
    assert r.outcome == Outcome.FAILED
    assert "replay diverged at journal position 1/1" in r.message
    r = attempt(mem, v3_continues_early)
    assert r.outcome == Outcome.FAILED
    assert "replay diverged at journal position 1/1: the journal holds wait 'go' there, but " \
        "the workflow now asks for continue 'continue_as_new'" in r.message
    mem.put_event(run=REF, name="go", payload=None)
    assert attempt(mem, v4_patched).result == "v4-new"


def test_the_original_input_is_still_what_input_mismatch_checks(mem: Store) -> None:
    async def wf(ctx: DurableContext, state: dict[str, Any]) -> Any:
        if state.get("n", 0) < 3:
            await ctx.continue_as_new({"n": state.get("n", 0) + 1})
        await ctx.wait_for_event("go")
        return state

    assert attempt(mem, wf, {"n": 0}).outcome == Outcome.WAITING
    mismatch = attempt(mem, wf, {"n": 3})  # the current generation's input is not the run's
    assert mismatch.outcome == Outcome.FAILED
    assert "InputMismatch" in mismatch.message
    mem.put_event(run=REF, name="go", payload=None)
    done = attempt(mem, wf, {"n": 0})
    assert done.outcome == Outcome.COMPLETED
    assert done.result == {"n": 3}


def test_the_write_guard_is_asked_before_the_continuation_record(mem: Store) -> None:
    lapsed = {"now": False}

    def guard() -> str | None:
        return "lease lapsed" if lapsed["now"] else None

    async def wf(ctx: DurableContext, state: dict[str, Any]) -> Any:
        await ctx.step("one", lambda: 1)
        await ctx.step("two", lambda: 2)
        lapsed["now"] = True  # e.g. the process was paused past its lease right here
        await ctx.continue_as_new({"gen": 1})

    cfg = EngineConfig(write_guard=guard, snapshot_every=1000)
    r = attempt(mem, wf, config=cfg)
    assert r.outcome == Outcome.FENCED
    assert "lease lapsed" in r.message
    assert [rec.kind for rec in all_records(mem)] == ["step", "step"]


def test_a_stop_request_before_the_continuation_suspends_and_the_resume_continues(
    mem: Store,
) -> None:
    run_box: list[Run] = []

    async def wf(ctx: DurableContext, state: dict[str, Any]) -> Any:
        gen = state.get("gen", 0)
        await ctx.step("s", lambda: run_box[0].request_stop() if gen == 0 and run_box else None)
        if gen == 0:
            await ctx.continue_as_new({"gen": 1})
        return gen

    run = Run(store=mem, run=REF, workflow=wf, input={}, config=FAST)
    run_box.append(run)
    r = run.run_attempt()
    assert r.outcome == Outcome.SUSPENDED
    assert [rec.kind for rec in all_records(mem)] == ["step"]
    run_box.clear()
    assert attempt(mem, wf).result == 1


def test_a_snapshot_is_taken_at_each_continuation_and_then_every_snapshot_every_records(
    mem: Store, monkeypatch: pytest.MonkeyPatch,
) -> None:
    from durablerun._private.engine import writer

    asked: list[int | None] = []
    real_job = writer.Writer._snapshot_job

    def job(self: writer.Writer, upto: int | None, totals: Any) -> Any:
        asked.append(upto)
        return real_job(self, upto, totals)

    monkeypatch.setattr(writer.Writer, "_snapshot_job", job)
    ledger = Ledger()
    r = attempt(mem, looping(ledger, every=7, total=21, wait=False, history=False))
    assert r.outcome == Outcome.COMPLETED, r.message
    conts = [rec.seq for rec in all_records(mem) if rec.kind == "continue"]
    assert conts == [8, 17, 26]  # a uuid, 7 steps and the continuation per generation
    # Generation 0 as always (every 4th record); then each continuation itself and every
    # 4th record after it; the final snapshot at the end. (A snapshot of records a later
    # continuation superseded before it ran is skipped: the continuation's is taken.)
    assert asked == [3, 7, 8, 12, 16, 17, 21, 25, 26, 28], asked
    pointer = _pointer(mem, REF)
    assert pointer["base"] == 26
    assert pointer["seq"] == 28  # the completion
