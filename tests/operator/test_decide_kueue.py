"""decide() for runs admitted through Kueue, and the kueue module's Workload and views (pure, no test bed).

tests/kueue/ proves the same against a real Kueue manager; these rows pin each transition exactly.
"""

from __future__ import annotations

import hashlib
from datetime import timedelta
from typing import Any

import pytest

from durablerun import api
from durablerun_operator import decide, kueue
from durablerun_operator.config import Settings
from tests.operator.run_bodies import POLICY, T0, apply, at, body, ended, runner_pod, running, waiting_report

QUEUE = "team-a"


def workload(*conditions: tuple[str, str, str], flavors: dict[str, str] | None = None,
             deleting: bool = False) -> kueue.WorkloadView:
    """A Workload as Kueue left it: (type, status, reason) conditions, and the flavors its admission assigned."""
    status: dict[str, Any] = {"conditions": [{"type": t, "status": s, "reason": r, "message": f"{r} message"}
                                             for t, s, r in conditions]}
    if flavors:
        status["admission"] = {"clusterQueue": "cq", "podSetAssignments": [{"name": "main", "flavors": flavors}]}
    meta: dict[str, Any] = {"name": "durablerun-run-abcde", "uid": "w1"}
    if deleting:
        meta["deletionTimestamp"] = "2026-11-22T12:00:00Z"
    return kueue.WorkloadView.from_workload({"metadata": meta, "status": status})


ADMITTED = workload(("QuotaReserved", "True", "QuotaReserved"), ("Admitted", "True", "Admitted"),
                    flavors={"cpu": "spot", "memory": "spot"})
PENDING = workload(("QuotaReserved", "False", "Pending"))
EVICTED = workload(("QuotaReserved", "True", "QuotaReserved"), ("Admitted", "True", "Admitted"),
                   ("Evicted", "True", "Preempted"), flavors={"cpu": "spot"})


def decided(run_body: dict[str, Any], pods: list[dict[str, Any]] | None = None, *,
            wl: kueue.WorkloadView | None = None, queued: bool = True) -> tuple[decide.Plan, dict[str, Any]]:
    now = T0 + timedelta(seconds=120)
    views = [decide.PodView.from_pod(p, now, 60.0) for p in pods or []]
    queueing = kueue.Queueing(QUEUE, wl) if queued else None
    plan = decide.decide(decide.RunView.from_body(run_body), views, now, queueing=queueing)
    return plan, apply(run_body, plan)


def reasons(plan: decide.Plan) -> list[str]:
    return [reason for _, reason, _ in plan.events]


def test_a_pending_run_without_a_workload_queues_one_and_starts_no_pod() -> None:
    plan, status = decided(body({"phase": "Pending"}))
    assert plan.create_workload
    assert plan.create_pod_epoch is None
    assert status["phase"] == "Queued"
    assert status["message"] == f"queued in LocalQueue {QUEUE}: waiting for Kueue to admit the attempt"
    assert reasons(plan) == ["Queued"]
    assert next(c for c in status["conditions"] if c["type"] == "Progressing")["status"] == "True"


def test_a_queued_runs_workload_made_again_is_guarded_like_a_transition() -> None:
    # Its Workload is gone (deleted by hand, or by another operator that has moved the run on since the read):
    # a new one is made only once the API server confirms the run is still Queued at that epoch.
    queued = body({"phase": "Queued", "message": f"queued in LocalQueue {QUEUE}: waiting for Kueue to admit the "
                   "attempt"})
    plan, _ = decided(queued)
    assert plan.create_workload
    assert plan.patch == [{"op": "test", "path": "/status/epoch", "value": queued["status"]["epoch"]},
                          {"op": "test", "path": "/status/phase", "value": "Queued"}]


def test_a_queued_run_shows_why_kueue_has_not_admitted_it_once_and_stays_quiet() -> None:
    plan, status = decided(body({"phase": "Queued"}), wl=PENDING)
    assert status["phase"] == "Queued"
    assert status["message"].endswith(": Pending message")
    assert not plan.create_workload
    assert plan.create_pod_epoch is None
    assert reasons(plan) == []
    again, _ = decided(body({"phase": "Queued", "message": status["message"]}), wl=PENDING)
    assert again.empty
    assert decide.quiet_until(decide.RunView.from_body(body({"phase": "Queued"}))) == decide.NEVER


def test_an_inadmissible_workload_says_so_in_a_warning() -> None:
    plan, status = decided(body({"phase": "Queued"}), wl=workload(("QuotaReserved", "False", "Inadmissible")))
    assert status["phase"] == "Queued"
    assert [(kind, reason) for kind, reason, _ in plan.events] == [("Warning", "Inadmissible")]


def test_an_admitted_workload_starts_the_attempt_on_its_flavors() -> None:
    plan, status = decided(body({"phase": "Queued"}), wl=ADMITTED)
    assert status["phase"] == "Running"
    assert plan.create_pod_epoch == 2
    assert plan.flavors == ("spot",)
    assert plan.delete_workload is None
    assert reasons(plan) == ["AttemptStarted"]


