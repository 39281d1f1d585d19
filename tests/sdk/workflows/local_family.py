"""A supervisor and its workers for `durablerun run` with child runs (tests/sdk/test_cli_children.py).

Every executed step appends ``<run id>:<step>`` to the ledger file named in the input, so a test can
tell a step replayed from a journal (no line) from one executed (one line), across processes."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from durablerun import DurableContext, errors


def note(ledger: str, line: str) -> None:
    with Path(ledger).open("a") as f:
        f.write(line + "\n")


async def worker(ctx: DurableContext, input: dict[str, Any]) -> dict[str, Any]:
    me = ctx.run_id.split("/")[1]
    got = await ctx.wait_for_event(input["wait"]) if input.get("wait") else None

    def work(n: int) -> int:
        note(input["ledger"], f"{me}:work")
        if input.get("fail"):
            raise errors.NonRetryableError(f"cannot work on {n}")
        return n * n

    return {"sq": await ctx.step("work", work, input["n"]), "got": got}


async def supervisor(ctx: DurableContext, input: dict[str, Any]) -> dict[str, Any]:
    """Three workers: w0 waits for a signal this run sends it, w2 for an event from outside (with
    ``input["outside"]``); one fails with ``input["fail"]``: awaiting it raises ChildRunFailed here."""
    ledger = input["ledger"]
    await ctx.step("plan", note, ledger, f"{ctx.run_id.split('/')[1]}:plan")
    specs = [{"n": 2, "wait": "go"}, {"n": 3, "fail": bool(input.get("fail"))},
             {"n": 4, "wait": "approve" if input.get("outside") else None}]
    handles = [await ctx.start_child(f"w{i}", "local_family:worker", {**spec, "ledger": ledger})
               for i, spec in enumerate(specs)]
    await ctx.signal(handles[0].run, "go", {"from": "supervisor"})
    results = await ctx.gather(*handles)
    await ctx.step("combine", note, ledger, f"{ctx.run_id.split('/')[1]}:combine")
    return {"squares": [r["sq"] for r in results], "got": [r["got"] for r in results]}
