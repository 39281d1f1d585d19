"""The family: a run's child runs and the signals it sends to other runs.

The runner asks (``status.childRequests``, ``status.signalRequests``); the
operator acts, in ``act``, after the run's own transition: it creates the
requested children, tells the parent each one's outcome (an event in its
``spec.events``), passes a parent's suspension and ending on to its children,
and delivers signals. ``related_names`` tells the reconciler which other runs
to read for that, ``children`` which of them are this run's.

A child's state is its own DurableRun: the parent keeps only the names of the
children created (``status.childrenCreated``, so that one deleted before it
finished is never created again), their count and cost (``childrenTotal``)
and each finished child's compact outcome event.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Mapping
from decimal import Decimal, InvalidOperation
from typing import Any

from durablerun import api, relations
from durablerun_operator import builders
from durablerun_operator.decide import facts, transition


def related_names(run: facts.RunView) -> set[str]:
    """The runs ``decide`` needs to see besides this one: its requested children, its pending signals' targets."""
    names = set()
    for child in run.status.childRequests:
        with contextlib.suppress(ValueError):  # refused by decide, naming why
            names.add(relations.child_run_name(run.name, child))
    names.update(r.run for key, r in run.status.signalRequests.items() if key not in run.status.signals)
    return names


def owner_uid(run: facts.RunView) -> str | None:
    for ref in run.body["metadata"].get("ownerReferences") or []:
        if ref.get("kind") == api.KIND and ref.get("controller"):
            return str(ref.get("uid"))
    return None


def children(run: facts.RunView, related: Mapping[str, facts.RunView | None]) -> dict[str, facts.RunView]:
    """This run's children that exist, by child name (the name its workflow gave)."""
    out = {}
    for child in run.status.childRequests:
        try:
            found = related.get(relations.child_run_name(run.name, child))
        except ValueError:
            continue
        if found is not None and owner_uid(found) == run.uid:
            out[child] = found
    return out


def children_total(children: Mapping[str, facts.RunView]) -> relations.ChildrenTotal | None:
    if not children:
        return None
    usd, tokens, finished = Decimal(0), 0, 0
    for child in children.values():
        grand = child.status.childrenTotal
        with contextlib.suppress(InvalidOperation):
            usd += Decimal(child.status.cost.usd) + (Decimal(grand.usd) if grand else 0)
        tokens += child.status.cost.tokens + (grand.tokens if grand else 0)
        finished += bool(child.status.phase and child.status.phase.finished)
    return relations.ChildrenTotal(runs=len(children), finished=finished, summary=f"{finished}/{len(children)}",
                             usd=f"{usd:f}", tokens=tokens)


def child_outcome(child: facts.RunView) -> dict[str, Any]:
    """A finished child's outcome event for its parent (relations.child_outcome)."""
    status = child.status
    assert status.phase is not None
    return relations.child_outcome(status.phase, result_json=status.result.inline if status.result else None,
                                  uid=child.uid, message=status.message,
                                  abort_reason=status.abortReason.value if status.abortReason else None)


def act(t: transition.Transition) -> None:
    """Create requested children, report their outcomes, pass suspension and endings on, deliver signals."""
    run, status, new = t.run, t.run.status, t.new
    phase = new.phase or status.phase
    ended = bool(phase and phase.finished)
    known = facts.children_created(status)
    for child, request in status.childRequests.items():
        event = relations.child_event(child)
        found = t.children.get(child)
        if found is None:
            _missing_child(t, child, request, ended, child in known)
            continue
        known.add(child)
        active = not (found.status.phase and found.status.phase.finished)
        by_parent = api.ANNOTATION_ABORTED_BY_PARENT in found.annotations
        if not active and not by_parent and not ended and event not in run.spec.events:
            outcome = child_outcome(found)
            t.plan.add_events[event] = outcome
            t.event("ChildSucceeded" if outcome["phase"] == api.Phase.SUCCEEDED else "ChildFailed",
                    f"child run {found.name} {outcome['phase']}" + (f": {outcome['message']}" if "message" in outcome
                                                                   else ""),
                    warning=outcome["phase"] != api.Phase.SUCCEEDED)
        _propagate(t, found, active, ended)
    # Only until its outcome is in spec.events, which then keeps it from being created again: the set stays as
    # small as the children in flight. (Not when the outcome is just sent: that patch may yet fail.)
    known -= {child for child in known if relations.child_event(child) in run.spec.events}
    if known != set(status.childrenCreated or ()):  # new children, reported ones, an older operator's `children`
        new.childrenCreated = sorted(known) or None
    if status.children:
        new.children = None
    if t.children_total != status.childrenTotal:
        new.childrenTotal = t.children_total
    _signals(t)


