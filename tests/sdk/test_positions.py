"""Journal positions and the replay frontier (what ctx.patched and add_cost rely on)."""

from __future__ import annotations

from typing import Any

import pytest

from durablerun import DurableContext
from durablerun._private.engine.replay import Live, pos_str, pos_tuple
from durablerun._private.records.model import RECORD_KINDS
from durablerun._private.storage.journal import Loaded
from durablerun.api import Outcome
from durablerun.testing import WorkflowTest


def _live(*positions: str, kinds: dict[str, str] | None = None) -> Live:
    live = Live(loaded=Loaded([], [], -1, None, 0))
    for seq, pos in enumerate(positions):
        kind = (kinds or {}).get(pos, "step")
        live.add(RECORD_KINDS[kind](seq=seq, pos=pos, name=f"n{pos}"))
    return live


def test_position_strings_round_trip() -> None:
    for t in [(0,), (12,), (7, 2, 0), (7, 2, 3, 1, 4)]:
        assert pos_tuple(pos_str(t)) == t


@pytest.mark.parametrize(("journal", "cur", "replaying"), [
    ((), (0,), False),
    (("0", "1"), (1,), True),          # an operation at this very position
    (("0", "1"), (2,), False),         # the frontier
    (("0", "5"), (3,), True),          # something later in the same scope
    (("4.0.0", "4.1.0"), (4, 0, 1), False),  # sibling branch only: not ahead of us
    (("4.0.0", "4.0.1"), (4, 0, 1), True),
    (("4.0.0", "5"), (4, 1, 0), True),  # the parent scope went past this gather
    (("4.1.2",), (4, 0, 0), False),    # a sibling branch is never "ahead"
    (("4.0.0.0.3",), (4, 0, 0, 0, 2), True),
    (("4.0.0.0.3",), (4, 0, 1), False),  # deeper records belong to the gather at 4.0.0
])
def test_replaying_at(journal: tuple[str, ...], cur: tuple[int, ...], replaying: bool) -> None:
    assert _live(*journal).replaying_at(cur) is replaying


def test_patch_markers_and_completion_do_not_move_the_frontier() -> None:
    live = _live("0", "1", "end", kinds={"1": "patch", "end": "complete"})
    assert live.replaying_at((1,)) is False


async def _branch_v1(ctx: DurableContext, i: int) -> str:
    await ctx.step(f"fetch-{i}", lambda: i)
    await ctx.wait_for_event(f"go-{i}")
    return await ctx.step(f"old-{i}", lambda: "old")


async def _branch_v2(ctx: DurableContext, i: int) -> str:
    await ctx.step(f"fetch-{i}", lambda: i)
    await ctx.wait_for_event(f"go-{i}")
    if ctx.patched("new-tail"):
        return await ctx.step(f"new-{i}", lambda: "new")
    return await ctx.step(f"old-{i}", lambda: "old")


async def v1(ctx: DurableContext, input: Any) -> Any:
    return await ctx.gather(*[_branch_v1(ctx, i) for i in range(2)])


async def v2(ctx: DurableContext, input: Any) -> Any:
    return await ctx.gather(*[_branch_v2(ctx, i) for i in range(2)])


def test_patched_inside_gather_branches() -> None:
    old = WorkflowTest(v1, run_id="old")
    try:
        old.attempt()  # branch 0 and 1 wait
        old.send_event("go-0")
        assert old.attempt().outcome == Outcome.WAITING  # branch 0 finished the old way
        # The code changes now. Branch 0 already went past the patch point: old path.
        # Branch 1 reaches it after the change: new path.
        t = WorkflowTest(v2, run_id="old", store=old.store)
        t.send_event("go-1")
        done = t.attempt()
        assert done.outcome == Outcome.COMPLETED, done.message
        assert done.result == ["old", "new"]
    finally:
        old.close()
