"""Faults on the real node: a runner frozen or cut off past its lease, the node's runtime and kubelet restarted,
the control plane restarted, the node lost until its pods are deleted.

What the process node simulates (tests/faults), done to real containers: the
cgroup freezer, a veth on the bed's bridge taken down, containerd and the
kubelet stopped and started again, kube-apiserver and etcd restarted under
many runs. Every run's step executions are counted
from the markers they leave in S3 and checked with the fault suite's ledger
check: each step ran, at most once per pod, and again only after a pod the
fault interrupted. ``FAULT_TRIALS`` sizes the runs under the restarts (CI: the
default 8; ``make faults``: 120, so 20 runs under the control plane's restart).
Each run under a fault is one trial of its kind in the fault suite's tally
(``tests.helpers.tally.trials``), printed with tests/faults' kinds.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable, Iterator
from datetime import datetime
from typing import Any

import pytest

from durablerun import api
from durablerun_testbed import podfaults, procs
from durablerun_testbed.standby import StandbyNode
from durablerun_testbed.testbed import TestBed
from tests.helpers.journal_checks import check_journal, check_kept, list_objects, read_journal, run_root
from tests.helpers.pods import PodRecorder
from tests.helpers.tally import Tally, trials
from tests.helpers.torture_runs import check_executions
from tests.realnode.helpers import RealRuns

TRIALS = int(os.environ.get("FAULT_TRIALS", "8"))
#: Runs under a restart of the control plane: 20 in the long version.
CONTROL_PLANE_RUNS = max(3, TRIALS // 6)
#: A lease short enough to expire within a test, long enough for a loaded machine's renewals (every 2 s).
FENCED_POLICY = {"leaseDuration": "6s", "maxRestarts": 5}
#: The kubelet's grace for a deleted pod: the fenced runner is woken (thawed, reconnected) within it, before
#: the kubelet's SIGKILL would end it without a word.
GRACE = 60


@pytest.fixture
def pods(real_runs: RealRuns) -> Iterator[PodRecorder]:
    recorder = PodRecorder(real_runs.bed, real_runs.namespace)
    yield recorder
    recorder.stop()


def node(bed: TestBed) -> Any:
    assert bed.real_node
    return bed.real_node


def when(stamp: str) -> float:
    return datetime.fromisoformat(stamp.replace("Z", "+00:00")).timestamp()


def check_fenced_and_silent(real_runs: RealRuns, pods: PodRecorder, name: str, pod: str, since: float,
                            listing: dict[str, str], status: dict[str, Any]) -> None:
    """The woken pod exits Fenced (5) and has written nothing since ``since``: no journal record it began
    later, no object changed, no status field a runner writes; the run then succeeds in a later pod."""
    ending = procs.wait_for(lambda: pods.ending(pod), timeout=GRACE + 30, what=f"pod {pod} to end")
    assert ending["exitCode"] == api.Outcome.FENCED.exit_code, ending
    assert json.loads(ending["message"])["outcome"] == api.Outcome.FENCED.value, ending
    now = real_runs.status(name)
    # The runner's own fields: the next attempt's pod writes them only once it has acquired its lease.
    if (now.get("lease") or {}).get("holder") in (None, pod):
        # Except the step in flight, which the operator clears when it starts the next attempt.
        in_flight = (status.get("progress") or {}).get("inFlight")
        assert (now.get("progress") or {}).get("inFlight") in (None, in_flight), f"{pod} reported a step after waking"
        def runners(fields: dict[str, Any], field: str) -> Any:
            value = fields.get(field)
            return {k: v for k, v in value.items() if k != "inFlight"} if isinstance(value, dict) else value

        for field in ("progress", "cost", "checkpoint"):
            assert runners(now, field) == runners(status, field), f"status.{field} changed after {pod} woke"
    assert (now.get("lease") or {}).get("holder") != pod or now["lease"] == status["lease"], now.get("lease")
    final = real_runs.wait_phase(name, "Succeeded", "Failed", "Aborted", timeout=180)
    assert final["phase"] == "Succeeded", final
    root = run_root("runs", real_runs.namespace, name, real_runs.get(name)["metadata"]["uid"])
    journal = read_journal(real_runs.s3(), real_runs.bucket, root)
    check_journal(journal)
    check_kept(listing, list_objects(real_runs.s3(), real_runs.bucket, root))
    # The first attempt's records are those before ``since``; a write under way then may land later (its
    # position still free: the next attempt starts only once this pod is gone), but nothing it began after.
    before = [r for r in journal.records.values() if r["at"] < since]
    writer = before[-1]["w"] if before else None
    late = [r["seq"] for r in journal.records.values() if r["w"] == writer and r["at"] >= since]
    assert not late, f"{pod} journaled {late} after it was fenced"
    check_executions(real_runs.ledger(name), [f"s{i}" for i in range(STEPS)], {pod})
    expired = [e["message"] for e in real_runs.events(name) if e["reason"] == "LeaseExpired"]
    restarts = [e["message"] for e in real_runs.events(name) if e["reason"] == "Restarting"]
    assert expired or any("Fenced" in m for m in restarts), (expired, restarts)


#: 10 s of steps: the status shows two journaled up to a renewal (2 s) late, and the fault must still find the
#: runner mid-run (a finished one exits 0, not Fenced).
STEPS = 20


def fenced_while(real_runs: RealRuns, pods: PodRecorder, name: str,
                 fault: Callable[[str], Callable[[], None]], *, frozen: bool) -> None:
    """Run ``name``; after two steps apply ``fault(container id)`` (it returns how to undo it); once the
    operator has fenced the attempt, or it ended, undo the fault and check the woken pod wrote nothing.

    A frozen runner begins nothing after the freeze. One cut off still runs: a write it begins while its
    lease is valid may land when the network is back (the known limit in docs/faults.md), so it must begin
    nothing after its lease lapsed (its last renewal, to the second, plus the lease)."""
    real_runs.apply(real_runs.manifest(name, "realnode_flows:steps", {"steps": STEPS, "sleep": 0.5},
                                       policy=FENCED_POLICY, grace=GRACE))
    first = real_runs.wait_steps(name, 2)
    pod, epoch = first["pod"], first["epoch"]
    undo = fault(real_runs.running_container_id(pod))
    since = time.time()
    try:
        # Its last renewal: nothing it sends from now on arrives (cut off), or it sends nothing (frozen).
        renewed = when(real_runs.status(name)["lease"]["renewTime"])
        procs.wait_for(lambda: real_runs.status(name).get("epoch", 0) > epoch or pods.ending(pod) or None,
                       timeout=60, interval=0.2, what=f"the operator to fence {pod}")
        root = run_root("runs", real_runs.namespace, name, real_runs.get(name)["metadata"]["uid"])
        listing = list_objects(real_runs.s3(), real_runs.bucket, root)
        status = real_runs.status(name)
    finally:
        undo()
    if not frozen:
        since = renewed + 1 + api.parse_duration(FENCED_POLICY["leaseDuration"]).total_seconds()
    check_fenced_and_silent(real_runs, pods, name, pod, since, listing, status)


#: The tally's rows: the real node's fault kinds.
FROZEN = "real node: runner frozen past its lease (cgroup freezer)"
CUT_OFF = "real node: runner cut off the network past its lease"
RESTARTED = "real node: {} restarted under running runs"
CONTROL_PLANE = "real node: etcd and kube-apiserver restarted under running runs"
NODE_LOST = "real node: node lost until its pods are deleted, then back"


# Long (three minutes): `make faults`. In `make test`: the process node's paused runner (tests/operator/test_lease.py,
# tests/faults/test_pause_fencing.py) and this file's runner cut off the network.
@pytest.mark.long
def test_frozen_runner_is_fenced_replaced_and_writes_nothing_once_thawed(real_bed: TestBed, real_runs: RealRuns,
                                                                         pods: PodRecorder, tally: Tally) -> None:
    def freeze(container: str) -> Callable[[], None]:
        state = podfaults.freeze(node(real_bed), container)
        return lambda: podfaults.thaw(state)

    with trials(tally, FROZEN, 1):
        fenced_while(real_runs, pods, "frozen", freeze, frozen=True)


def test_runner_cut_off_the_network_is_fenced_and_writes_nothing_once_back(real_bed: TestBed, real_runs: RealRuns,
                                                                           pods: PodRecorder, tally: Tally) -> None:
    def cut(container: str) -> Callable[[], None]:
        veth = podfaults.cut_off(node(real_bed), container)
        return lambda: podfaults.reconnect(veth)

    with trials(tally, CUT_OFF, 1):
        fenced_while(real_runs, pods, "cutoff", cut, frozen=False)


def start_runs(real_runs: RealRuns, prefix: str, count: int, steps: int, policy: dict[str, Any]) -> list[str]:
    """Start ``count`` runs and wait until each is under way: its pod holds the lease and has journaled a step
    and renewed since. On a loaded machine a runner slower to start than its lease may cost an attempt before
    that (it stops itself, as it must): no fault's doing, so the fault waits for runners that work."""
    names = [f"{prefix}{i}" for i in range(count)]
    for name in names:
        real_runs.apply(real_runs.manifest(name, "realnode_flows:steps",
                                           {"steps": steps, "sleep": 0.5, "marks": f"executions-{name}"},
                                           policy=policy))
    for name in names:
        try:
            procs.wait_for(lambda: under_way(real_runs.status(name)),  # noqa: B023 (called before the loop moves on)
                           timeout=240, interval=0.5, what=f"{name} to journal a step in a pod holding its lease")
        except procs.Timeout as error:  # say where it stands: the run's status and Events, the namespace's pods
            pods = real_runs.kubectl("get", "pods", "-o", "wide", check=False)
            raise procs.Timeout(f"{error}; status {real_runs.status(name)}; events {told(real_runs, name)}; "
                                f"pods:\n{pods}") from None
    return names


