"""What a platform engineer's first cluster does, on a real kubelet and containerd with the built images.

The process node proves the operator's logic quickly; these prove what only a
real node can: the images' layout and user, a read-only root, restricted Pod
Security on real containers, probes, `kubectl logs`, a real OOM kill from a
cgroup memory limit, evictions and drains, SIGKILL of a real container.
"""

from __future__ import annotations

import json
import re
from typing import Any

from durablerun import api
from durablerun_testbed import procs
from durablerun_testbed.testbed import TestBed
from tests.realnode.helpers import OPERATOR_NAMESPACE, START_TIMEOUT_SECONDS, RealRuns

# The runner reports progress with its renewals (every leaseDuration/3), so the status can lag the journal by
# that much: enough steps are left to run when the kill lands.
STEPS = 8
MOVED_STEPS = 12  # the same, for the run that is evicted and then drained


def test_chart_operator_is_ready_non_root_and_read_only(real_bed: TestBed, chart_operator: dict[str, Any]) -> None:
    # The operator pod now: test_kueue.py's helm upgrades (Kueue on, then off) replace the one first installed.
    pods = json.loads(real_bed.kubectl("get", "pods", "-n", OPERATOR_NAMESPACE, "-l", api.OPERATOR_SELECTOR,
                                       "-o", "json").stdout)["items"]
    name = next(p["metadata"]["name"] for p in pods if not p["metadata"].get("deletionTimestamp"))

    def kubectl(*args: str, check: bool = True) -> Any:
        return real_bed.kubectl("-n", OPERATOR_NAMESPACE, *args, check=check)

    # Ready means the kubelet ran the chart's readiness probe against the operator and it passed.
    kubectl("wait", f"pod/{name}", "--for=condition=Ready", "--timeout=60s")
    pod = json.loads(kubectl("get", "pod", name, "-o", "json").stdout)
    assert pod["spec"]["nodeName"] == "realnode"
    assert pod["status"]["containerStatuses"][0]["restartCount"] == 0
    # The image's user, enforced: runAsNonRoot lets the kubelet start it only as non-root.
    assert kubectl("exec", name, "--", "id", "-u").stdout.strip() == "65532"
    denied = kubectl("exec", name, "--", "touch", "/opt/durable-run/x", check=False)
    assert denied.returncode != 0
    assert "Read-only file system" in denied.stderr
    assert kubectl("exec", name, "--", "touch", "/tmp/ok").returncode == 0  # the chart's /tmp emptyDir
    # `kubectl logs` reaches the kubelet and reads the container's log.
    assert "durablerun operator started" in kubectl("logs", name).stdout


def test_run_succeeds_in_the_workflow_image(real_runs: RealRuns) -> None:
    real_runs.apply(real_runs.manifest("plain", "realnode_flows:steps", {"steps": 3, "sleep": 0.2}))
    status = real_runs.wait_phase("plain", "Succeeded", "Failed", "Aborted")
    assert status["phase"] == "Succeeded", status
    assert (status["attempt"], status["restarts"]) == (1, 0)
    assert real_runs.executions() == {"s0": 1, "s1": 1, "s2": 1}
    pod = status["pod"]
    assert real_runs.pod(pod)["spec"]["nodeName"] == "realnode"
    logs = real_runs.kubectl("logs", pod)
    assert "executing s2" in logs, logs
    described = real_runs.kubectl("describe", "dr", "plain")
    assert "AttemptStarted" in described, described
    assert "Succeeded" in described, described


