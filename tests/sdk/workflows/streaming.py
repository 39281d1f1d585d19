"""A workflow that writes its output to a stream as it goes (tests/sdk/test_streams.py).

Each step ``part-<k>`` writes ``words`` words to stream ``story``, appending each to a ledger file
*before* the write (``<pid> <part> <text>``): evidence from outside the run of what every process wrote.
With ``STREAM_GATE=<path>`` in its environment, step ``part-<hold>`` waits after its first ``gate_after``
words until the file exists: a test kills the process there, or follows the stream while it waits.
"""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

from durablerun import DurableContext

GATE_ENV = "STREAM_GATE"


def word(part: int, i: int) -> str:
    return f"p{part}w{i} "


def expected(parts: int, words: int) -> str:
    return "".join(word(part, i) for part in range(parts) for i in range(words))


async def story(ctx: DurableContext, input: dict[str, Any]) -> int:
    out = ctx.stream("story")
    ledger = Path(input["ledger"])

    def write_part(part: int) -> int:
        for i in range(input["words"]):
            if part == input.get("hold") and i == input.get("gate_after"):
                gate = os.environ.get(GATE_ENV)
                while gate and not os.path.exists(gate):
                    time.sleep(0.01)
            with ledger.open("a") as f:
                f.write(f"{os.getpid()} {part} {word(part, i)}\n")
            out.write(word(part, i))
        return part

    for part in range(input["parts"]):
        await ctx.step(f"part-{part}", write_part, part)
    return input["parts"]