def under_way(status: dict[str, Any]) -> bool:
    """Running in a pod that holds the lease and whose renewal has shipped a step it journaled."""
    lease, progress = status.get("lease") or {}, status.get("progress") or {}
    return status.get("phase") == "Running" and lease.get("holder") == status.get("pod") and \
        (progress.get("lastProgressTime") or "") >= (lease.get("acquireTime") or "~")


def before_the_fault(real_runs: RealRuns, names: list[str]) -> dict[str, dict[str, Any]]:
    """Each run's status as the fault comes, the attempt it will meet; every run must still be running
    (else the fault tested nothing for it)."""
    statuses = {name: real_runs.status(name) for name in names}
    done = {name: status.get("phase") for name, status in statuses.items() if status.get("phase") != "Running"}
    assert not done, f"runs no longer running when the fault came: {done}"
    return statuses


def check_runs(real_runs: RealRuns, names: list[str], steps: int, failed: list[str],
               expect: Callable[[str, dict[str, Any]], None]) -> None:
    """Every run succeeded, every step ran, none twice in one pod or again after an uninterrupted pod, and
    ``expect(name, final status)`` holds: a line in ``failed`` for each run that broke one of them (a trial
    failed)."""
    for name in names:
        try:
            final = real_runs.wait_phase(name, "Succeeded", "Failed", "Aborted", timeout=300)
            # Said in words: pytest cuts a long repr short, and the Events say why an attempt ended.
            assert final["phase"] == "Succeeded", \
                f"{final['phase']}: {final.get('message')}; events {told(real_runs, name)}"
            ledger = real_runs.ledger(name, f"executions-{name}")
            ended = {f"{name}-a{epoch}" for epoch in range(1, final["epoch"])}  # attempts the fault ended
            check_executions(ledger, [f"s{i}" for i in range(steps)], ended)
            expect(name, final)
        except AssertionError as error:  # procs.Timeout too
            failed.append(f"{name}: {error}")