def stopping(pod: dict[str, Any]) -> dict[str, Any]:
    """``pod`` as the operator left it when it asked its runner to stop (deleted with a grace period)."""
    pod["metadata"]["deletionTimestamp"] = at(150)
    pod["metadata"]["annotations"] = {api.ANNOTATION_DELETED_BY_OPERATOR: at(100)}
    return pod


def lease_not_held() -> dict[str, Any]:
    return running(lease={"holder": "run-a1", "epoch": 1, "acquireTime": at(0), "renewTime": at(50)})


SUSPENDED = {"outcome": "Suspended", "message": "stopped at a step boundary"}
NO_GRACE = {"policy": {**POLICY, "stopGracePeriod": "0s"}}
# What the run's status and plan must be after an eviction (or its Workload's deletion) under a Running attempt.
#: (case, run status, run spec, pods, Workload) -> (phase, epoch, disruptions, pods deleted, Workload deleted,
#: Events, the stop grace the message names)
EVICTIONS = {
    # The runner holds its lease: asked to stop at its next step boundary (its pod deleted with its own grace,
    # which holds policy.stopGracePeriod), as a suspended run stops; not fenced yet (the step in flight may still
    # be journaled), its quota still held.
    "evicted: the steps in flight get the pod's grace less its margin": (
        running(), {}, [runner_pod()], EVICTED,
        ("Running", 2, 0, ["run-a2"], None, ["Preempted"], "20s")),
    "a longer grace of the pod's own gives them longer": (
        running(), {}, [{**runner_pod(), "spec": {"containers": [{"name": "runner"}],
                                                  "terminationGracePeriodSeconds": 90}}], EVICTED,
        ("Running", 2, 0, ["run-a2"], None, ["Preempted"], "80s")),
    "policy.stopGracePeriod says how long": (
        running(), {"policy": {**POLICY, "stopGracePeriod": "2m"}}, [runner_pod()], EVICTED,
        ("Running", 2, 0, ["run-a2"], None, ["Preempted"], "2m")),
    "its Workload deleted: the same": (
        running(), {}, [runner_pod()], None,
        ("Running", 2, 0, ["run-a2"], None, ["Preempted"], "20s")),
    "stopping within its grace: nothing to do": (
        running(), {}, [stopping(runner_pod())], EVICTED,
        ("Running", 2, 0, [], None, [], None)),
    # It ended: fenced, the quota given back, the run queued again; a disruption, never a restart.
    "stopped at a step boundary: a preemption": (
        running(), {}, [stopping(ended(4, report=SUSPENDED))], EVICTED,
        ("Pending", 3, 1, [], EVICTED.name, ["Restarting"], None)),
    "killed at the end of its grace: a preemption too": (
        running(), {}, [stopping(ended(137))], EVICTED,
        ("Pending", 3, 1, [], EVICTED.name, ["Restarting"], None)),
    "completed first: it ended by itself": (
        running(), {}, [stopping(ended(0, report={"outcome": "Completed", "message": "done"}))], EVICTED,
        ("Succeeded", 3, 0, [], EVICTED.name, ["Succeeded"], None)),
    # It cannot stop by itself: fenced and stopped at once.
    "stopGracePeriod 0s: at once": (
        running(), NO_GRACE, [runner_pod()], EVICTED,
        ("Pending", 3, 1, ["run-a2"], EVICTED.name, ["Preempted", "Restarting"], None)),
    "the lease not held yet: at once": (
        lease_not_held(), {}, [runner_pod()], EVICTED,
        ("Pending", 3, 1, ["run-a2"], EVICTED.name, ["Preempted", "Restarting"], None)),
}


@pytest.mark.parametrize("case", list(EVICTIONS))
def test_an_eviction_stops_the_attempt_as_a_suspended_run_stops_then_as_a_disruption(case: str) -> None:
    status, spec, pods, wl, expected = EVICTIONS[case]
    plan, after = decided(body(status, spec=spec), pods, wl=wl)
    phase, epoch, disruptions, deleted, released, events, stop_grace = expected
    assert (after["phase"], after["epoch"], after.get("disruptions", 0)) == (phase, epoch, disruptions)
    assert after.get("restarts", 0) == 0
    assert plan.delete_pods == deleted
    assert plan.delete_workload == released
    assert reasons(plan) == events
    if disruptions:
        assert plan.restart_reason == "Preempted"
    if stop_grace:
        assert f"finish within {stop_grace} (policy.stopGracePeriod)" in after["message"]


def test_an_admitted_running_attempt_is_left_alone() -> None:
    plan, _ = decided(body(running()), [runner_pod()], wl=ADMITTED)
    assert plan.empty