def test_sigkill_of_the_runner_container_resumes_without_redoing_steps(real_bed: TestBed, real_runs: RealRuns) -> None:
    assert real_bed.real_node
    real_runs.apply(real_runs.manifest("killed", "realnode_flows:steps", {"steps": STEPS, "sleep": 1.5}))
    first = real_runs.wait_steps("killed", 2)
    journaled = first["progress"]["completedSteps"]
    real_bed.real_node.kill_container(real_runs.running_container_id(first["pod"]))
    status = real_runs.wait_phase("killed", "Succeeded", "Failed", "Aborted")
    assert status["phase"] == "Succeeded", status
    assert (status["restarts"], status["attempt"]) == (1, 2), status
    runs = real_runs.executions()
    assert all(runs[f"s{i}"] == 1 for i in range(journaled)), (journaled, runs)
    assert all(runs[f"s{i}"] >= 1 for i in range(STEPS)), runs
    assert sum(runs.values()) <= STEPS + 1, f"more than the step in flight ran twice: {runs}"
    # The kubelet reported the container's exit: 137, killed by SIGKILL.
    restarts = [e["message"] for e in real_runs.events("killed") if e["reason"] == "Restarting"]
    assert any("Crash" in m and "exit code 137" in m for m in restarts), restarts


def test_real_oom_kill_restarts_the_run_naming_the_limit(real_runs: RealRuns) -> None:
    limits = {"limits": {"memory": "160Mi"}, "requests": {"memory": "160Mi"}}
    real_runs.apply(real_runs.manifest("hungry", "realnode_flows:oom", {"mb": 400, "sleep": 0.2}, resources=limits))
    status = real_runs.wait_phase("hungry", "Succeeded", "Failed", "Aborted", timeout=180)
    assert status["phase"] == "Succeeded", status
    assert status["restarts"] == 1, status
    # The kubelet's word (reason OOMKilled, from the kernel's cgroup OOM kill), passed on naming the limit.
    messages = [e["message"] for e in real_runs.events("hungry") if e["reason"] == "Restarting"]
    assert any(m.startswith("OOMKilled") and "memory limit 160Mi" in m and "resources.limits.memory" in m
               for m in messages), messages
    runs = real_runs.executions()
    assert (runs["before"], runs["hungry"], runs["after"]) == (1, 2, 1), runs


def test_eviction_and_drain_are_disruptions_not_restarts(real_bed: TestBed, real_runs: RealRuns) -> None:
    real_runs.apply(real_runs.manifest("moved", "realnode_flows:steps", {"steps": MOVED_STEPS, "sleep": 1.0}))
    first = real_runs.wait_steps("moved", 1)
    real_runs.running_container_id(first["pod"])
    # The Eviction API, as a cluster autoscaler or `kubectl drain` calls it.
    eviction = {"apiVersion": "policy/v1", "kind": "Eviction",
                "metadata": {"name": first["pod"], "namespace": real_runs.namespace}}
    real_bed.kubectl("create", "--raw", f"/api/v1/namespaces/{real_runs.namespace}/pods/{first['pod']}/eviction",
                     "-f", "-", input=json.dumps(eviction))
    second = procs.wait_for(
        lambda: (s := real_runs.status("moved")).get("pod") not in (None, first["pod"])
        and s.get("phase") == "Running" and (s.get("progress") or {}).get("completedSteps", 0) >= 3 and s,
        timeout=120, interval=0.5, what="a second attempt after the eviction to journal more steps")
    real_runs.running_container_id(second["pod"])
    # A drain of the node for maintenance (only this run's pod: the operator stays), then the node comes back.
    # The runner pod's /tmp is an emptyDir, so the drain says --delete-emptydir-data, as drains usually do.
    drained = real_bed.kubectl("drain", "realnode", "--pod-selector", f"{api.LABEL_RUN}=moved",
                               "--ignore-daemonsets", "--delete-emptydir-data", "--timeout=60s", timeout=90,
                               check=False)
    assert drained.returncode == 0, drained.stderr
    real_bed.kubectl("uncordon", "realnode")
    status = real_runs.wait_phase("moved", "Succeeded", "Failed", "Aborted", timeout=180)
    assert status["phase"] == "Succeeded", status
    assert status["restarts"] == 0, status
    assert status["disruptions"] == 2, status
    runs = real_runs.executions()
    assert sum(runs.values()) <= MOVED_STEPS + 2, f"more than the steps in flight ran twice: {runs}"


