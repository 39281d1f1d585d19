"""The fuzz tests' one setting: how many examples each runs. Bounded in `make test` (FUZZ_EXAMPLES, 150 by
default); `make faults` runs thousands."""

from __future__ import annotations

import os

from hypothesis import HealthCheck, settings

EXAMPLES = int(os.environ.get("FUZZ_EXAMPLES", "150"))


def fuzz(examples: int = EXAMPLES, *also: HealthCheck) -> settings:
    """Derandomized (a CI failure replays), no deadline (a loaded machine is not a bug), large inputs allowed."""
    return settings(max_examples=examples, deadline=None, derandomize=True,
                    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large, *also])
