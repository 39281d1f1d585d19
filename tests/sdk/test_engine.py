"""The durable execution core: replay, steps, retries, results, divergence, versioning."""

from __future__ import annotations

import asyncio
import enum
import uuid
from collections import Counter
from datetime import timedelta
from decimal import Decimal
from typing import Any

import pytest
from pydantic import BaseModel

from durablerun import DurableContext, NonRetryableError, StepError
from durablerun._private.records.model import Record, StepRecord
from durablerun._private.storage.backends import memory
from durablerun.api import Outcome
from durablerun.engine import EngineConfig
from durablerun.sinks import ProgressSink
from durablerun.stores import RunRef, Store, open_store
from tests.helpers.local_runs import StoreSpec

from .helpers import REF, Ledger, attempt, raw_journal_bytes


def _step(record: Record) -> StepRecord:
    assert isinstance(record, StepRecord), record
    return record


# --- replay -------------------------------------------------------------------------------


def test_completed_steps_never_execute_again(store_spec: StoreSpec) -> None:
    store = store_spec.open()
    ledger = Ledger()
    gate = {"wait": True}

    def work(i: int) -> dict[str, int]:
        ledger.hit(f"step-{i}")
        return {"i": i, "sq": i * i}

    async def wf(ctx: DurableContext, input: dict[str, Any]) -> dict[str, Any]:
        out = []
        for i in range(input["n"]):
            out.append(await ctx.step(f"s{i}", work, i))
            if i == 5 and gate["wait"]:
                await ctx.wait_for_event("go")
        return {"out": out}

    first = attempt(store, wf, {"n": 10})
    assert first.outcome == Outcome.WAITING
    assert first.waiting
    assert first.waiting.event == "go"
    assert first.totals.steps == 6
    store.put_event(run=REF, name="go", payload=None)
    second = attempt(store, wf, {"n": 10})
    assert second.outcome == Outcome.COMPLETED, second.message
    assert second.result == {"out": [{"i": i, "sq": i * i} for i in range(10)]}
    assert ledger.calls == Counter({f"step-{i}": 1 for i in range(10)})
    assert second.totals.steps == 10
    third = attempt(store, wf, {"n": 10})
    assert third.outcome == Outcome.COMPLETED
    assert third.result == second.result
    assert sum(ledger.calls.values()) == 10


def test_values_are_returned_as_a_replay_would_return_them(mem: Store) -> None:
    seen: list[Any] = []

    async def wf(ctx: DurableContext, input: Any) -> Any:
        value = await ctx.step("tuple", lambda: (1, 2, {"k": (3,)}))
        seen.append(repr(value))
        value.append("mutated")  # the workflow owns its copy: the journal is unaffected
        await ctx.wait_for_event("e")
        return value

    assert attempt(mem, wf).outcome == Outcome.WAITING
    mem.put_event(run=REF, name="e", payload=None)
    r2 = attempt(mem, wf)
    # Live and replay return the same thing: what JSON makes of the value.
    assert seen == [repr([1, 2, {"k": [3]}])] * 2
    assert r2.result == [1, 2, {"k": [3]}, "mutated"]


class Colour(enum.StrEnum):
    RED = "red"


def test_scalar_results_come_back_as_a_replay_returns_them_subclasses_as_plain_values(mem: Store) -> None:
    # A str/int/float/bool/None result is handed back as it was returned (it decodes to itself); a
    # subclass (an enum here) is decoded like any other value, so live and replay still agree.
    seen: list[Any] = []

    async def wf(ctx: DurableContext, input: Any) -> Any:
        for name, value in (("s", "ü\u2028x"), ("i", 10**20), ("f", 0.1), ("b", True), ("n", None),
                            ("e", Colour.RED)):
            got = await ctx.step(name, lambda v=value: v)
            seen.append((type(got).__name__, got))
        await ctx.wait_for_event("e")
        return None

    assert attempt(mem, wf).outcome == Outcome.WAITING
    live = list(seen)
    assert live == [("str", "ü\u2028x"), ("int", 10**20), ("float", 0.1), ("bool", True), ("NoneType", None),
                    ("str", "red")]
    mem.put_event(run=REF, name="e", payload=None)
    seen.clear()
    assert attempt(mem, wf).outcome == Outcome.COMPLETED
    assert seen == live


