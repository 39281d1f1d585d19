"""A DurableRun as a Kueue workload: the Workload the operator creates for it, and what Kueue answered.

Kueue's ``jobframework`` does this for each of its own integrations (Job, JobSet...); a DurableRun is an
external framework (``integrations.externalFrameworks`` in Kueue's configuration), so its controller, this
operator, creates and reads its Workloads. Pure: manifests and views, no API calls (those are ``kube``'s).

One Workload per queued attempt, named as Kueue names a job's: it is created when the run needs a pod and
deleted as soon as the attempt ends (a wait, a backoff, a preemption, the end of the run), which releases its
quota at once; the next attempt queues a new one.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from typing import Any

from durablerun import api
from durablerun_operator import builders
from durablerun_operator.config import Settings

GROUP = "kueue.x-k8s.io"
VERSION = "v1beta2"
WORKLOADS = "workloads"
RESOURCE_FLAVORS = "resourceflavors"
WORKLOAD_PRIORITY_CLASSES = "workloadpriorityclasses"
POD_SET = "main"
#: A Workload's priority without a WorkloadPriorityClass (Kueue's constants.DefaultPriority).
DEFAULT_PRIORITY = 0
# Kueue's jobframework (workload_names.go): <kind>-<name> cut to 253 - 1 - 5 characters, then 5 hex chars.
_MAX_NAME, _HASH = 253, 5


def queue_name(run: dict[str, Any]) -> str | None:
    """The LocalQueue a run asks for (Kueue's own label), or None: it is not admitted through Kueue."""
    value = (run["metadata"].get("labels") or {}).get(api.LABEL_QUEUE_NAME)
    return str(value) if value else None


def workload_name(run_name: str, uid: str) -> str:
    """Kueue's GetWorkloadNameForOwnerWithGVK, so ``kubectl get workloads`` reads as for a Job."""
    digest = hashlib.sha1("\n".join((api.KIND, api.GROUP, run_name, uid)).encode()).hexdigest()
    prefix = f"{api.KIND.lower()}-{run_name}"[: _MAX_NAME - 1 - _HASH]
    return f"{prefix}-{digest[:_HASH]}"


def workload(run: dict[str, Any], settings: Settings, priority: tuple[str, int] | None = None) -> dict[str, Any]:
    """The run's Workload: one pod set, the runner pod its next attempt would create, owned by the run.

    ``priority``: (WorkloadPriorityClass, its value), when the run names one; Kueue's jobframework resolves
    the class to its value on creation as well. Without one the priority is still set, to Kueue's default, as
    the jobframework sets it on every Workload: parts of Kueue read it unchecked (in v0.17 its visibility API's
    pending workloads fail on a Workload without it: kubernetes-sigs/kueue#14399, fixed upstream since).
    """
    meta = run["metadata"]
    pod = builders.runner_pod(run, 0, settings)
    spec: dict[str, Any] = {
        "queueName": queue_name(run),
        "podSets": [{"name": POD_SET, "count": 1,
                     "template": {"metadata": {"labels": pod["metadata"]["labels"]}, "spec": pod["spec"]}}],
    }
    if priority is not None:
        spec["priorityClassRef"] = {"group": GROUP, "kind": "WorkloadPriorityClass", "name": priority[0]}
    spec["priority"] = priority[1] if priority is not None else DEFAULT_PRIORITY
    return {
        "apiVersion": f"{GROUP}/{VERSION}",
        "kind": "Workload",
        "metadata": {"name": workload_name(meta["name"], meta["uid"]), "namespace": meta["namespace"],
                     "labels": {api.LABEL_RUN: meta["name"], api.LABEL_MANAGED_BY: api.APP_NAME},
                     "ownerReferences": [builders.owner_reference(run)]},
        "spec": spec,
    }


@dataclass(frozen=True)
class Placement:
    """Where an admitted attempt's pod goes: the assigned flavors' node labels and tolerations."""

    node_selector: dict[str, str]
    tolerations: tuple[dict[str, Any], ...] = ()


def placement(flavors: list[dict[str, Any]]) -> Placement:
    """The node labels and tolerations of the ResourceFlavors an admission assigned (Kueue's podset.FromAssignment)."""
    selector: dict[str, str] = {}
    tolerations: list[dict[str, Any]] = []
    for flavor in flavors:
        spec = flavor.get("spec") or {}
        selector.update(spec.get("nodeLabels") or {})
        tolerations.extend(t for t in spec.get("tolerations") or [] if t not in tolerations)
    return Placement(selector, tuple(tolerations))


def place(pod: dict[str, Any], where: Placement) -> dict[str, Any]:
    """``pod`` with the admission's placement added to what its template asked for."""
    spec = pod["spec"]
    if where.node_selector:
        spec["nodeSelector"] = {**(spec.get("nodeSelector") or {}), **where.node_selector}
    if where.tolerations:
        spec["tolerations"] = [*(spec.get("tolerations") or []), *where.tolerations]
    return pod


@dataclass(frozen=True)
class WorkloadView:
    """What Kueue said about a run's Workload."""

    name: str
    uid: str
    deleting: bool
    #: Admitted=True: quota reserved and every admission check passed; the attempt may start.
    admitted: bool
    #: Evicted=True (preempted, its queue stopped, deactivated...): "<reason>: <message>"; the attempt must stop.
    evicted: str | None
    #: Finished=True: it holds no quota any more (a leftover of an earlier attempt).
    finished: bool
    #: Why it is not admitted yet, from QuotaReserved=False ("" until Kueue has looked at it).
    pending: str
    #: Kueue says it cannot be admitted as it stands (its LocalQueue or ClusterQueue does not exist...).
    inadmissible: bool
    #: The ResourceFlavors the admission assigned to the runner's resources.
    flavors: tuple[str, ...]

    @classmethod
    def from_workload(cls, body: dict[str, Any]) -> WorkloadView:
        meta, status = body["metadata"], body.get("status") or {}
        conditions = {c.get("type"): c for c in status.get("conditions") or []}

        def true(kind: str) -> dict[str, Any] | None:
            condition = conditions.get(kind)
            return condition if condition and condition.get("status") == "True" else None

        evicted = true("Evicted")
        reserved = conditions.get("QuotaReserved")
        pending, inadmissible = "", False
        if reserved is not None and reserved.get("status") == "False":
            pending = str(reserved.get("message") or reserved.get("reason") or "")
            inadmissible = reserved.get("reason") == "Inadmissible"
        assignments = (status.get("admission") or {}).get("podSetAssignments") or []
        flavors = sorted({str(f) for a in assignments for f in (a.get("flavors") or {}).values()})
        return cls(
            name=meta["name"], uid=meta.get("uid", ""), deleting=meta.get("deletionTimestamp") is not None,
            admitted=true("Admitted") is not None,
            evicted=f"{evicted.get('reason', '')}: {evicted.get('message', '')}" if evicted else None,
            finished=true("Finished") is not None, pending=pending, inadmissible=inadmissible,
            flavors=tuple(flavors),
        )

    @property
    def usable(self) -> bool:
        """Whether this Workload can still admit the next attempt: not evicted, finished or going away."""
        return not (self.evicted or self.finished or self.deleting)


def priority_class(run: dict[str, Any]) -> str | None:
    """The WorkloadPriorityClass a run asks for (Kueue's own label), or None."""
    value = (run["metadata"].get("labels") or {}).get(api.LABEL_PRIORITY_CLASS)
    return str(value) if value else None


@dataclass(frozen=True)
class Queueing:
    """A run admitted through Kueue, for decide: the LocalQueue it asked for and its Workload (None: none yet)."""

    queue: str
    workload: WorkloadView | None
    #: The WorkloadPriorityClass the run's label names, when it does not exist: no Workload can be built (Kueue
    #: resolves a Job's class when it builds its Workload, and waits the same way). Looked up only while the run
    #: has no Workload.
    missing_priority_class: str | None = None