def test_an_attempt_that_ends_waiting_gives_its_quota_back() -> None:
    pod = ended(api.Outcome.WAITING.exit_code, report=waiting_report(event="approve"))
    plan, status = decided(body(running()), [pod], wl=ADMITTED)
    assert status["phase"] == "Waiting"
    assert plan.delete_workload == ADMITTED.name


def test_a_finished_run_holds_no_quota() -> None:
    plan, status = decided(body(running()), [ended(0, report={"outcome": "Completed", "message": "done"})],
                           wl=ADMITTED)
    assert status["phase"] == "Succeeded"
    assert plan.delete_workload == ADMITTED.name


def test_a_stale_workload_is_deleted_before_a_new_one_is_queued() -> None:
    plan, _status = decided(body({"phase": "Pending"}), wl=EVICTED)
    assert plan.delete_workload == EVICTED.name
    assert not plan.create_workload
    assert plan.create_pod_epoch is None
    going = workload(("Admitted", "True", "Admitted"), deleting=True)
    plan, _ = decided(body({"phase": "Queued"}), wl=going)
    assert not plan.create_workload
    assert plan.delete_workload is None
    assert plan.create_pod_epoch is None


def test_without_kueue_the_queue_label_changes_nothing() -> None:
    plan, status = decided(body({"phase": "Pending"}), queued=False)
    assert status["phase"] == "Running"
    assert plan.create_pod_epoch == 2
    assert not plan.create_workload


def test_the_workload_is_named_as_kueue_names_a_jobs_and_carries_the_runner_pod() -> None:
    run_body = body({"phase": "Pending"})
    run_body["metadata"]["labels"] = {api.LABEL_QUEUE_NAME: QUEUE}
    run_body["spec"]["template"] = {"spec": {"containers": [
        {"name": "runner", "resources": {"requests": {"cpu": "500m"}}}]}}
    manifest = kueue.workload(run_body, Settings(), ("high", 1000))
    digest = hashlib.sha1(b"DurableRun\ndurablerun.dev\nrun\nu1").hexdigest()[:5]
    assert manifest["metadata"]["name"] == f"durablerun-run-{digest}"
    assert manifest["metadata"]["ownerReferences"][0]["controller"] is True
    assert manifest["spec"]["queueName"] == QUEUE
    assert manifest["spec"]["priorityClassRef"]["name"] == "high"
    assert manifest["spec"]["priority"] == 1000
    (pod_set,) = manifest["spec"]["podSets"]
    assert (pod_set["name"], pod_set["count"]) == ("main", 1)
    assert pod_set["template"]["spec"]["containers"][0]["resources"]["requests"] == {"cpu": "500m"}
    assert len(kueue.workload_name("x" * 300, "u1")) == 253
    # Without a class, Kueue's default priority, as its jobframework sets it (its visibility API needs it).
    plain = kueue.workload(run_body, Settings())
    assert "priorityClassRef" not in plain["spec"]
    assert plain["spec"]["priority"] == 0


def test_placement_adds_the_flavors_node_labels_and_tolerations() -> None:
    toleration = {"key": "spot", "operator": "Exists", "effect": "NoSchedule"}
    where = kueue.placement([{"spec": {"nodeLabels": {"pool": "spot"}, "tolerations": [toleration]}},
                             {"spec": {"nodeLabels": {"zone": "a"}, "tolerations": [toleration]}}])
    pod = kueue.place({"spec": {"nodeSelector": {"disk": "ssd"}}}, where)
    assert pod["spec"]["nodeSelector"] == {"disk": "ssd", "pool": "spot", "zone": "a"}
    assert pod["spec"]["tolerations"] == [toleration]


def test_a_missing_priority_class_creates_no_workload_and_says_which_class_and_the_fix() -> None:
    run = body({"phase": "Pending"})
    now = T0 + timedelta(seconds=120)
    queueing = kueue.Queueing(QUEUE, None, missing_priority_class="urgent")
    plan = decide.decide(decide.RunView.from_body(run), [], now, queueing=queueing)
    status = apply(run, plan)
    assert not plan.create_workload
    assert plan.create_pod_epoch is None
    assert status["phase"] == "Queued"
    assert "WorkloadPriorityClass 'urgent'" in status["message"]
    assert [(kind, reason) for kind, reason, _ in plan.events] == [("Normal", "Queued"),
                                                                    ("Warning", "PriorityClassNotFound")]
    warning = plan.events[1][2]
    assert api.LABEL_PRIORITY_CLASS in warning
    assert "Create the WorkloadPriorityClass" in warning
    # Decided again while the class is still missing: nothing new, no second Warning.
    again = decide.decide(decide.RunView.from_body(body({"phase": "Queued", "message": status["message"]})), [], now,
                          queueing=queueing)
    assert again.empty
    # Once the class exists, the Workload is queued.
    created = decide.decide(decide.RunView.from_body(body({"phase": "Queued", "message": status["message"]})), [],
                            now, queueing=kueue.Queueing(QUEUE, None))
    assert created.create_workload