class Report(BaseModel):
    title: str
    score: float


def make_report() -> Report:
    return Report(title="t", score=0.5)


def test_pydantic_results_come_back_as_models(mem: Store) -> None:
    got: list[Any] = []

    async def wf(ctx: DurableContext, input: Any) -> Any:
        report = await ctx.step("report", make_report)
        got.append(report)
        await ctx.wait_for_event("e")
        return report.title

    assert attempt(mem, wf).outcome == Outcome.WAITING
    mem.put_event(run=REF, name="e", payload=None)
    assert attempt(mem, wf).result == "t"
    assert got == [Report(title="t", score=0.5)] * 2


def test_now_and_uuid_are_identical_on_replay(mem: Store) -> None:
    seen: list[tuple[Any, Any]] = []

    async def wf(ctx: DurableContext, input: Any) -> Any:
        pair = (ctx.now(), ctx.uuid())
        seen.append(pair)
        await ctx.wait_for_event("e")
        return str(pair[1])

    attempt(mem, wf)
    mem.put_event(run=REF, name="e", payload=None)
    r = attempt(mem, wf)
    assert r.outcome == Outcome.COMPLETED
    assert seen[0] == seen[1]
    assert seen[0][0].tzinfo is not None
    assert r.result == str(seen[0][1])


def test_a_completed_run_returns_its_result_without_running_code(mem: Store) -> None:
    runs = Ledger()

    async def wf(ctx: DurableContext, input: Any) -> Any:
        runs.hit("workflow")
        return await ctx.step("a", lambda: 42)

    assert attempt(mem, wf).result == 42
    again = attempt(mem, wf)
    assert again.outcome == Outcome.COMPLETED
    assert again.result == 42
    assert runs.calls["workflow"] == 1


class _OvertakingBackend(memory.MemoryBackend):
    """A newer attempt claims the run while this attempt's outcome is on its way to status.json (the runner was
    paused after its write guard let it write); ``lapsed``: this attempt's lease lapsed meanwhile."""

    def __init__(self, name: str, lapsed: bool) -> None:
        super().__init__(name)
        self.lapsed, self.overtaken, self.store = lapsed, False, Store(self, f"memory://{name}")

    def cas(self, key: str, data: bytes, *, etag: str | None) -> str | None:
        if key.endswith("/status.json") and b"Completed" in data and not self.overtaken:
            self.overtaken = True
            self.store.run_store(REF).claim_status("newer")
        return super().cas(key, data, etag=etag)

    def guard(self) -> str | None:
        return "lease lapsed" if self.overtaken and self.lapsed else None


@pytest.mark.parametrize("lapsed", [True, False], ids=["lease lapsed", "still its run"])
def test_an_attempt_overtaken_past_its_lease_check_writes_status_only_if_it_still_owns_the_run(lapsed: bool) -> None:
    name = uuid.uuid4().hex
    backend = _OvertakingBackend(name, lapsed)

    async def wf(ctx: DurableContext, input: Any) -> Any:
        return await ctx.step("a", lambda: 1)

    result = attempt(backend.store, wf, config=EngineConfig(write_guard=backend.guard))
    status = backend.store.run_store(REF).read_status()
    if lapsed:  # the newer attempt owns the run: this one records nothing and ends Fenced
        assert result.outcome == Outcome.FENCED, result.message
        assert "claimed" in result.message
        assert status is None
    else:  # claimed by a writer that lost the journal to it (two local runs at once): it claims the run back
        assert result.outcome == Outcome.COMPLETED, result.message
        assert (status or {}).get("outcome") == Outcome.COMPLETED.value
    memory.reset(name)


# --- steps --------------------------------------------------------------------------------