def told(real_runs: RealRuns, name: str) -> list[str]:
    """The run's Events, in words."""
    return [f"{e['reason']}: {e['message']}" for e in real_runs.events(name)]


#: Long enough (30 s of steps) that each of several runs is under way (a step shipped with its first renewal,
#: 10 s into a 30 s lease) before the first one ends.
STEPS_UNDER_RESTART = 60


#: CI restarts containerd and then the kubelet under one set of runs (the budget); the long version gives each
#: restart runs of its own.
RESTARTS = ["containerd", "kubelet"] if TRIALS >= 30 else ["containerd+kubelet"]


def same_attempt(real_runs: RealRuns, before: dict[str, dict[str, Any]]) -> Callable[[str, dict[str, Any]], None]:
    """The run finished in the attempt that held its lease when the fault came (``before``, each run's status
    then): it ended none, and none was counted (as a restart, a disruption or a LeaseExpired of that pod)."""
    def expect(name: str, final: dict[str, Any]) -> None:
        then = before[name]
        counts = {k: (then.get(k, 0), final.get(k, 0)) for k in ("attempt", "restarts", "disruptions")}
        assert all(a == b for a, b in counts.values()), f"(before, after): {counts}; events {told(real_runs, name)}"
        assert not [e for e in real_runs.events(name)
                    if e["reason"] == "LeaseExpired" and f"pod {then['pod']} " in e["message"]], told(real_runs, name)

    return expect