def test_waiting_run_holds_no_pod_and_an_event_resumes_it(real_runs: RealRuns) -> None:
    real_runs.apply(real_runs.manifest("approve", "realnode_flows:approval"))
    real_runs.wait_phase("approve", "Waiting")
    procs.wait_for(lambda: all(p["status"].get("phase") in ("Succeeded", "Failed") or
                               p["metadata"].get("deletionTimestamp") for p in real_runs.pods("approve")) or None,
                   timeout=60, what="no runner container to run while the run waits")
    real_runs.kubectl("patch", "dr", "approve", "--type", "merge", "-p",
                      json.dumps({"spec": {"events": {"go": {"by": "dana"}}}}))
    status = real_runs.wait_phase("approve", "Succeeded", "Failed", "Aborted")
    assert status["phase"] == "Succeeded", status
    assert real_runs.executions() == {"draft": 1, "publish": 1}


def wide_column(table: str, name: str) -> str:
    """Column ``name`` of the one row kubectl printed: by the header's positions (an empty cell is blank)."""
    header, row = table.splitlines()[:2]
    starts = [m.start() for m in re.finditer(r"\S+(?: \S+)*", header)]
    start = header.index(name)
    end = next((s for s in starts if s > start), None)
    return row[start:end].strip()


def test_a_missing_image_shows_its_reason_then_fails_the_run_at_the_start_timeout_naming_the_image(
    real_runs: RealRuns,
) -> None:
    # containerd's own pull failure, from the kubelet: nothing in the operator is told what the image is.
    image = "localhost/durable-run/no-such-image:1"
    manifest = real_runs.manifest("typo", "realnode_flows:approval")
    manifest["spec"]["template"]["spec"]["containers"][0]["image"] = image
    real_runs.apply(manifest)
    pulling = procs.wait_for(
        lambda: (status := real_runs.status("typo")).get("reason") in ("ErrImagePull", "ImagePullBackOff") and status,
        timeout=60, interval=0.5, what="the pull failure as the run's reason")
    assert pulling["phase"] == "Running", pulling
    assert image in pulling["message"], pulling["message"]
    # What a user sees: kubectl get -o wide's REASON column, and the conditions' reason.
    assert wide_column(real_runs.kubectl("get", "dr", "typo", "-o", "wide"), "REASON") in (
        "ErrImagePull", "ImagePullBackOff")
    progressing = next(c for c in pulling["conditions"] if c["type"] == "Progressing")
    assert progressing["reason"] in ("ErrImagePull", "ImagePullBackOff"), progressing

    failed = real_runs.wait_phase("typo", "Failed", "Succeeded", "Aborted", timeout=START_TIMEOUT_SECONDS + 60)
    assert failed["phase"] == "Failed", failed
    assert failed["reason"] == "ImagePullFailed", failed
    assert failed["message"].startswith(f"ImagePullFailed: pod typo-a1 could not get its image {image} in "
                                        f"{START_TIMEOUT_SECONDS}s ("), failed["message"]
    started = api.parse_time(failed["startTime"])  # the run's: its one attempt started after it
    completed = api.parse_time(failed["completionTime"])
    assert started is not None
    assert completed is not None
    assert (completed - started).total_seconds() >= START_TIMEOUT_SECONDS, failed
    assert wide_column(real_runs.kubectl("get", "dr", "typo", "-o", "wide"), "REASON") == "ImagePullFailed"
    procs.wait_for(lambda: not real_runs.pods("typo") or None, timeout=60, what="the attempt's pod deleted")
    event = procs.wait_for(lambda: next((e for e in real_runs.events("typo") if e["reason"] == "Failed"), None),
                           timeout=30, what="the run's Failed Event")
    assert image in event["message"], event