def test_sync_and_async_steps_and_idempotency_keys(mem: Store) -> None:
    keys: list[str] = []
    failures = {"n": 0}

    async def async_step(ctx: DurableContext, x: int) -> int:
        keys.append(ctx.idempotency_key())
        await asyncio.sleep(0)
        return x + 1

    def flaky(ctx: DurableContext) -> str:
        keys.append(ctx.idempotency_key())
        failures["n"] += 1
        if failures["n"] < 3:
            raise ConnectionError("try again")
        return "ok"

    async def wf(ctx: DurableContext, input: Any) -> Any:
        a = await ctx.step("inc", async_step, ctx, 1)
        b = await ctx.step("flaky", flaky, ctx, retries=5)
        return [a, b]

    r = attempt(mem, wf)
    assert r.outcome == Outcome.COMPLETED
    assert r.result == [2, "ok"]
    assert keys[0] == "_local/t:0:inc"
    assert keys[1:] == ["_local/t:1:flaky"] * 3
    rs = mem.run_store(REF)
    assert _step(rs.load().records[1]).attempts == 3


def test_exhausted_retries_fail_the_run_with_type_and_message(mem: Store) -> None:
    calls = Ledger()

    def broken() -> None:
        calls.hit("broken")
        raise ValueError("the API said no")

    async def wf(ctx: DurableContext, input: Any) -> Any:
        return await ctx.step("call-api", broken, retries=2)

    r = attempt(mem, wf)
    assert r.outcome == Outcome.FAILED
    assert r.exit_code == 1
    assert "call-api" in r.message
    assert "ValueError" in r.message
    assert "the API said no" in r.message
    assert calls.calls["broken"] == 3
    # The failure is journaled: running again re-raises it without calling the API.
    again = attempt(mem, wf)
    assert again.outcome == Outcome.FAILED
    assert calls.calls["broken"] == 3


def test_non_retryable_errors_are_not_retried_and_can_be_caught(mem: Store) -> None:
    calls = Ledger()

    def refuse() -> None:
        calls.hit("refuse")
        raise NonRetryableError("invalid request")

    async def wf(ctx: DurableContext, input: Any) -> Any:
        try:
            await ctx.step("refuse", refuse, retries=5)
        except StepError as e:
            return {"caught": e.type_name, "message": e.message, "attempts": e.attempts}
        return None

    r = attempt(mem, wf)
    assert r.result == {"caught": "NonRetryableError", "message": "invalid request", "attempts": 1}
    assert calls.calls["refuse"] == 1


def test_gather_positions_are_deterministic_and_a_failing_branch_loses_nothing(
    mem: Store,
) -> None:
    ledger = Ledger()
    fail = {"on": True}

    async def work(i: int) -> int:
        ledger.hit(f"w{i}")
        await asyncio.sleep(0.001 * (5 - i))  # finish in reverse order
        if i == 2 and fail["on"]:
            raise RuntimeError("branch 2 broke")
        return i * 10

    async def two_steps(ctx: DurableContext, i: int) -> list[int]:
        a = await ctx.step(f"a{i}", work, i)
        b = await ctx.step(f"b{i}", work, i + 100)
        return [a, b]

    async def wf(ctx: DurableContext, input: Any) -> Any:
        flat = await ctx.gather(*[ctx.step(f"w{i}", work, i, retries=0) for i in range(5)])
        nested = await ctx.gather(two_steps(ctx, 1), two_steps(ctx, 2))
        return [flat, nested]

    r1 = attempt(mem, wf)
    assert r1.outcome == Outcome.FAILED
    assert "branch 2 broke" in r1.message
    positions = {rec.name: rec.pos for rec in mem.run_store(REF).load().records}
    assert positions == {"w0": "0", "w1": "1", "w2": "2", "w3": "3", "w4": "4"}
    # The failure is journaled too; a fixed workflow would need a new run. Here we just
    # check that the others' results were kept and nothing re-ran.
    assert all(ledger.calls[f"w{i}"] == 1 for i in range(5))

    store2 = open_store(f"memory://{uuid.uuid4().hex}")
    fail["on"] = False
    ledger.calls.clear()
    r2 = attempt(store2, wf)
    assert r2.outcome == Outcome.COMPLETED
    assert r2.result == [[0, 10, 20, 30, 40], [[10, 1010], [20, 1020]]]
    recs = store2.run_store(REF).load().records
    nested = {r.name: r.pos for r in recs if r.name.startswith(("a", "b"))}
    # steps 0-4, the first gather itself 5, the second 6: branch i counts in "6.i.*"
    assert nested == {"a1": "6.0.0", "b1": "6.0.1", "a2": "6.1.0", "b2": "6.1.1"}