@pytest.mark.parametrize("parts", RESTARTS)
def test_restarting_the_runtime_or_the_kubelet_under_five_runs_loses_and_repeats_nothing(
        real_bed: TestBed, real_runs: RealRuns, tally: Tally, parts: str) -> None:
    real = node(real_bed)
    with trials(tally, RESTARTED.format(parts.replace("+", " and ")), 5) as failed:
        names = start_runs(real_runs, parts[:4], 5, STEPS_UNDER_RESTART, {"leaseDuration": "30s"})
        started = before_the_fault(real_runs, names)
        for n, part in enumerate(parts.split("+")):
            if n:
                before_the_fault(real_runs, names)  # the next fault meets running runs too
            if part == "containerd":
                real.restart_containerd()
            else:
                real.stop_kubelet()
                real.start_kubelet()
            procs.wait_for(lambda: real.ready(real_bed.kubectl), timeout=120, what=f"the node to be Ready after {part}")
        # The containers outlive their runtime's or kubelet's restart: each run finishes in the pod it ran in.
        check_runs(real_runs, names, STEPS_UNDER_RESTART, failed, same_attempt(real_runs, started))


def test_restarting_etcd_and_the_api_server_under_runs_fences_nobody(real_bed: TestBed, real_runs: RealRuns,
                                                                     tally: Tally) -> None:
    assert real_bed.controlplane
    steps = STEPS_UNDER_RESTART + 2 * CONTROL_PLANE_RUNS
    with trials(tally, CONTROL_PLANE, CONTROL_PLANE_RUNS) as failed:
        names = start_runs(real_runs, "cp", CONTROL_PLANE_RUNS, steps, {"leaseDuration": "30s"})
        started = before_the_fault(real_runs, names)
        real_bed.controlplane.restart_etcd()
        real_bed.controlplane.restart_apiserver()
        # Unreachable for less than the lease (30 s): no false fencing, every run finishes in the pod it ran in.
        check_runs(real_runs, names, steps, failed, same_attempt(real_runs, started))


#: The node lifecycle controller, quicker than its defaults (50 s of silence, then the pods' 300 s toleration):
#: a node silent for 20 s is NotReady, and the test's runner pods tolerate that for 2 s before they are deleted.
NODE_MONITOR = ("--node-monitor-grace-period=20s", "--node-monitor-period=2s")
#: Two and a half minutes of steps: the runs outlast their node's silence (20 s to NotReady, 2 s more to the deletions).
LOST_STEPS = 300
QUICK_EVICTION = [{"key": f"node.kubernetes.io/{taint}", "operator": "Exists", "effect": "NoExecute",
                   "tolerationSeconds": 2} for taint in ("unreachable", "not-ready")]