def _missing_child(t: transition.Transition, child: str, request: relations.ChildRequest, ended: bool,
                   was_created: bool) -> None:
    run = t.run
    event = relations.child_event(child)
    if ended or event in run.spec.events:
        return
    try:
        name = relations.child_run_name(run.name, child)
        manifest = builders.child_run(run.body, child, request)
    except ValueError as error:
        t.plan.add_events[event] = relations.child_outcome(api.Phase.FAILED, message=f"refused: {error}")
        t.event("ChildRefused", f"child {child!r} not created: {error}", warning=True)
        return
    other = t.related.get(name)
    if was_created:
        # Created once and gone (deleted by someone): never started again, its parent hears it failed.
        t.plan.add_events[event] = {"phase": api.Phase.FAILED.value, "uid": "",
                                    "message": f"child run {name} was deleted before it finished"}
        t.event("ChildFailed", f"child run {name} was deleted before it finished", warning=True)
    elif other is not None:
        t.plan.add_events[event] = {"phase": api.Phase.FAILED.value, "uid": other.uid,
                                    "message": f"a DurableRun {name} exists that is not a child of {run.name}"}
        t.event("ChildRefused", f"child {child!r} not created: DurableRun {name} exists and is not this "
                "run's child", warning=True)
    else:
        t.plan.create_runs.append(manifest)
        t.event("ChildStarted", f"child run {name} ({request.workflow})")


def _propagate(t: transition.Transition, child: facts.RunView, active: bool, ended: bool) -> None:
    """A suspended parent suspends its running children; an ended one aborts them; both are lifted with it.

    Each patch carries the child's resourceVersion: had the child changed since it was read (it just
    finished, say), the patch is refused and the decision made again on what it is now.
    """
    annotations, name = child.annotations, child.name

    def patch(marks: dict[str, str | None], spec: dict[str, Any] | None = None) -> None:
        meta = {"resourceVersion": child.body["metadata"].get("resourceVersion"), "annotations": marks}
        t.plan.patch_runs.append((name, {"metadata": meta, **({"spec": spec} if spec else {})}))

    if t.run.spec.suspend and active and not child.spec.suspend:
        patch({api.ANNOTATION_SUSPENDED_BY_PARENT: "true"}, {"suspend": True})
    elif not t.run.spec.suspend and api.ANNOTATION_SUSPENDED_BY_PARENT in annotations:
        patch({api.ANNOTATION_SUSPENDED_BY_PARENT: None}, {"suspend": False})
    if ended and active and api.ANNOTATION_ABORT not in annotations:
        phase = (t.new.phase or t.run.status.phase or api.Phase.ABORTED).value
        patch({api.ANNOTATION_ABORT: f"its parent {t.run.name} {phase}", api.ANNOTATION_ABORTED_BY_PARENT: t.run.name})
        t.event("ChildAborted", f"child run {name} aborted: this run {phase}")
    elif not ended and api.ANNOTATION_ABORTED_BY_PARENT in annotations:
        lift: dict[str, str | None] = {api.ANNOTATION_ABORT: None, api.ANNOTATION_ABORTED_BY_PARENT: None}
        if child.status.phase == api.Phase.ABORTED:
            lift[api.ANNOTATION_RETRY] = f"parent-{api.format_time(t.now, precise=True)}"
        patch(lift)
        t.event("ChildResumed", f"child run {name} resumes with this run")


def _signals(t: transition.Transition) -> None:
    status = t.run.status
    for key, request in status.signalRequests.items():
        if key in status.signals:
            continue
        target = t.related.get(request.run)
        if target is None or target.deleting:
            state = relations.SignalState(state="NotFound", message=f"no DurableRun {request.run} in {t.run.namespace}")
            t.event("SignalNotDelivered", f"event {request.event!r} for {request.run}: {state.message}", warning=True)
        elif request.event not in target.spec.events:
            t.plan.patch_runs.append((request.run, {"spec": {"events": {request.event: json.loads(request.value)}}}))
            continue  # recorded once the target holds it
        elif target.spec.events[request.event] == json.loads(request.value):
            state = relations.SignalState(state="Delivered")
            t.event("SignalDelivered", f"event {request.event!r} delivered to {request.run}")
        else:
            state = relations.SignalState(state="Ignored", message=f"{request.run} already had another value for "
                                    f"event {request.event!r}: the first value wins")
            t.event("SignalIgnored", f"event {request.event!r} for {request.run}: {state.message}")
        t.new.signals = {**t.new.signals, key: state}