def test_gather_with_a_branch_waiting_journals_the_other_branches(mem: Store) -> None:
    ledger = Ledger()

    async def waits(ctx: DurableContext) -> Any:
        return await ctx.wait_for_event("approve")

    async def wf(ctx: DurableContext, input: Any) -> Any:
        return await ctx.gather(waits(ctx), ctx.step("work", lambda: ledger.hit("work") or 7))

    r1 = attempt(mem, wf)
    assert r1.outcome == Outcome.WAITING
    assert r1.totals.steps == 1
    mem.put_event(run=REF, name="approve", payload="yes")
    r2 = attempt(mem, wf)
    assert r2.result == ["yes", 7]
    assert ledger.calls["work"] == 1


def test_ctx_step_from_a_foreign_task_fails_clearly(mem: Store) -> None:
    async def branch(ctx: DurableContext) -> Any:
        await asyncio.sleep(0)
        return await ctx.step("inner", lambda: 1)

    async def wf(ctx: DurableContext, input: Any) -> Any:
        return await asyncio.gather(branch(ctx), branch(ctx))

    r = attempt(mem, wf)
    assert r.outcome == Outcome.FAILED
    assert "ctx.gather" in r.message


# --- results --------------------------------------------------------------------------------


def test_non_serializable_result_fails_naming_step_and_type(mem: Store) -> None:
    async def wf(ctx: DurableContext, input: Any) -> Any:
        await ctx.step("fine", lambda: 1)
        return await ctx.step("bad", lambda: {"when": object()})

    r = attempt(mem, wf)
    assert r.outcome == Outcome.FAILED
    assert "'bad'" in r.message
    assert "builtins.object" in r.message
    assert "['when']" in r.message
    records = mem.run_store(REF).load().records
    assert [_step(rec).ok for rec in records] == [True, False]
    assert _step(records[1]).attempts == 1  # not retried


def test_big_results_go_by_reference_and_come_back(store_spec: StoreSpec) -> None:
    store = store_spec.open()
    big = "x" * (5 * 1024 * 1024)

    async def wf(ctx: DurableContext, input: Any) -> Any:
        text = await ctx.step("big", lambda: {"text": big})
        await ctx.wait_for_event("e")
        return len(text["text"])

    r1 = attempt(store, wf)
    assert r1.outcome == Outcome.WAITING
    rec = store.run_store(REF).load().records[0]
    assert isinstance(rec, StepRecord)
    assert rec.ref is not None
    assert rec.ref["size"] > 5 * 1024 * 1024
    assert len(rec.raw()) < 2000  # the journal entry itself stays small
    store.put_event(run=REF, name="e", payload=None)
    r2 = attempt(store, wf)
    assert r2.outcome == Outcome.COMPLETED
    assert r2.result == len(big)


def test_result_over_the_hard_limit_fails_without_retries(mem: Store) -> None:
    calls = Ledger()

    def huge() -> str:
        calls.hit("huge")
        return "y" * 2000

    async def wf(ctx: DurableContext, input: Any) -> Any:
        return await ctx.step("huge", huge, retries=3)

    cfg = EngineConfig(inline_result_max=100, result_hard_limit=1000,
                       retry_initial=timedelta(milliseconds=1))
    r = attempt(mem, wf, config=cfg)
    assert r.outcome == Outcome.FAILED
    assert "2,002 bytes" in r.message
    assert "1,000 bytes" in r.message
    assert calls.calls["huge"] == 1


# --- code changes ----------------------------------------------------------------------------