# Long (the node controller's grace, then the pods' deletion): `make faults`. In `make test`: the process node's
# lost node (tests/operator/test_crash_resume.py).
@pytest.mark.long
def test_node_lost_until_its_pods_are_deleted_then_back_resumes_the_runs_as_disruptions(
        real_bed: TestBed, real_runs: RealRuns, tally: Tally) -> None:
    count = max(1, TRIALS // 60)  # 1 run in CI, 2 in `make faults`
    with trials(tally, NODE_LOST, count) as failed:
        names = lose_the_node(real_bed, real_runs, count)
        # Back, the kubelet stops the deleted pods' containers; the next attempts run on the same node.
        disruptions = {reason.value for reason in api.RestartReason if reason.disruption}

        def one_disruption(name: str, final: dict[str, Any]) -> None:
            assert (final["disruptions"], final["attempt"], final["restarts"]) == (1, 2, 0), (name, final)
            messages = [e["message"] for e in real_runs.events(name) if e["reason"] == "Restarting"]
            assert [m.split(":")[0] in disruptions for m in messages] == [True], messages

        check_runs(real_runs, names, LOST_STEPS, failed, one_disruption)


def lose_the_node(real_bed: TestBed, real_runs: RealRuns, count: int) -> list[str]:
    """Start ``count`` runs, stop the kubelet until the node lifecycle controller has marked the node NotReady
    and deleted the runs' pods, then start it again: the runs, none finished while their node was silent."""
    real, controlplane = node(real_bed), real_bed.controlplane
    assert controlplane
    names = []
    for i in range(count):
        name = f"lost{i}"
        body = real_runs.manifest(name, "realnode_flows:steps", {"steps": LOST_STEPS, "sleep": 0.5,
                                                                 "marks": f"executions-{name}"})
        body["spec"]["template"]["spec"]["tolerations"] = QUICK_EVICTION
        real_runs.apply(body)
        names.append(name)
    firsts = [real_runs.wait_steps(name, 2, timeout=180)["pod"] for name in names]
    # A second node the test keeps Ready: with every node of the zone NotReady, the node lifecycle controller
    # would stop evicting (its full-disruption mode), and the pods would stay.
    with StandbyNode(real_bed.api_client(), f"standby-{real.name}") as standby:
        controlplane.restart_controller_manager(*NODE_MONITOR)
        try:
            real.stop_kubelet()
            try:
                ready = "jsonpath={.status.conditions[?(@.type=='Ready')].status}"
                procs.wait_for(lambda: real_bed.kubectl("get", "node", real.name, "-o", ready).stdout == "Unknown",
                               timeout=90, interval=1, what="the node lifecycle controller to mark the node NotReady")
                assert real_bed.kubectl("get", "node", standby.name, "-o", ready).stdout == "True", standby.failures
                # The taint manager deletes the pods that tolerate the taint no longer; their containers still
                # run on the node (its kubelet cannot stop them), as on a partitioned node.
                procs.wait_for(lambda: all(real_runs.pod(pod)["metadata"].get("deletionTimestamp") for pod in firsts),
                               timeout=60, interval=1, what=f"the node lifecycle controller to delete {firsts}")
                # Not finished while their node is silent (a run finishing then is seen to stop renewing: a
                # restart, not a disruption); the attempt may have ended already (Backoff) as the pod went.
                done = {name: phase for name in names
                        if (phase := real_runs.status(name).get("phase")) in ("Succeeded", "Failed", "Aborted")}
                assert not done, f"runs finished while their node was silent: {done}"
            finally:
                real.start_kubelet()
            procs.wait_for(lambda: real.ready(real_bed.kubectl), timeout=120, what="the node to be Ready again")
        finally:
            controlplane.restart_controller_manager()
    return names
