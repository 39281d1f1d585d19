"""The main job, `make demo`, as `make tour` tells it: its story on the real node with every part, through the code
the demo runs, and nothing left after.

`sandbox.demo` brings the sandbox up (control plane, MinIO, kubelet and containerd, the chart's operator
installed with helm; with the tour, Kueue and Jaeger), applies the example run, SIGKILLs its runner container,
waits until the run has resumed and waits for its review, approves it through its webhook URL, waits until it
succeeds; the tour then reads the run's trace and sends a queue of runs through Kueue; and it brings the
sandbox down. The
test checks what the story showed, as facts (phases, the steps' executions, Events, the status), not its
wording; then that the sandbox left no process (its own or its pods' containers), cgroup, mount or bridge.
"""

from __future__ import annotations

import ipaddress
from pathlib import Path

import pytest
import yaml

from durablerun_testbed import procs, realnode, sandbox
from tests.helpers.session import SESSION_ID, skip_real_node_if_asked

pytestmark = pytest.mark.testbed

STEPS = ["plan", *(f"research durable execution: question {i}" for i in range(6)), "publish"]  # as they log
STEP_NAMES = ["plan", *(f"research-{i}" for i in range(6)), "publish"]  # as they are journaled and traced


@pytest.mark.timeout(600)
def test_tour_story_on_the_real_node_and_nothing_outlives_it(testbed_root: Path) -> None:
    skip_real_node_if_asked()
    try:
        realnode.check_machine()
        realnode.image_archives()
    except realnode.RealNodeUnavailable as error:
        pytest.fail(str(error), pytrace=False)

    story = sandbox.demo(testbed_root / "sandbox", "real", bed_id=f"{SESSION_ID}-sandbox", tour=True)

    status = story.status
    assert status["phase"] == "Succeeded", status
    # One crash (the SIGKILL), counted as a restart; the review's wait ended the second attempt, the
    # approval started the third.
    assert (status["restarts"], status["attempt"]) == (1, 3), status
    assert status["pod"] != story.crashed_pod
    seen = iter(story.phases)
    assert all(phase in seen for phase in ("Running", "Waiting", "Succeeded")), story.phases  # in this order
    assert story.phases[-1] == "Succeeded", story.phases
    # Counted from the first two attempts' logs (before the approval): every step up to the review ran; those
    # the status showed journaled before the crash never again; only the one in flight twice.
    # The logs are followed, not read whole: a step can go uncounted, never counted twice.
    journaled = STEPS[:story.journaled_before_crash]
    assert len(journaled) >= 2, story.journaled_before_crash
    assert set(story.executions) <= set(STEPS[:-1]), story.executions
    assert set(journaled) <= set(story.executions), story.executions
    assert all(story.executions[step] == 1 for step in journaled), story.executions
    assert sum(story.executions.values()) <= len(STEPS[:-1]) + 1, story.executions
    # The kubelet reported the crash (exit 137), the operator restarted the run and it succeeded.
    reasons = [event["reason"] for event in story.events]
    restarts = [event["message"] for event in story.events if event["reason"] == "Restarting"]
    assert len(restarts) == 1, restarts
    assert "exit code 137" in restarts[0], restarts
    assert "Succeeded" in reasons, reasons
    # The review came over HTTP from this machine, through the chart's webhook ingress and the run's URL.
    assert story.reviewed_through == "webhook"
    assert any(e["reason"] == "EventReceived" and "capability URL" in e["message"] for e in story.events), reasons
    # Prometheus scraped the operator and evaluated every shipped alert (the aborted-run page among them).
    shipped = [r["alert"] for g in yaml.safe_load(sandbox.RULES.read_text())["groups"] for r in g["rules"]
               if "alert" in r]
    assert sorted(story.alerting_rules) == sorted(shipped)
    assert "DurableRunAborted" in shipped
    # Jaeger (the chart's tracing endpoint) holds one trace for the run: its three attempts, the steps the killed
    # attempt had journaled among them, and the operator's decisions.
    assert story.trace
    spans = [span["operationName"] for span in story.trace["spans"]]
    assert spans.count("attempt") == 3, spans
    assert all(f"step {step}" in spans for step in STEP_NAMES[:story.journaled_before_crash]), spans
    assert any(name.startswith("operator ") for name in spans), spans
    # Kueue admitted the queue's runs one at a time (room for one runner): the others waited Queued, no pod.
    assert story.queue
    assert story.queue.most_pods == 1, story.queue
    assert story.queue.seen_queued, story.queue
    assert set(story.queue.phases.values()) == {"Succeeded"}, story.queue

    # `sandbox down` checked this before it said nothing is running; check it again independently.
    state = story.state
    assert not Path(state.dir, "state.json").exists()
    assert procs.processes_with_marker(state.id) == []
    network = realnode.PodNetwork(ipaddress.IPv4Network(state.subnet), state.bridge)
    assert realnode.remains(Path(state.node_dir), network, state.id) == []