def test_divergence_fails_naming_both_and_keeps_the_journal(mem: Store) -> None:
    async def v1(ctx: DurableContext, input: Any) -> Any:
        await ctx.step("fetch", lambda: 1)
        await ctx.wait_for_event("e")
        return "v1"

    async def v2(ctx: DurableContext, input: Any) -> Any:
        await ctx.step("download", lambda: 1)
        await ctx.wait_for_event("e")
        return "v2"

    assert attempt(mem, v1).outcome == Outcome.WAITING
    before = raw_journal_bytes(mem, REF)
    r = attempt(mem, v2)
    assert r.outcome == Outcome.FAILED
    assert r.error_type
    assert "DivergenceError" in r.error_type
    assert "'fetch'" in r.message
    assert "'download'" in r.message
    assert "ctx.patched" in r.message
    assert raw_journal_bytes(mem, REF) == before
    mem.put_event(run=REF, name="e", payload=None)
    assert attempt(mem, v1).result == "v1"  # the original code still resumes it


def test_removed_operations_are_a_divergence_at_completion(mem: Store) -> None:
    async def v1(ctx: DurableContext, input: Any) -> Any:
        await ctx.step("a", lambda: 1)
        await ctx.step("b", lambda: 2)
        await ctx.wait_for_event("e")
        return "v1"

    async def v2(ctx: DurableContext, input: Any) -> Any:
        await ctx.step("a", lambda: 1)
        return "v2"

    attempt(mem, v1)
    r = attempt(mem, v2)
    assert r.outcome == Outcome.FAILED
    assert "without reaching" in r.message
    assert "position 1" in r.message
    assert "'b'" in r.message


def test_patched_old_journals_take_the_old_path_new_runs_the_new(mem: Store) -> None:
    ledger = Ledger()

    async def v1(ctx: DurableContext, input: Any) -> Any:
        await ctx.step("fetch", lambda: ledger.hit("fetch"))
        await ctx.step("summarize", lambda: ledger.hit("summarize-v1") or "old")
        await ctx.wait_for_event("e")
        return "done"

    async def v2(ctx: DurableContext, input: Any) -> Any:
        await ctx.step("fetch", lambda: ledger.hit("fetch"))
        if ctx.patched("better-summary"):
            s = await ctx.step("summarize-v2", lambda: ledger.hit("summarize-v2") or "new")
        else:
            s = await ctx.step("summarize", lambda: ledger.hit("summarize-v1") or "old")
        await ctx.wait_for_event("e")
        return s

    old = RunRef.local("old")
    new = RunRef.local("new")
    assert attempt(mem, v1, ref=old).outcome == Outcome.WAITING  # journaled before the change
    mem.put_event(run=old, name="e", payload=None)
    r_old = attempt(mem, v2, ref=old)
    assert r_old.outcome == Outcome.COMPLETED
    assert r_old.result == "old"
    assert ledger.calls["summarize-v1"] == 1
    assert ledger.calls["summarize-v2"] == 0

    assert attempt(mem, v2, ref=new).outcome == Outcome.WAITING
    mem.put_event(run=new, name="e", payload=None)
    r_new = attempt(mem, v2, ref=new)
    assert r_new.result == "new"
    assert ledger.calls["summarize-v2"] == 1

    # A run that was waiting *before* the patched point when the code changed
    # reaches it after the change: new path.
    mid = RunRef.local("mid")

    async def v1_wait_first(ctx: DurableContext, input: Any) -> Any:
        await ctx.step("fetch", lambda: ledger.hit("fetch"))
        await ctx.wait_for_event("e")
        return await ctx.step("summarize", lambda: "old")

    async def v2_wait_first(ctx: DurableContext, input: Any) -> Any:
        await ctx.step("fetch", lambda: ledger.hit("fetch"))
        await ctx.wait_for_event("e")
        if ctx.patched("better-summary"):
            return await ctx.step("summarize-v2", lambda: "new")
        return await ctx.step("summarize", lambda: "old")

    attempt(mem, v1_wait_first, ref=mid)
    mem.put_event(run=mid, name="e", payload=None)
    assert attempt(mem, v2_wait_first, ref=mid).result == "new"
    # And without ctx.patched the same change is a divergence, not silent corruption.
    plain = RunRef.local("plain")
    attempt(mem, v1, ref=plain)

    async def v2_unguarded(ctx: DurableContext, input: Any) -> Any:
        await ctx.step("fetch", lambda: None)
        return await ctx.step("summarize-v2", lambda: "new")

    r = attempt(mem, v2_unguarded, ref=plain)
    assert r.outcome == Outcome.FAILED
    assert "DivergenceError" in str(r.error_type)


