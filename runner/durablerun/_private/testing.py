"""Running workflows in unit tests: in memory, events delivered on cue."""

from __future__ import annotations

import uuid
from collections.abc import Mapping
from datetime import timedelta
from typing import Any

from durablerun._private.backends import memory
from durablerun._private.engine import Run, Workflow
from durablerun._private.layout import RunRef
from durablerun._private.model import AttemptResult, EngineConfig
from durablerun._private.stores import Store, open_store
from durablerun.api import Outcome
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
    ) -> None:
        self.workflow = workflow
        self.input = input
        self.policy = policy
        self.config = config or FAST
        self.ref = RunRef.local(run_id)
        self._own_store = store is None
        self.store = store or open_store(f"memory://test-{uuid.uuid4().hex}")
        self.attempts: list[AttemptResult] = []

    def attempt(self, *, policy: Policy | None = None) -> AttemptResult:
        """Run one attempt (a fresh process would do the same) and return its outcome."""
        result = Run(store=self.store, run=self.ref, workflow=self.workflow, input=self.input,
                     policy=policy or self.policy, config=self.config).run_attempt()
        self.attempts.append(result)
        return result

    def send_event(self, name: str, payload: Any = None) -> bool:
        """Send an event (first write wins); True if this one won."""
        return self.store.put_event(run=self.ref, name=name, payload=payload)

    def run_to_end(self, *, events: Mapping[str, Any] | None = None,
                   max_attempts: int = 50) -> AttemptResult:
        """Attempt until the run stops waiting for something ``events`` can give it."""
        events = dict(events or {})
        result = self.attempt()
        for _ in range(max_attempts):
            waiting = result.waiting
            if result.outcome != Outcome.WAITING or waiting is None:
                return result
            if waiting.event is None or waiting.event not in events:
                return result
            self.send_event(waiting.event, events.pop(waiting.event))
            result = self.attempt()
        return result

    def close(self) -> None:
        if self._own_store:
            backend = self.store.backend
            if isinstance(backend, memory.MemoryBackend):
                memory.reset(backend.name)
