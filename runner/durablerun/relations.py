"""The contract of child runs and signals: how one DurableRun asks for, hears from and signals others.

A runner never creates or patches another run: it asks through its own status (``childRequests``,
``signalRequests``; written with its lease's epoch guard), and the operator acts and reports back: a
child's outcome arrives as the parent's event ``CHILD_EVENT_PREFIX + <child>``, first value wins
(docs/operator.md#child-runs-and-signals). This module holds those requests and states (the status
fields' types in ``durablerun.resource``), the child's name and the outcome event's shape. What needs
the spec models (a child's spec and policy) is in ``durablerun.resource``, which imports this module:
this module imports ``durablerun.api`` only.
"""

from __future__ import annotations

import json
import re
from typing import Any, Literal

from pydantic import Field

from durablerun.api import WORKFLOW_PATTERN, Phase, _Model

#: Event names the operator writes into a parent's spec.events: one per child, its outcome.
CHILD_EVENT_PREFIX = "durablerun.child."
#: A run's name is the value of its pods' durablerun.dev/run label: at most 63 characters.
RUN_NAME_MAX = 63
_DNS_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")

#: A finished child's result rides in its outcome event up to this many bytes of JSON, a failure's message up
#: to CHILD_MESSAGE_MAX characters: a parent holds one outcome per child (1,000: api.CHILDREN_MAX). A bigger
#: result the parent's runner reads from the child's journal; the whole message is in the child's status.
CHILD_RESULT_INLINE_MAX = 200
CHILD_MESSAGE_MAX = 512


def child_event(child: str) -> str:
    """The event in the parent's spec.events that carries child ``child``'s outcome."""
    return CHILD_EVENT_PREFIX + child


def child_outcome(phase: Phase, *, result_json: str | None = None, uid: str = "", message: str | None = None,
                  abort_reason: str | None = None) -> dict[str, Any]:
    """What a finished child's parent receives as event ``child_event(<child>)``, from the operator or from
    ``durablerun run``/``WorkflowTest``: compact, since a parent holds one per child (its cost is in
    ``childrenTotal``, everything else in the child's status). A result over CHILD_RESULT_INLINE_MAX bytes of
    JSON is named by the child's ``uid`` instead: the parent's runner reads it from the child's journal."""
    out: dict[str, Any] = {"phase": phase.value}
    if phase == Phase.SUCCEEDED:
        if result_json is not None and len(result_json.encode()) <= CHILD_RESULT_INLINE_MAX:
            out["result"] = json.loads(result_json)
        else:
            out["uid"] = uid
        return out
    text = message or phase.value
    out["message"] = text if len(text) <= CHILD_MESSAGE_MAX else text[:CHILD_MESSAGE_MAX - 1] + "…"
    if abort_reason is not None:
        out["abortReason"] = abort_reason
    return out


def child_run_name(parent: str, child: str) -> str:
    """The child's DurableRun name, ``<parent>-<child>``; ValueError naming the fix if it cannot be one."""
    if not isinstance(child, str) or not _DNS_LABEL.match(child):
        raise ValueError(f"child name {child!r}: use lowercase letters, digits and '-', starting and ending "
                         "with a letter or digit (it becomes part of a DurableRun's name)")
    full = f"{parent}-{child}"
    if len(full) > RUN_NAME_MAX:
        raise ValueError(f"child name {child!r}: the child's DurableRun would be {full!r}, {len(full)} "
                         f"characters; a run's name may have at most {RUN_NAME_MAX} (it labels the run's "
                         f"pods): use a child name of at most {RUN_NAME_MAX - len(parent) - 1} characters")
    return full


def valid_run_name(name: str) -> str:
    """A DurableRun's name in the same namespace (a signal's target); ValueError naming the fix."""
    if not isinstance(name, str) or not _DNS_LABEL.match(name) or len(name) > RUN_NAME_MAX:
        raise ValueError(f"run name {name!r}: a DurableRun's name is 1-{RUN_NAME_MAX} lowercase letters, "
                         "digits and '-', starting and ending with a letter or digit")
    return name


class ChildRequest(_Model):
    """A child run the workflow asked for (ctx.start_child); written by the runner, acted on by the operator."""

    workflow: str = Field(description="The child's workflow, module:function.", pattern=WORKFLOW_PATTERN)
    input: dict[str, Any] = Field(
        default_factory=dict, description="The child's input.",
        json_schema_extra={"x-kubernetes-preserve-unknown-fields": True})
    policy: dict[str, Any] = Field(
        default_factory=dict,
        description="Policy fields that differ from the parent's (budgets may only be lowered).",
        json_schema_extra={"x-kubernetes-preserve-unknown-fields": True})


class ChildState(_Model):
    run: str = Field(description="The child's DurableRun (same namespace).")
    uid: str = Field(description="The child's uid: a child that disappears is not created again.")
    phase: Phase | None = Field(default=None, description="The child's phase, as last seen.")


class ChildrenTotal(_Model):
    runs: int = Field(default=0, description="Child runs created.")
    finished: int = Field(default=0, description="Child runs that have finished.")
    summary: str = Field(default="", description='For kubectl get: "3/5" (finished of created).')
    usd: str = Field(default="0", description="The children's cost, their own children's included.")
    tokens: int = Field(default=0, description="The children's tokens.")


class SignalRequest(_Model):
    """An event the workflow sends to another run (ctx.signal); written by the runner."""

    run: str = Field(description="The DurableRun (same namespace) to send it to.")
    event: str = Field(description="The event's name in the target's spec.events.")
    value: str = Field(default="null", description="The payload, as JSON text.")


class SignalState(_Model):
    state: Literal["Delivered", "Ignored", "NotFound"] = Field(
        description="Delivered; Ignored (the target already had another value: the first one wins); "
                    "NotFound (no such run).")
    message: str | None = Field(default=None, description="Details for humans.")