def test_input_mismatch_fails_and_keeps_the_journal(mem: Store) -> None:
    async def wf(ctx: DurableContext, input: Any) -> Any:
        await ctx.step("a", lambda: 1)
        await ctx.wait_for_event("e")

    attempt(mem, wf, {"topic": "a"})
    before = raw_journal_bytes(mem, REF)
    r = attempt(mem, wf, {"topic": "b"})
    assert r.outcome == Outcome.FAILED
    assert "InputMismatch" in r.message
    assert "new run" in r.message
    assert raw_journal_bytes(mem, REF) == before


# --- cost -------------------------------------------------------------------------------------


def test_cost_outside_steps_is_counted_once_across_replays(mem: Store) -> None:
    async def wf(ctx: DurableContext, input: Any) -> Any:
        ctx.add_cost(usd="0.10", tokens=100)  # outside any step
        await ctx.step("a", lambda: ctx.add_cost(usd=Decimal("0.01"), tokens=1))
        await ctx.wait_for_event("e")
        ctx.add_cost(usd="0.05")
        return "ok"

    r1 = attempt(mem, wf)
    assert r1.totals.usd == Decimal("0.11")
    assert r1.totals.tokens == 101
    mem.put_event(run=REF, name="e", payload=None)
    r2 = attempt(mem, wf)
    assert r2.outcome == Outcome.COMPLETED
    assert r2.totals.usd == Decimal("0.16")
    assert r2.totals.tokens == 101
    assert mem.read_run(run=REF).totals.usd == Decimal("0.16")


# --- damaged and missing stores ---------------------------------------------------------------


def test_a_corrupted_journal_object_fails_loudly_and_is_not_overwritten(
    store_spec: StoreSpec,
) -> None:
    from .helpers import corrupt_journal_record, flip_byte

    store = store_spec.open()
    ledger = Ledger()

    async def wf(ctx: DurableContext, input: Any) -> Any:
        for i in range(3):
            await ctx.step(f"s{i}", lambda i=i: ledger.hit(f"s{i}"))
        await ctx.wait_for_event("e")
        return "done"

    cfg = EngineConfig(snapshot_every=1000)
    assert attempt(store, wf, config=cfg).outcome == Outcome.WAITING
    store.put_event(run=REF, name="e", payload=None)
    # The Waiting attempt saved a final snapshot: damage the chunk a resume reads...
    rs = store.run_store(REF)
    chunk_key = rs.key(rs.load().chunks[0].key)
    good_chunk = store.backend.get(chunk_key)
    assert good_chunk is not None
    store.backend.put(chunk_key, flip_byte(good_chunk, len(good_chunk) - 3))
    before = _stored_journal(store)
    r = attempt(store, wf, config=cfg)
    assert r.outcome == Outcome.FAILED
    assert "CorruptionError" in str(r.error_type)
    assert "checksum" in r.message
    assert "chunks/" in r.message
    assert _stored_journal(store) == before  # nothing overwritten, nothing appended
    # ...and with no snapshot at all, a damaged journal record is just as loud.
    store.backend.delete([rs.key("snapshot.json")])
    corrupt_journal_record(store, REF, 1)
    before = _stored_journal(store)
    r = attempt(store, wf, config=cfg)
    assert r.outcome == Outcome.FAILED
    assert "CorruptionError" in str(r.error_type)
    assert "journal" in r.message
    assert _stored_journal(store) == before
    assert sum(ledger.calls.values()) == 3  # never a fresh start


def _stored_journal(store: Store) -> Any:
    from durablerun._private.storage.backends.fs import FsBackend

    if isinstance(store.backend, FsBackend):
        d = store.backend.root / REF.path / "journal"
        return {p.name: p.read_bytes() for p in d.iterdir()}
    return store.backend.list_keys(REF.path + "/journal/"), [
        store.backend.get(k) for k in store.backend.list_keys(REF.path + "/journal/")]


