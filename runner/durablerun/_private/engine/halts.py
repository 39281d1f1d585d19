"""Internal signals that end an attempt.

They derive from BaseException so workflow code cannot swallow them by
accident with ``except Exception`` (the way asyncio's CancelledError works).
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from datetime import datetime

from durablerun.api import AbortReason


class HaltKind(enum.IntEnum):
    # Higher wins when concurrent branches halt differently.
    WAIT = 1
    SUSPEND = 2
    ABORT = 3
    FAIL = 4
    CRASH = 5
    FENCE = 6


@dataclass
class Waiting:
    event: str | None = None
    deadline: datetime | None = None
    wake_time: datetime | None = None
    #: The policy.askAt field reached (resource.ASK_COST, ASK_TOKENS): a wait for a person to raise it.
    budget: str | None = None
    #: The model quota a call found no room in (with wake_time: when the room is due).
    quota: str | None = None


class Halt(BaseException):
    def __init__(
        self,
        kind: HaltKind,
        message: str,
        *,
        reason: AbortReason | None = None,
        waiting: Waiting | None = None,
        error: BaseException | None = None,
    ) -> None:
        super().__init__(message)
        self.kind = kind
        self.message = message
        self.reason = reason
        self.waiting = waiting
        self.error = error


def strongest(halts: list[Halt]) -> Halt:
    best = halts[0]
    for h in halts[1:]:
        if h.kind > best.kind:
            best = h
        elif (
            h.kind == best.kind == HaltKind.WAIT
            and best.waiting
            and h.waiting
            and best.waiting.wake_time
            and h.waiting.wake_time
            and h.waiting.wake_time < best.waiting.wake_time
        ):
            best = h  # wake for the earliest of several timed waits
    return best
