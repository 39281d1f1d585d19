"""What the plan executor asks of an integration: one small protocol, as Kueue's jobframework asks ``GenericJob``.

An integration is a system a run is decided together with (Kueue today; quotas and schedules next). It adds
facts to a run's decision (:class:`Contribution`, read from its own objects) and creates or deletes its
objects when a plan says so. The decision itself stays in ``decide``; the API calls stay ``kube``'s. The
executor (:mod:`durablerun_operator.executor`) drives every integration the same way, in each pass over a
run (one reconcile: decide, apply, decide again until the run settles):

1. ``begin()``: the integration's state for the pass (nothing read yet);
2. before each decision, ``observe(state, run, body)``: what it contributes, reading its objects the first
   time and again only after ``stale(state, plan)`` (a plan that changes them, a conflict, the first look);
3. after the run's status is written, ``apply(state, body, plan)``: its objects created or deleted;
4. when the plan starts an attempt, ``place(pod, plan)``: the pod as the integration places it.

And, on the watch, ``involves(body)``: whether the run's decision reads the integration's objects at all (such
a run is never decided on its watched body alone, the first look).

A new integration is a module in this package implementing :class:`Integration`, a field of
:class:`Contribution` for what it tells ``decide`` (and the argument ``decide`` takes for it), and one entry in
the executor's list (``executor.integrations``).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from datetime import timedelta
from typing import Any, Protocol, TypeVar

from durablerun_operator import decide, kueue

S = TypeVar("S")


@dataclass(frozen=True)
class Contribution:
    """What the integrations add to one decision of a run."""

    #: Kueue: the run's LocalQueue and Workload (decide's ``queueing``); None: not admitted through Kueue.
    queueing: kueue.Queueing | None = None
    #: Look at the run again after this although nothing watched changes (Kueue: its WorkloadPriorityClass
    #: does not exist, and classes are not watched); None: when decide's clocks say.
    recheck: timedelta | None = None

    @staticmethod
    def combine(parts: Iterable[Contribution]) -> Contribution:
        queueing, rechecks = None, []
        for part in parts:
            queueing = queueing or part.queueing
            if part.recheck is not None:
                rechecks.append(part.recheck)
        return Contribution(queueing, min(rechecks, default=None))


class Integration(Protocol[S]):
    """One integration as the executor drives it (the module docstring says in which order). ``S``: its state
    for one pass over one run, made by ``begin`` and handed back to every other call of that pass."""

    def involves(self, body: dict[str, Any]) -> bool:
        """Whether deciding this run reads the integration's objects (then it is never decided unread)."""
        ...

    def begin(self) -> S:
        """Its state for a new pass over a run: nothing read yet."""
        ...

    async def observe(self, state: S, run: decide.RunView, body: dict[str, Any]) -> Contribution:
        """What it contributes to the next decision of ``run``, read or as read earlier in the pass."""
        ...

    def stale(self, state: S, plan: decide.Plan | None = None) -> None:
        """What it read in this pass must be read again: after ``plan`` if that changes its objects; always
        when ``plan`` is None (a conflict, or a first look that would act)."""
        ...

    async def apply(self, state: S, body: dict[str, Any], plan: decide.Plan) -> None:
        """Create or delete its objects as ``plan`` says; ``body``: the run as the plan's status write left it."""
        ...

    async def place(self, pod: dict[str, Any], plan: decide.Plan) -> dict[str, Any]:
        """The pod of the attempt ``plan`` starts, placed as the integration says (or as it is)."""
        ...
