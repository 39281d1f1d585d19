"""Child runs and signals: a workflow asks the operator for other DurableRuns, through its own status.

Built on the public operations of the context: asking is a step (journaled, so a replay never asks
again; a crash between the ask and the journal asks once more, which the child's deterministic name
makes a no-op), and a child's outcome is an event the operator sends the parent
(``relations.child_event``), read with ``wait_for_event``: a parent waiting for a child holds no pod.

``RunBroker`` is what an attempt needs for that; the runner pod provides one (``PodBroker``), and
``WorkflowTest`` and the local ``durablerun run`` one that runs the children in-process (``family``). An
embedded ``Run`` given none fails these operations, saying so.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Callable, Coroutine, Generator
from typing import TYPE_CHECKING, Any, Protocol

from durablerun import api, errors, relations
from durablerun._private.records import codec
from durablerun._private.records.layout import RunRef
from durablerun._private.records.model import CompleteRecord

if TYPE_CHECKING:
    from durablerun._private.storage.stores import Store

NO_OPERATOR = ("needs the durable-run operator: child runs and signals are DurableRuns the operator "
               "creates and updates; run the workflow as a DurableRun, or with `durablerun run` or "
               "durablerun.testing.WorkflowTest, which run child runs in-process (this Run was given no "
               "EngineConfig.runs broker)")


class RunBroker(Protocol):
    """How an attempt asks for other runs. Its methods block (they run inside steps)."""

    def request_child(self, name: str, request: dict[str, Any]) -> str:
        """Publish the request for child ``name``; the child's DurableRun name."""

    def request_signal(self, signal_id: str, run: str, event: str, value: Any) -> None:
        """Publish a signal request under ``signal_id``."""

    def read_result(self, run: str, uid: str) -> Any:
        """The result a Succeeded child journaled."""


class Workflow(Protocol):
    """What child runs need of the workflow's DurableContext (which passes itself in): a protocol, so that
    this module sits below context.py (docs/architecture.md)."""

    @property
    def run_id(self) -> str: ...

    @property
    def step(self) -> Callable[..., Coroutine[Any, Any, Any]]: ...

    async def wait_for_event(self, name: str) -> Any: ...

    def idempotency_key(self) -> str: ...


def _broker(broker: RunBroker | None, what: str) -> RunBroker:
    if broker is None:
        raise errors.WorkflowError(f"{what} {NO_OPERATOR}")
    return broker


class ChildRun:
    """A started child run. ``await handle`` (or ``await handle.result()``) returns its result.

    Awaiting it takes a journal position like ``wait_for_event``: pass handles to ``ctx.gather`` to
    wait for several. While the child runs, the parent's attempt ends Waiting (no pod); the operator
    wakes it when the child finishes.
    """

    def __init__(self, ctx: Workflow, broker: RunBroker, name: str, run: str) -> None:
        self._ctx, self._broker, self.name, self.run = ctx, broker, name, run

    def __await__(self) -> Generator[Any, None, Any]:
        return self.result().__await__()

    async def result(self) -> Any:
        outcome = await self._ctx.wait_for_event(relations.child_event(self.name))
        if not isinstance(outcome, dict):
            raise errors.WorkflowError(f"child run {self.run}: its outcome event holds {outcome!r}, not an outcome")
        phase = str(outcome.get("phase"))
        if phase != api.Phase.SUCCEEDED:
            raise errors.ChildRunFailed(self.name, self.run, phase, str(outcome.get("message") or ""),
                                 outcome.get("abortReason"))
        if "result" in outcome:
            return outcome["result"]
        # Too big for the child's status: read it from the child's journal (the parent's store) once.
        return await self._ctx.step(f"child-result:{self.name}", self._broker.read_result, self.run,
                                    str(outcome["uid"]))

    def __repr__(self) -> str:
        return f"ChildRun({self.name!r}, run={self.run!r})"


async def start_child(ctx: Workflow, runs: RunBroker | None, name: str, workflow: str,
                      input: dict[str, Any] | None, policy: dict[str, Any] | None) -> ChildRun:
    broker = _broker(runs, f"ctx.start_child({name!r})")
    parent = ctx.run_id.split("/")[1]
    try:
        relations.child_run_name(parent, name)
        request = relations.ChildRequest(workflow=workflow, input=input or {}, policy=policy or {})
        payload = json.loads(codec.dumps(request.model_dump(mode="json")))
    except (ValueError, TypeError) as error:
        raise errors.WorkflowError(f"ctx.start_child({name!r}): {error}") from None
    run = await ctx.step(f"start-child:{name}", broker.request_child, name, payload)
    return ChildRun(ctx, broker, name, str(run))


