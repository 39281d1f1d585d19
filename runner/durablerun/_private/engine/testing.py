"""Running workflows in unit tests: in memory, events delivered on cue, child runs run in-process."""

from __future__ import annotations

import uuid
from collections.abc import Mapping
from datetime import timedelta
from typing import Any

from durablerun._private.engine.family import ChildStub, FamilyRun, LocalFamily
from durablerun._private.engine.run import Run, Workflow
from durablerun._private.records.layout import RunRef
from durablerun._private.records.model import AttemptResult, EngineConfig
from durablerun._private.storage.backends import memory
from durablerun._private.storage.stores import Store, open_store
from durablerun.api import Outcome
from durablerun.relations import SignalState
from durablerun.resource import Policy

#: Retries in milliseconds instead of seconds: tests should not wait.
FAST = EngineConfig(retry_initial=timedelta(milliseconds=1), retry_max=timedelta(milliseconds=10))


class WorkflowTest:
    """A run in a private in-memory store, driven attempt by attempt.

    ::

        t = WorkflowTest(research, {"topic": "x"})
        first = t.attempt()                       # e.g. Waiting for "plan_review"
        t.send_event("plan_review", {"status": "approved"})
        assert t.attempt().result == {...}
        assert t.run_to_end(events={...}).outcome == Outcome.COMPLETED

    Every attempt replays the journal the way a restarted pod would, so a test
    can check that steps do not run twice.

    Child runs (``ctx.start_child``) run in this process, each with its own journal in the same
    store, after the attempt that asked for them, as the operator would run them: their outcomes
    (results, failures) reach the parent as the events the operator sends, a parent that ends aborts
    its unfinished children, and ``ctx.signal`` delivers to any run of the family. ``children`` maps a
    child's ``module:function`` to the workflow to run instead, or to a :class:`ChildStub` (an outcome,
    nothing run); others are imported by name, as the child's pod would. ``runs`` holds every run by
    name (``t.runs["test-a"].attempts``), ``signals`` what became of each signal. A broker set in
    ``config.runs`` replaces all of this.
    """

    def __init__(
        self,
        workflow: Workflow,
        input: Any = None,
        *,
        policy: Policy | None = None,
        config: EngineConfig | None = None,
        run_id: str = "test",
        store: Store | None = None,
        children: Mapping[str, Workflow | ChildStub] | None = None,
    ) -> None:
        self.workflow = workflow
        self.input = input
        self.policy = policy
        self.config = config or FAST
        self.ref = RunRef.local(run_id)
        self._own_store = store is None
        self.store = store or open_store(f"memory://test-{uuid.uuid4().hex}")
        self.attempts: list[AttemptResult] = []
        self.children = dict(children or {})
        self._family: LocalFamily | None = None

    def _local_family(self) -> LocalFamily:
        if self._family is None or self._family.config is not self.config:
            self._family = LocalFamily(self.store, self.config, self.children)
            self._family.add_root(self.ref, self.workflow, self.input, self.policy)
        return self._family

    @property
    def runs(self) -> Mapping[str, FamilyRun]:
        """This run and its children (theirs too), by run name: ``<run_id>-<child name>``."""
        return self._local_family().runs

    @property
    def signals(self) -> Mapping[str, SignalState]:
        """What became of each ``ctx.signal``, by ``<sender>/<signal id>``: Delivered, Ignored or NotFound."""
        return self._local_family().signals

    def attempt(self, *, policy: Policy | None = None) -> AttemptResult:
        """Run one attempt (a fresh process would do the same), then the child runs it asked for until
        each finishes or waits; return the attempt's outcome."""
        if self.config.runs is not None:  # the test's own broker
            result = Run(store=self.store, run=self.ref, workflow=self.workflow, input=self.input,
                         policy=policy or self.policy, config=self.config).run_attempt()
        else:
            family = self._local_family()
            result = family.attempt(self.ref.name, policy=policy)
            family.settle()
        self.attempts.append(result)
        return result

    def send_event(self, name: str, payload: Any = None, *, run: str | None = None) -> bool:
        """Send an event to this run, or to run ``run`` of the family (first write wins); True if this one won."""
        ref = self.ref if run is None else self.runs[run].ref
        won = self.store.put_event(run=ref, name=name, payload=payload)
        if run is not None and self.config.runs is None:
            self._local_family().settle()
        return won

    def run_to_end(self, *, events: Mapping[str, Any] | None = None,
                   max_attempts: int = 50) -> AttemptResult:
        """Attempt until the run stops waiting for something ``events`` can give it."""
        events = dict(events or {})
        result = self.attempt()
        for _ in range(max_attempts):
            waiting = result.waiting
            if result.outcome != Outcome.WAITING or waiting is None:
                return result
            if waiting.event is None:
                return result
            if self.store.get_event(run=self.ref, name=waiting.event) is None:  # e.g. a child's outcome
                if waiting.event not in events:
                    return result
                self.send_event(waiting.event, events.pop(waiting.event))
            result = self.attempt()
        return result

    def close(self) -> None:
        if self._own_store:
            backend = self.store.backend
            if isinstance(backend, memory.MemoryBackend):
                memory.reset(backend.name)
