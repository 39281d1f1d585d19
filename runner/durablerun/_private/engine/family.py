"""Child runs and signals in one process: the operator's part in a family of runs, played locally.

On Kubernetes the operator creates the children a workflow asks for, tells the parent each one's
outcome (an event in the parent's ``spec.events``), aborts the children of a parent that ended, counts
the children's cost against the parent's ceiling, and delivers signals (``durablerun_operator.decide.family``).
A :class:`LocalFamily` does the same in this process, for ``WorkflowTest`` and the local ``durablerun run``:
every child is a run of its own, named as the operator names it (``relations.child_run_name``), with its
own journal in the parent's store, attempted here until it finishes or waits for something no run here
can give; or the test author stubs it (:class:`ChildStub`).

What the operator keeps in the parent's ``status.childRequests`` is kept in the store, next to the
parent's journal (``children/<child>.json``, first write wins), so a family is whole again in the next
process (:meth:`LocalFamily.restore`): each child's state is its own run's (its ``status.json``), and the
outcome a parent was told is its event, stored once.
"""

from __future__ import annotations

import dataclasses
import json
import threading
from collections.abc import Callable, Mapping, Sequence
from decimal import Decimal
from typing import Any

from durablerun import api, errors, relations, resource
from durablerun._private.engine.children import read_result, too_many_children
from durablerun._private.engine.run import Run
from durablerun._private.records.layout import RunRef
from durablerun._private.records.model import AttemptResult, EngineConfig, Totals, WaitingFor
from durablerun._private.storage.stores import Store
from durablerun.resource import Policy

Workflow = Callable[..., Any]



@dataclasses.dataclass(frozen=True)
class ChildStub:
    """A child that does not run: it ends as soon as it is asked for, with this outcome.

    ``ChildStub({"n": 1})`` succeeds with that result; ``ChildStub(phase=Phase.FAILED, message="boom")``
    fails; ``ChildStub(phase=Phase.ABORTED, abort_reason=AbortReason.BUDGET_EXHAUSTED)`` is aborted.
    """

    result: Any = None
    phase: api.Phase = api.Phase.SUCCEEDED
    message: str = ""
    abort_reason: api.AbortReason | None = None

    def __post_init__(self) -> None:
        if not api.Phase(self.phase).finished:
            raise ValueError(f"ChildStub(phase={self.phase!r}): a stub ends at once: use Succeeded, Failed or "
                             "Aborted")


@dataclasses.dataclass
class FamilyRun:
    """One run of the family: the root (the workflow under test) or a child, and what became of it."""

    name: str
    ref: RunRef
    workflow: Workflow | str | ChildStub
    input: Any
    policy: Policy
    parent: str | None = None
    #: Child name -> the request, as the runner pod would write status.childRequests.
    requests: dict[str, dict[str, Any]] = dataclasses.field(default_factory=dict)
    #: Its attempts, and an abort the operator decides without one (a run waiting outside a Saga, or not started).
    attempts: list[AttemptResult] = dataclasses.field(default_factory=list)
    #: Finished: what its parent heard (or would have, had the parent not ended first).
    outcome: dict[str, Any] | None = None
    #: Set when its parent ended before it did: its next attempt is aborted with this message.
    aborted_by_parent: str | None = None

    @property
    def last(self) -> AttemptResult | None:
        return self.attempts[-1] if self.attempts else None

    @property
    def totals(self) -> Totals:
        return self.last.totals if self.last else Totals()


#: Makes one attempt of a run of the family: ``start(**config)`` builds its Run (EngineConfig fields over
#: the family's, and ``sinks``). ``WorkflowTest`` runs it as it is; the CLI holds the run's owner record
#: around it. An attempt that cannot start (held elsewhere) returns one ending Waiting with ``waiting`` None.
Attempter = Callable[[FamilyRun, Callable[..., Run]], AttemptResult]


def _attempt_here(member: FamilyRun, start: Callable[..., Run]) -> AttemptResult:
    return start().run_attempt()


