"""ModelQuotas as an :class:`~durablerun_operator.integrations.Integration`: a runner pod gets the quotas that
cover its namespace. They add nothing to a run's decision (a throttled run waits as after a durable sleep, by
its own status), so only ``place`` does anything.
"""

from __future__ import annotations

from typing import Any

from durablerun_operator import builders, decide, quotas
from durablerun_operator.config import Settings
from durablerun_operator.integrations import Contribution


class QuotaIntegration:
    def __init__(self, index: quotas.Index, settings: Settings) -> None:
        self._index, self._settings = index, settings

    def involves(self, body: dict[str, Any]) -> bool:
        return False

    def begin(self) -> None:
        return None

    async def observe(self, state: None, run: decide.RunView, body: dict[str, Any]) -> Contribution:
        return Contribution()

    def stale(self, state: None, plan: decide.Plan | None = None) -> None:
        pass

    async def apply(self, state: None, body: dict[str, Any], plan: decide.Plan) -> None:
        pass

    async def place(self, pod: dict[str, Any], plan: decide.Plan) -> dict[str, Any]:
        runner = builders.runner_container(pod["spec"])
        named = {e["name"] for e in runner["env"]}
        runner["env"].extend(quotas.runner_env(self._index, pod["metadata"]["namespace"], self._settings, named))
        return pod