async def signal(ctx: Workflow, runs: RunBroker | None, run: str, event: str, value: Any) -> None:
    broker = _broker(runs, f"ctx.signal({run!r}, {event!r})")
    try:
        relations.valid_run_name(run)
        api.check_event_name(event)
        payload = json.loads(codec.dumps(value))
    except (ValueError, TypeError, errors.ConfigError) as error:
        raise errors.WorkflowError(f"ctx.signal({run!r}, {event!r}): {error}") from None

    def send() -> None:
        # The step's position: stable across resumes and retries, unique in the run (generations prefix it).
        signal_id = ctx.idempotency_key().split(":")[1]
        broker.request_signal(signal_id, run, event, payload)

    await ctx.step(f"signal:{run}:{event}", send)


# --- the runner pod's broker ---------------------------------------------------------------


def too_many_children(what: str, started: int) -> errors.NonRetryableError:
    """The error for a child past api.CHILDREN_MAX (every broker refuses it before asking)."""
    return errors.NonRetryableError(
        f"{what}: this run has started {started:,} child runs, the most one run may start "
        "(durablerun.api.CHILDREN_MAX: each child's request and outcome live in the parent's "
        f"DurableRun, which etcd caps at 1.5 MiB). Start the rest from the children (each may start "
        f"{api.CHILDREN_MAX:,} of its own), or split the work over more parent runs")


def _pointer(key: str) -> str:
    return key.replace("~", "~0").replace("/", "~1")


class PodBroker:
    """Asks through this run's own DurableRun status (``publish``: an epoch-guarded JSON patch whose
    reply is the run; ``latest``: the run as last read). Reads a child's result from ``store``."""

    def __init__(self, *, namespace: str, name: str, store: Store,
                 publish: Callable[[list[dict[str, Any]]], dict[str, Any]],
                 latest: Callable[[], dict[str, Any]]) -> None:
        self.namespace, self.name, self.store = namespace, name, store
        self._publish, self._latest = publish, latest
        self._lock = threading.Lock()

    def _ask(self, field: str, key: str, value: dict[str, Any], what: str, most: int | None = None) -> None:
        with self._lock:
            asked = dict((self._latest().get("status") or {}).get(field) or {})
            if key in asked:
                if asked[key] != value:
                    raise errors.NonRetryableError(
                        f"{what}: this run already asked for {key!r} with other arguments ({asked[key]}); "
                        "a name stands for one request: use another name")
                return  # asked before (an attempt that crashed before journaling it): nothing to do
            if most is not None and len(asked) >= most:
                raise too_many_children(what, len(asked))
            if asked:
                ops = [{"op": "add", "path": f"/status/{field}/{_pointer(key)}", "value": value}]
            else:
                ops = [{"op": "add", "path": f"/status/{field}", "value": {key: value}}]
            self._publish(ops)

    def request_child(self, name: str, request: dict[str, Any]) -> str:
        run = relations.child_run_name(self.name, name)
        self._ask("childRequests", name, request, f"ctx.start_child({name!r})", most=api.CHILDREN_MAX)
        return run

    def request_signal(self, signal_id: str, run: str, event: str, value: Any) -> None:
        self._ask("signalRequests", signal_id, {"run": run, "event": event, "value": codec.dumps(value).decode()},
                  f"ctx.signal({run!r}, {event!r})")

    def read_result(self, run: str, uid: str) -> Any:
        return read_result(self.store, RunRef.kubernetes(self.namespace, run, uid))


def read_result(store: Store, ref: RunRef) -> Any:
    """The result a completed run journaled (its last record), from its store."""
    rs = store.run_store(ref)
    try:
        records = rs.load().records
        done = records[-1] if records and isinstance(records[-1], CompleteRecord) else None
        if done is None:
            raise errors.NonRetryableError(f"run {ref} has no result in {store.describe().get('uri')}: "
                                           "it has not completed")
        body = rs.get_blob(done.ref) if done.ref is not None else done.inline_json()
    finally:
        rs.close()
    return json.loads(body)