class LocalFamily:
    """A root run and every run it (and its children) asked for, in one store.

    ``attempt(name)`` runs one attempt of a run; ``settle()`` attempts every child that can move until
    none can. ``signals`` holds what became of each signal, as the operator's ``status.signals``. With
    ``clocks``, a child whose wake time or event deadline has passed can move (the CLI); without, it stays
    waiting (a test does not wait for clocks).
    """

    def __init__(self, store: Store, config: EngineConfig,
                 children: Mapping[str, Workflow | ChildStub] | None = None, *, max_attempts: int = 500,
                 attempter: Attempter = _attempt_here, clocks: bool = False) -> None:
        self.store, self.config = store, config
        self.children = dict(children or {})
        self.max_attempts = max_attempts
        self.attempter, self.clocks = attempter, clocks
        self.runs: dict[str, FamilyRun] = {}
        self.signals: dict[str, relations.SignalState] = {}
        self._lock = threading.RLock()  # requests come from step threads (ctx.gather of start_child, say)

    def add_root(self, ref: RunRef, workflow: Workflow | str, input: Any, policy: Policy | None) -> FamilyRun:
        self.root = FamilyRun(ref.name, ref, workflow, input, policy or Policy())
        self.runs[self.root.name] = self.root
        return self.root

    @classmethod
    def restore(cls, store: Store, config: EngineConfig, ref: RunRef, workflow: Workflow | str, input: Any,
                policy: Policy | None, **options: Any) -> LocalFamily:
        """The family of run ``ref`` as its store holds it: the children it asked for (theirs too), each
        with its last attempt's outcome (from its ``status.json``), outcomes not yet told told."""
        family = cls(store, config, **options)
        root = family.add_root(ref, workflow, input, policy)
        status = store.run_store(ref).read_status()
        if status is not None:  # its last attempt (not its ending: the root is about to be attempted again)
            root.attempts.append(_stored_attempt(status))
        family._restore_children(root)
        return family

    def _restore_children(self, parent: FamilyRun) -> None:
        for child, request in self.store.run_store(parent.ref).read_child_requests().items():
            parent.requests[child] = request
            member = self._admit(parent, child, request)
            if member is None or isinstance(member.workflow, ChildStub):
                continue
            self._restore_children(member)
            status = self.store.run_store(member.ref).read_status()
            if status is not None:
                self._ended(member, _stored_attempt(status))

    # --- attempts ------------------------------------------------------------------------
    def attempt(self, name: str, *, policy: Policy | None = None, sinks: Sequence[Any] = (),
                **config: Any) -> AttemptResult:
        """One attempt of run ``name``, with the operator's aborts applied first (``config``: EngineConfig
        fields for this attempt, over the family's)."""
        member = self.runs[name]
        workflow = member.workflow
        if isinstance(workflow, ChildStub):
            raise errors.ConfigError(f"run {name!r} is a stub: it has no attempts")
        policy = policy or member.policy
        abort = self._abort_due(member, policy)
        last = member.last
        if abort is not None and (last is None or (last.outcome == api.Outcome.WAITING and last.waiting is not None
                                                   and not last.waiting.compensations)):
            # Nothing to undo (not started, or waiting outside a Saga): the operator ends it without a pod.
            result = AttemptResult(api.Outcome.ABORTED, abort[1], abort_reason=abort[0],
                                   totals=member.totals, journal_records=last.journal_records if last else 0)
            self.store.run_store(member.ref).write_status(result.to_json())
            return self._ended(member, result)

        def start(**more: Any) -> Run:
            extra = list(more.pop("sinks", ()))
            run = Run(store=self.store, run=member.ref, workflow=workflow, input=member.input,
                      policy=policy, sinks=[*sinks, *extra],
                      config=dataclasses.replace(self.config, runs=_Broker(self, name), **{**config, **more}))
            if abort is not None:
                run.request_abort(*abort)
            return run

        return self._ended(member, self.attempter(member, start))

    def settle(self) -> None:
        """Attempt the children until each has finished or waits for what no run here gives."""
        for _ in range(self.max_attempts):
            ready = self.ready()
            if not ready:
                return
            for member in ready:
                self.attempt(member.name)
        raise errors.WorkflowError(f"child runs still not settled after {self.max_attempts} attempts: "
                                   "a child that keeps restarting?")

    def ready(self) -> list[FamilyRun]:
        """The children that can move now."""
        return [m for m in self.runs.values() if m.parent is not None and self._can_move(m)]

    def _can_move(self, m: FamilyRun) -> bool:
        last = m.last
        if isinstance(m.workflow, ChildStub) or m.outcome is not None:
            return False
        if last is None or m.aborted_by_parent is not None or last.outcome == api.Outcome.SUSPENDED:
            return True
        waiting = last.waiting
        if last.outcome != api.Outcome.WAITING or waiting is None:
            return False
        if waiting.event is not None and self.store.get_event(run=m.ref, name=waiting.event) is not None:
            return True
        due = [t for t in (waiting.deadline, waiting.wake_time) if t is not None]
        return self.clocks and bool(due) and min(due) <= api.now()

    def descendants_usd(self, name: str) -> Decimal:
        """The cost of run ``name``'s children, theirs included (the operator's childrenTotal.usd)."""
        return sum((c.totals.usd + self.descendants_usd(c.name) for c in self.runs.values() if c.parent == name),
                   Decimal(0))

    def _abort_due(self, m: FamilyRun, policy: Policy) -> tuple[api.AbortReason, str] | None:
        """The operator's aborts (decide.aborts, decide.family): its parent ended, or its children's cost."""
        if m.aborted_by_parent is not None:
            return api.AbortReason.USER_REQUESTED, f"aborted by request: {m.aborted_by_parent}"
        ceiling, children = policy.costCeilingUSD, self.descendants_usd(m.name)
        if ceiling is None or children <= 0 or m.totals.usd + children < Decimal(ceiling):
            return None
        return api.AbortReason.BUDGET_EXHAUSTED, (
            f"the run's cost ${m.totals.usd} and its child runs' ${children} reach policy.costCeilingUSD "
            f"${ceiling}; raise it to resume")

    # --- what the operator does with an ending -----------------------------------------
    def _ended(self, m: FamilyRun, result: AttemptResult) -> AttemptResult:
        m.attempts.append(result)
        phase = result.outcome.final_phase
        if phase is not None:
            self._finished(m, phase, result)
        return result

    def _finished(self, m: FamilyRun, phase: api.Phase, result: AttemptResult) -> None:
        # As the operator sends it: a result too big to ride along is read from the child's journal.
        m.outcome = relations.child_outcome(
            phase, result_json=(result.result_info or {}).get("inline"), message=result.message,
            abort_reason=result.abort_reason.value if result.abort_reason is not None else None)
        self._tell_parent(m)
        for child in self.runs.values():
            if child.parent == m.name and child.outcome is None:
                child.aborted_by_parent = f"its parent {m.name} {phase.value}"

    def _tell_parent(self, m: FamilyRun) -> None:
        parent = self.runs.get(m.parent or "")
        if parent is None or parent.outcome is not None or m.aborted_by_parent is not None or m.outcome is None:
            return
        self.store.put_event(run=parent.ref, name=relations.child_event(m.name[len(parent.name) + 1:]),
                             payload=m.outcome)

    # --- the broker's requests -----------------------------------------------------------
    def request_child(self, parent_name: str, child: str, request: dict[str, Any]) -> str:
        with self._lock:
            return self._request_child(parent_name, child, request)

    def _request_child(self, parent_name: str, child: str, request: dict[str, Any]) -> str:
        parent = self.runs[parent_name]
        name = relations.child_run_name(parent.name, child)
        if child not in parent.requests:
            if len(parent.requests) >= api.CHILDREN_MAX:
                raise too_many_children(f"ctx.start_child({child!r})", len(parent.requests))
            # Kept in the store before anything acts on it, as the runner pod's status.childRequests.
            parent.requests[child] = self.store.run_store(parent.ref).put_child_request(child, request)
            self._admit(parent, child, parent.requests[child])
        if parent.requests[child] != request:
            raise errors.NonRetryableError(
                f"ctx.start_child({child!r}): this run already asked for {child!r} with other arguments "
                f"({parent.requests[child]}); a name stands for one request: use another name")
        return name

    def _admit(self, parent: FamilyRun, child: str, request: dict[str, Any]) -> FamilyRun | None:
        """What the operator does with a request: the child run (None: refused, and the parent told why)."""
        name = relations.child_run_name(parent.name, child)
        event = relations.child_event(child)
        if name in self.runs:
            self.store.put_event(run=parent.ref, name=event, payload=relations.child_outcome(
                api.Phase.FAILED, message=f"a DurableRun {name} exists that is not a child of {parent.name}"))
            return None
        try:
            spec = relations.ChildRequest.model_validate(request)
            policy = resource.child_policy(parent.policy, spec)
        except ValueError as error:
            self.store.put_event(run=parent.ref, name=event, payload=relations.child_outcome(
                api.Phase.FAILED, message=f"refused: {error}"))
            return None
        workflow = self.children.get(spec.workflow, spec.workflow)
        member = FamilyRun(name, RunRef.local(name), workflow, spec.input, policy, parent=parent.name)
        self.runs[name] = member
        if isinstance(workflow, ChildStub):
            # A stub has no journal to read a result from: its result rides along whatever its size.
            member.outcome = relations.child_outcome(
                api.Phase(workflow.phase), message=workflow.message,
                abort_reason=api.AbortReason(workflow.abort_reason).value if workflow.abort_reason else None)
            if workflow.phase == api.Phase.SUCCEEDED:
                member.outcome = {"phase": api.Phase.SUCCEEDED.value, "result": json.loads(json.dumps(workflow.result))}
            self._tell_parent(member)
        return member

    def request_signal(self, sender: str, signal_id: str, run: str, event: str, value: Any) -> None:
        with self._lock:
            self._request_signal(f"{sender}/{signal_id}", run, event, value)

    def _request_signal(self, key: str, run: str, event: str, value: Any) -> None:
        if key in self.signals:
            return
        member, payload = self.runs.get(run), value
        # Any run of the store, as the operator delivers to any DurableRun of the namespace.
        target = member.ref if member is not None else RunRef.local(run)
        if member is None and self.store.run_store(target).read_manifest() is None:
            state = relations.SignalState(state="NotFound", message=f"no run {run} in {self.store.uri}")
        elif self.store.put_event(run=target, name=event, payload=payload):
            state = relations.SignalState(state="Delivered")
        else:
            found = self.store.get_event(run=target, name=event)
            state = (relations.SignalState(state="Delivered") if found is not None and found.payload == payload
                     else relations.SignalState(state="Ignored", message=f"{run} already had another value for "
                                               f"event {event!r}: the first value wins"))
        self.signals[key] = state

    def read_result(self, run: str) -> Any:
        member = self.runs.get(run)
        if member is None:
            raise errors.NonRetryableError(f"no child run {run} in this test")
        return read_result(self.store, member.ref)


def _stored_attempt(status: dict[str, Any]) -> AttemptResult:
    """A run's last attempt as its ``status.json`` recorded it (what a restored family knows of it)."""
    cost = status.get("cost") or {}
    reason = status.get("abortReason")
    return AttemptResult(
        api.Outcome(status["outcome"]), str(status.get("message") or ""),
        abort_reason=api.AbortReason(reason) if reason else None,
        waiting=WaitingFor.from_json(status.get("waitingFor")),
        totals=Totals(Decimal(str(cost.get("usd") or 0)), int(cost.get("tokens") or 0), int(status.get("steps") or 0)),
        journal_records=int(status.get("journalRecords") or 0))


class _Broker:
    """One run's ``RunBroker`` (durablerun._private.engine.children): its requests go to the family."""

    def __init__(self, family: LocalFamily, name: str) -> None:
        self.family, self.name = family, name

    def request_child(self, name: str, request: dict[str, Any]) -> str:
        return self.family.request_child(self.name, name, request)

    def request_signal(self, signal_id: str, run: str, event: str, value: Any) -> None:
        self.family.request_signal(self.name, signal_id, run, event, value)

    def read_result(self, run: str, uid: str) -> Any:
        return self.family.read_result(run)
