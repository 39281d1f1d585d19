"""Kueue as an :class:`~durablerun_operator.integrations.Integration`: a run's Workload read, created and deleted.

The manifests and what Kueue's answers mean are the pure :mod:`durablerun_operator.kueue`; the gate itself
(start only when admitted, release the quota when the attempt ends) is ``decide.lifecycle``'s. Here: the API
calls between them, through ``kube``, with the integration on (``Settings.kueue``) and the run labelled with a
LocalQueue.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import timedelta
from typing import Any

from durablerun import api
from durablerun_operator import decide, kueue
from durablerun_operator.config import Settings
from durablerun_operator.integrations import Contribution
from durablerun_operator.kube import Kube
from durablerun_operator.workqueue import Calls

# A Queued run whose WorkloadPriorityClass does not exist is looked at again this often: the operator does not
# watch the classes (Kueue's jobframework retries a Job's the same way).
PRIORITY_CLASS_RECHECK = timedelta(seconds=30)


@dataclass
class Pass:
    """What one pass over a run read of Kueue's objects."""

    read: bool = False  # the Workload was read, and no plan changed it since
    workload: dict[str, Any] | None = None  # the run's Workload as read (None: none)
    #: The run's WorkloadPriorityClass and its value, as last looked up in the pass, for a Workload it creates.
    priority: tuple[str, int] | None = None


class KueueIntegration:
    """A run's Kueue Workload, as Kueue's jobframework keeps a Job's."""

    def __init__(self, kube: Kube, settings: Settings, call: Calls) -> None:
        self._kube, self._settings, self._call = kube, settings, call

    def _queue(self, body: dict[str, Any]) -> str | None:
        """The Kueue queue the run is admitted through: none with the integration off."""
        return kueue.queue_name(body) if self._settings.kueue else None

    def involves(self, body: dict[str, Any]) -> bool:
        return self._queue(body) is not None

    def begin(self) -> Pass:
        return Pass()

    async def observe(self, state: Pass, run: decide.RunView, body: dict[str, Any]) -> Contribution:
        queue = self._queue(body)
        if queue and not state.read:
            state.workload = await self._call(self._kube.get_workload, run.namespace,
                                              kueue.workload_name(run.name, run.uid))
            state.read = True
        if not queue:
            return Contribution()
        missing = None
        if state.workload is None and run.status.phase in (api.Phase.PENDING, api.Phase.QUEUED):
            state.priority, missing = await self._priority(body)  # only a run about to queue needs it
        view = kueue.WorkloadView.from_workload(state.workload) if state.workload else None
        return Contribution(queueing=kueue.Queueing(queue, view, missing),
                            recheck=PRIORITY_CLASS_RECHECK if missing else None)

    def stale(self, state: Pass, plan: decide.Plan | None = None) -> None:
        if plan is None or plan.touches_workload:
            state.read = False

    async def apply(self, state: Pass, body: dict[str, Any], plan: decide.Plan) -> None:
        if plan.delete_workload:
            await self._call(self._kube.delete_workload, body["metadata"]["namespace"], plan.delete_workload)
        if plan.create_workload:
            await self._call(self._kube.create_workload, kueue.workload(body, self._settings, state.priority))

    async def place(self, pod: dict[str, Any], plan: decide.Plan) -> dict[str, Any]:
        if not plan.flavors:
            return pod
        # Admitted by Kueue: to the nodes of the flavors it assigned.
        found = [await self._call(self._kube.get_cluster_object, kueue.RESOURCE_FLAVORS, name)
                 for name in plan.flavors]
        return kueue.place(pod, kueue.placement([f for f in found if f is not None]))

    async def _priority(self, body: dict[str, Any]) -> tuple[tuple[str, int] | None, str | None]:
        """The run's WorkloadPriorityClass and its value, as Kueue's jobframework resolves them for a Job; or
        (None, its name) when the class its label names does not exist."""
        name = kueue.priority_class(body)
        if not name:
            return None, None
        found = await self._call(self._kube.get_cluster_object, kueue.WORKLOAD_PRIORITY_CLASSES, name)
        if found is None:
            return None, name
        return (name, int(found.get("value", 0))), None