def test_a_missing_store_is_a_usage_error(tmp_path: Any, s3_spec: StoreSpec) -> None:
    async def wf(ctx: DurableContext, input: Any) -> Any:
        return 1

    r = attempt(open_store(f"file://{tmp_path}/no/such/dir"), wf)
    assert r.outcome == Outcome.USAGE_ERROR
    assert r.exit_code == 2
    assert "does not exist" in r.message
    missing_bucket = open_store("s3://no-such-bucket-here/x", **s3_spec.options)
    r = attempt(missing_bucket, wf)
    assert r.outcome == Outcome.USAGE_ERROR
    assert "bucket does not exist" in r.message
    wrong_key = open_store(s3_spec.uri, **{**s3_spec.options, "secret_key": "wrong"})
    r = attempt(wrong_key, wf)
    assert r.outcome == Outcome.USAGE_ERROR
    assert "credentials" in r.message
    assert "wrong" not in r.message


def test_removing_a_patched_call_later_is_harmless(mem: Store) -> None:
    async def v2(ctx: DurableContext, input: Any) -> Any:
        await ctx.step("fetch", lambda: 1)
        if ctx.patched("better-summary"):
            s = await ctx.step("summarize-v2", lambda: "new")
        else:
            s = await ctx.step("summarize", lambda: "old")
        await ctx.wait_for_event("e")
        return s

    async def v3(ctx: DurableContext, input: Any) -> Any:  # the old branch and the call gone
        await ctx.step("fetch", lambda: 1)
        s = await ctx.step("summarize-v2", lambda: "new")
        await ctx.wait_for_event("e")
        return s

    assert attempt(mem, v2).outcome == Outcome.WAITING  # journal holds the marker
    mem.put_event(run=REF, name="e", payload=None)
    assert attempt(mem, v3).result == "new"


def test_a_missing_snapshot_chunk_falls_back_to_the_journal(store_spec: StoreSpec) -> None:
    store = store_spec.open()
    ledger = Ledger()

    async def wf(ctx: DurableContext, input: Any) -> Any:
        out = [await ctx.step(f"s{i}", lambda i=i: ledger.hit(f"s{i}") or i) for i in range(10)]
        await ctx.wait_for_event("e")
        return out

    warnings: list[str] = []

    class Warn(ProgressSink):
        def warning(self, message: str) -> None:
            warnings.append(message)

    assert attempt(store, wf).outcome == Outcome.WAITING
    rs = store.run_store(REF)
    chunks = rs.load().chunks
    store.backend.delete([rs.key(chunks[0].key)])
    store.put_event(run=REF, name="e", payload=None)
    r = attempt(store, wf, sinks=[Warn()])
    assert r.result == list(range(10))
    assert sum(ledger.calls.values()) == 10
    assert any("read the whole journal" in w for w in warnings)


def test_a_store_failure_while_saving_a_big_result_is_not_the_steps_failure(mem: Store) -> None:
    from durablerun import errors as sdk_errors
    from durablerun._private.storage.backends.memory import MemoryBackend

    class BlobsDown(MemoryBackend):
        def create(self, key: str, data: bytes) -> bool:
            if "/blobs/" in key:
                raise sdk_errors.StoreUnavailableError("blob store down", key=key)
            return super().create(key, data)

    name = uuid.uuid4().hex
    store = Store(BlobsDown(name), f"memory://{name}")
    calls = Ledger()

    def big() -> str:
        calls.hit("big")
        return "z" * 2000

    async def wf(ctx: DurableContext, input: Any) -> Any:
        return len(await ctx.step("big", big, retries=3))

    cfg = EngineConfig(inline_result_max=100, retry_initial=timedelta(milliseconds=1))
    with pytest.raises(sdk_errors.StoreUnavailableError):
        attempt(store, wf, config=cfg)
    assert calls.calls["big"] == 1  # not retried as if the step had failed
    assert store.run_store(REF).load().records == []  # and nothing journaled
    memory.reset(name)
