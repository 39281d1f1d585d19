"""`kubectl durablerun`, run by the real kubectl as a plugin (kubectl-durablerun on PATH) against the test bed."""

from __future__ import annotations

import argparse
import json
import os
import subprocess
from pathlib import Path

import pytest

from durablerun import api
from durablerun._private.records import layout
from durablerun._private.storage import logs
from durablerun._private.tools import kubeapi
from durablerun_testbed import procs
from tests.helpers.kubectl_plugin import Plugin
from tests.helpers.runs import Operator, RunEnv

pytestmark = pytest.mark.testbed
OPERATOR_PER_MODULE = True  # the tests asking for `operator` share one, each in its own namespace (conftest.py)


def test_kubectl_finds_the_plugin(plugin: Plugin) -> None:
    listed = plugin("plugin", "list")
    assert "kubectl-durablerun" in listed.stdout, listed.stdout + listed.stderr
    version = plugin("durablerun", "--version")
    assert version.returncode == 0, version.stderr
    assert version.stdout.startswith("kubectl-durablerun ")


def test_approve_wait_journal_logs_and_events_are_write_once(
    operator: Operator, runs: RunEnv, plugin: Plugin
) -> None:
    runs.apply(runs.manifest("review", "optest_flows:approval"))
    waiting = plugin.dr("wait", "review", "--for", "Waiting", "--timeout", "60s")
    assert waiting.returncode == 0, waiting.stderr
    assert "Waiting" in waiting.stdout

    approved = plugin.dr("approve", "review", "review", "--by", "dana", "--message", "ship it")
    assert approved.returncode == 0, approved.stderr
    done = plugin.dr("wait", "review", "--timeout", "60s")
    assert (done.returncode, done.stdout.split()[:2]) == (0, ["durablerun.durablerun.dev/review", "Succeeded:"]), (
        done.stdout + done.stderr)
    decision = json.loads(next(e for e in runs.ledger() if e.startswith("decision "))[len("decision "):])
    assert decision == {"approved": True, "by": "dana", "message": "ship it"}
    assert runs.get("review")["spec"]["events"]["review"] == decision

    # A sent event is never changed: the same payload is a no-op, another one is refused.
    again = plugin.dr("approve", "review", "review", "--by", "dana", "--message", "ship it")
    assert (again.returncode, "already sent" in again.stdout) == (0, True), again.stdout + again.stderr
    rejected = plugin.dr("reject", "review", "review")
    assert rejected.returncode == 1
    assert "already sent to review with another payload" in rejected.stderr

    # The journal, read from the run's store as `durablerun inspect` reads it.
    journal = plugin.dr("journal", "review", "--credentials-from-secret", "--json")
    assert journal.returncode == 0, journal.stderr
    body = json.loads(journal.stdout)
    assert body["completed"] is True
    assert [r["name"] for r in body["records"] if r["kind"] == "step"] == ["draft", "publish"]
    assert body["events"] == ["review"]
    table = plugin.dr("journal", "review", "--credentials-from-secret")
    assert "Completed" in table.stdout
    assert "publish" in table.stdout
    # Without credentials (none in this environment) the store refuses, and the message says what to set.
    refused = plugin.dr("journal", "review")
    assert refused.returncode != 0
    assert "credentials" in refused.stderr
    # The same journal over time (docs/metrics.md, "A run's timeline"): the wait between the two steps.
    timeline = plugin.dr("timeline", "review", "--credentials-from-secret", "-o", "json")
    assert timeline.returncode == 0, timeline.stderr
    drawn = [(e["kind"], e["name"]) for e in json.loads(timeline.stdout)["entries"] if e["kind"] in ("step", "wait")]
    assert drawn == [("step", "draft"), ("wait", "review"), ("step", "publish")]

    # Every attempt's pod, in order (the test bed's node serves no logs: each pod says so).
    logs = plugin.dr("logs", "review")
    assert logs.returncode == 0, logs.stderr
    headers = [line for line in logs.stdout.splitlines() if line.startswith("==> pod ")]
    assert headers, logs.stdout
    assert headers == [f"==> pod {p['metadata']['name']} (attempt {p['metadata']['labels'][api.LABEL_EPOCH]}, "
                       f"{p['status']['phase']}) <==" for p in sorted(
                           runs.pods("review"), key=lambda p: int(p["metadata"]["labels"][api.LABEL_EPOCH]))]


def test_stream_follows_a_runs_output_across_its_pods(
    operator: Operator, runs: RunEnv, plugin: Plugin, tmp_path: Path
) -> None:
    """`kubectl durablerun stream RUN -f` reads the run's store live: what the first pod wrote, then (after the
    wait ended that pod) what the second wrote, and ends by itself once the run has Succeeded."""
    runs.apply(runs.manifest("narrator", "optest_flows:narrator"))
    waiting = plugin.dr("wait", "narrator", "--for", "Waiting", "--timeout", "60s")
    assert waiting.returncode == 0, waiting.stdout + waiting.stderr
    out = tmp_path / "stream.jsonl"
    with out.open("w") as sink:
        follower = subprocess.Popen(
            ["kubectl", "durablerun", "-n", runs.namespace, "stream", "narrator", "-f", "--final",
             "--credentials-from-secret", "--json"], env=plugin.env, stdout=sink, stderr=subprocess.PIPE, text=True)
    try:
        def chunks() -> list[dict[str, object]]:
            return [json.loads(line) for line in out.read_text().splitlines()]

        procs.wait_for(lambda: "".join(str(c["text"]) for c in chunks()) == "before0 before1 before2 ",
                       timeout=60, what="the first pod's chunks, read live")
        assert follower.poll() is None  # the run waits: the follower goes on
        assert plugin.dr("event", "narrator", "go").returncode == 0
        assert follower.wait(timeout=120) == 0, follower.stderr.read() if follower.stderr else ""
        told = chunks()
        assert "".join(str(c["text"]) for c in told) == "before0 before1 before2 after0 after1 after2 "
        assert [c["offset"] for c in told] == list(range(len(told)))
        assert len({c["attempt"] for c in told}) == 2  # two pods, one stream
    finally:
        if follower.poll() is None:
            follower.kill()
            follower.wait()
    # The follower ends once the runner's outcome is in the store, which is before the operator sets the phase.
    runs.wait_phase("narrator", "Succeeded", timeout=60)


def test_the_journal_is_read_from_the_endpoint_the_credentials_secret_names(
    operator: Operator, runs: RunEnv, plugin: Plugin
) -> None:
    """The sandbox's way (docs/install.md): the endpoint of the S3-compatible server is in the credentials
    Secret (AWS_ENDPOINT_URL_S3), not in the spec. The plugin reads the store as the run's pods do."""
    s3 = runs.testbed.s3
    assert s3 is not None
    runs.testbed.kubectl("create", "secret", "generic", "s3-with-endpoint", "-n", runs.namespace,
                         f"--from-literal=AWS_ACCESS_KEY_ID={s3.access_key}",
                         f"--from-literal=AWS_SECRET_ACCESS_KEY={s3.secret_key}",
                         f"--from-literal=AWS_ENDPOINT_URL_S3={s3.endpoint_url}")
    manifest = runs.manifest("byendpoint", "optest_flows:steps", {"steps": 2, "sleep": 0})
    manifest["spec"]["checkpoint"] = {"uri": f"s3://{runs.bucket}/runs", "credentialsSecret": "s3-with-endpoint",
                                      "region": "us-east-1"}
    runs.apply(manifest)
    done = plugin.dr("wait", "byendpoint", "--timeout", "90s")
    assert done.returncode == 0, done.stdout + done.stderr
    journal = plugin.dr("journal", "byendpoint", "--credentials-from-secret", "--json")
    assert journal.returncode == 0, journal.stderr
    assert json.loads(journal.stdout)["completed"] is True
    assert [r["name"] for r in json.loads(journal.stdout)["records"] if r["kind"] == "step"] == ["s0", "s1"]


def test_a_sigkilled_attempts_logs_are_read_from_the_store_after_its_pod_is_gone(
    operator: Operator, runs: RunEnv, plugin: Plugin
) -> None:
    """Issue 43: a step prints a line and SIGKILLs its own runner; the operator deletes that pod and starts
    attempt 2. The pod's shipper had stored the line from outside the runner: --attempt 1 shows it."""
    marker = f"marker-{runs.namespace}"
    runs.apply(runs.manifest("shouter", "optest_flows:shouter", {"marker": marker}))
    done = runs.wait_phase("shouter", "Succeeded", "Failed", timeout=120)
    assert done["status"]["phase"] == "Succeeded", done["status"].get("message")
    assert done["status"]["restarts"] == 1
    last = int(done["status"]["attempt"])  # the second pod, epoch 2 (status.epoch moved on: the run is over)
    procs.wait_for(lambda: "1" not in [p["metadata"]["labels"][api.LABEL_EPOCH] for p in runs.pods("shouter")],
                   timeout=60, what="attempt 1's pod to be deleted")

    one = plugin.dr("logs", "shouter", "--attempt", "1", "--credentials-from-secret")
    assert one.returncode == 0, one.stdout + one.stderr
    assert one.stdout.startswith("==> attempt 1 of shouter, from its store (the pod is gone) <==\n"), one.stdout
    assert f"{marker}: the first attempt, about to die" in one.stdout
    assert "lease acquired" in one.stdout, "the runner's own log lines (stderr) are kept too"
    assert "the next attempt" not in one.stdout

    # The last attempt's logs (its pod may be kept, and the node serves no logs) are its own.
    kube = kubeapi.Kubectl(argparse.Namespace(namespace=runs.namespace, context=None,
                                              kubeconfig=str(runs.testbed.kubeconfig)))
    kube.binary = str(plugin.kubectl)
    store, ref = kubeapi.open_journal(kube, done, credentials_from_secret=True)
    try:
        assert logs.archived_attempts(store.backend, ref) == [1, last]
        stored = (logs.read_attempt(store.backend, ref, last) or b"").decode()
    finally:
        store.close()
    assert f"{marker}: the next attempt, done" in stored
    assert "about to die" not in stored

    # No pods any more: the plugin says which attempts the store keeps.
    runs.testbed.kubectl("delete", "pod", "-n", runs.namespace, "-l", f"{api.LABEL_RUN}=shouter", "--wait=true")
    listed = plugin.dr("logs", "shouter", "--credentials-from-secret")
    assert listed.returncode == 0, listed.stderr
    assert f"the store keeps the logs of attempts 1, {last} (--attempt N)" in listed.stderr, listed.stderr
    missing = plugin.dr("logs", "shouter", "--attempt", "9", "--credentials-from-secret")
    assert missing.returncode == 1
    assert f"no logs of attempt 9: the store keeps the logs of attempts 1, {last}" in missing.stderr


def test_a_runs_events_are_its_own_not_those_of_an_earlier_run_of_the_same_name(
    operator: Operator, runs: RunEnv, plugin: Plugin
) -> None:
    """The run page and the timeline show a run's Events: a deleted run of the same name had its own."""
    for first in (True, False):
        runs.apply(runs.manifest("again", "optest_flows:steps", {"steps": 1, "sleep": 0}))
        assert plugin.dr("wait", "again", "--timeout", "90s").returncode == 0
        current = runs.get("again")
        if first:
            runs.testbed.kubectl("delete", "dr", "again", "-n", runs.namespace, "--wait=true")
    kube = kubeapi.Kubectl(argparse.Namespace(namespace=runs.namespace, context=None,
                                              kubeconfig=str(runs.testbed.kubeconfig)))
    kube.binary = str(plugin.kubectl)
    # The operator posts a run's Events after its status write: wait for the second run's Succeeded.
    procs.wait_for(lambda: [e["reason"] for e in runs.events("again")].count("Succeeded") == 2, timeout=30,
                   what="both runs' Succeeded Events")
    events = kube.events(current)
    assert [e["reason"] for e in events].count("Succeeded") == 1, events
    assert {e["involvedObject"]["uid"] for e in events} == {current["metadata"]["uid"]}
    # Both runs' Events are there: the earlier run's are left out by its uid, not gone.
    assert [e["reason"] for e in runs.events("again")].count("Succeeded") == 2


def test_suspend_resume_abort_retry(operator: Operator, runs: RunEnv, plugin: Plugin) -> None:
    runs.apply(runs.manifest("long", "optest_flows:steps", {"steps": 40, "sleep": 0.2}))
    runs.wait_phase("long", "Running")
    assert plugin.dr("suspend", "long").returncode == 0
    suspended = plugin.dr("wait", "long", "--for", "Suspended", "--timeout", "60s")
    assert suspended.returncode == 0, suspended.stderr
    assert runs.get("long")["spec"]["suspend"] is True
    assert plugin.dr("resume", "long").returncode == 0
    assert runs.get("long")["spec"]["suspend"] is False
    runs.wait_phase("long", "Running", "Succeeded")

    aborted = plugin.dr("abort", "long", "--reason", "wrong input")
    assert aborted.returncode == 0, aborted.stderr
    ended = plugin.dr("wait", "long", "--timeout", "60s")
    status = runs.get("long")["status"]
    if status["phase"] == "Aborted":  # unless it finished first
        assert ended.returncode == api.Outcome.ABORTED.exit_code, ended.stdout + ended.stderr
        assert status["abortReason"] == "UserRequested"
        assert "wrong input" in status["message"]
    assert runs.get("long")["metadata"]["annotations"][api.ANNOTATION_ABORT] == "wrong input"

    # retry: lifts the user abort and sets a new annotation value each time (the operator acts once per value);
    # the aborted run resumes from its journal and finishes.
    assert plugin.dr("retry", "long").returncode == 0
    annotations = runs.get("long")["metadata"]["annotations"]
    assert api.ANNOTATION_ABORT not in annotations
    first = annotations[api.ANNOTATION_RETRY]
    assert plugin.dr("retry", "long").returncode == 0
    assert runs.get("long")["metadata"]["annotations"][api.ANNOTATION_RETRY] != first
    finished = plugin.dr("wait", "long", "--timeout", "90s")
    assert finished.returncode == 0, finished.stdout + finished.stderr
    assert runs.get("long")["status"]["phase"] == "Succeeded"

    timed_out = plugin.dr("wait", "long", "--for", "Pending", "--timeout", "2s")
    assert timed_out.returncode == 124
    assert "timed out after 2s" in timed_out.stderr


def test_rerun_and_fork_from_a_step(operator: Operator, runs: RunEnv, plugin: Plugin) -> None:
    """After a fix: rerun a finished run from a step, fork a new run from one; a ledger counts what ran."""
    runs.apply(runs.manifest("review", "optest_flows:approval"))
    assert plugin.dr("wait", "review", "--for", "Waiting", "--timeout", "180s").returncode == 0
    busy = plugin.dr("rerun", "review", "--from", "draft", "--credentials-from-secret")
    assert busy.returncode == 1
    assert "review is Waiting: rerun is for a finished run" in busy.stderr
    assert plugin.dr("approve", "review", "review").returncode == 0
    assert plugin.dr("wait", "review", "--timeout", "180s").returncode == 0

    rerun = plugin.dr("rerun", "review", "--from", "draft", "--credentials-from-secret")
    assert rerun.returncode == 0, rerun.stderr
    assert "dropped 5 journal records, kept 0" in rerun.stdout
    asked = runs.get("review")["metadata"]["annotations"][api.ANNOTATION_RETRY]
    procs.wait_for(lambda: (s := runs.get("review")["status"]).get("retry") == asked and s["phase"] == "Succeeded",
                   timeout=180, what="the rerun's attempt to succeed")
    assert (runs.executions("draft"), runs.executions("publish")) == (2, 2), runs.ledger()
    facts = [k for k in runs.store_objects() if f"/{layout.HISTORY_DIR}" in k and k.endswith("-rerun.json")]
    assert len(facts) == 1, facts

    fork = plugin.dr("fork", "review", "--from", "publish", "--to", "review-b", "--credentials-from-secret")
    assert fork.returncode == 0, fork.stderr
    assert plugin.dr("wait", "review-b", "--timeout", "180s").returncode == 0
    assert (runs.executions("draft"), runs.executions("publish")) == (2, 3), "the fork ran more than 'publish'"
    assert runs.get("review-b")["status"]["phase"] == "Succeeded"

    # Bad input: one line, nothing created or cut.
    taken = plugin.dr("fork", "review", "--from", "publish", "--to", "review-b", "--credentials-from-secret")
    assert taken.returncode == 1
    assert "a DurableRun by that name exists" in taken.stderr
    for command in (["rerun", "review"], ["fork", "review", "--to", "review-c"]):
        unknown = plugin.dr(*command, "--from", "nope", "--credentials-from-secret")
        assert unknown.returncode == api.Outcome.USAGE_ERROR.exit_code, unknown.stderr
        assert "has no step by that name" in unknown.stderr
        assert unknown.stderr.strip().count("\n") == 0, unknown.stderr
    assert runs.testbed.kubectl("get", "dr", "review-c", "-n", runs.namespace, "--ignore-not-found").stdout == ""
    assert runs.executions("publish") == 3


def test_tree_completion_and_errors(runs: RunEnv, plugin: Plugin) -> None:
    """No operator: suspended runs stay as applied."""
    runs.apply(runs.manifest("parent", "optest_flows:steps", suspend=True))
    for child, parent in (("child-a", "parent"), ("child-b", "parent"), ("grandchild", "child-a")):
        manifest = runs.manifest(child, "optest_flows:steps", suspend=True)
        manifest["metadata"]["labels"] = {api.LABEL_PARENT: parent}
        runs.apply(manifest)
    runs.patch_status("parent", {"cost": {"usd": "0.10"},
                                 "childrenTotal": {"runs": 2, "finished": 1, "summary": "1/2", "usd": "0.30"}})
    tree = plugin.dr("tree", "parent")
    assert tree.returncode == 0, tree.stderr
    assert tree.stdout.splitlines()[0] == "parent  -  $0.10 (children 1/2: $0.30)", tree.stdout
    names = [line.replace("├── ", "").replace("└── ", "").replace("│", "").split()[0]
             for line in tree.stdout.splitlines()]
    assert names == ["parent", "child-a", "grandchild", "child-b"], tree.stdout
    assert tree.stdout.splitlines()[2].startswith("│   └── grandchild"), tree.stdout

    # kubectl's own completion of a plugin runs kubectl_complete-durablerun.
    commands = plugin("__complete", "durablerun", "")
    assert {"approve", "suspend", "journal", "tree", "completion"} <= set(commands.stdout.split()), commands.stdout
    run_names = plugin("__complete", "durablerun", "-n", runs.namespace, "approve", "chi")
    assert [w for w in run_names.stdout.split() if not w.startswith(":")] == ["child-a", "child-b"]
    script = plugin.dr("completion", "bash")
    assert "complete -F _kubectl_durablerun kubectl-durablerun" in script.stdout

    missing = plugin.dr("suspend", "no-such-run")
    assert missing.returncode == 1
    assert "not found" in missing.stderr
    bad = plugin.dr("event", "parent", "go", "{not json")
    assert bad.returncode == 2
    assert "not JSON" in bad.stderr
    bad_timeout = plugin.dr("wait", "parent", "--timeout", "10 minutes")
    assert bad_timeout.returncode == 2
    assert "--timeout: invalid duration '10 minutes'" in bad_timeout.stderr
    typo = plugin.dr("aprove", "parent")
    assert typo.returncode == 2
    assert "invalid choice: 'aprove'" in typo.stderr


def test_the_plugin_passes_kubectls_context_flags(plugin: Plugin, tmp_path: Path) -> None:
    missing = tmp_path / "no-such-kubeconfig"
    result = plugin("durablerun", "--kubeconfig", str(missing), "suspend", "x")
    assert result.returncode == 1
    assert str(missing) in result.stderr
    assert os.environ.get("KUBECONFIG") != str(missing)


def test_a_run_at_its_soft_budget_waits_with_no_pod_until_budget_raises_it(
        operator: Operator, runs: RunEnv, plugin: Plugin) -> None:
    runs.apply(runs.manifest("asks", "optest_flows:steps", {"steps": 5, "sleep": 0.05, "usd": "0.10"},
                             policy={"costCeilingUSD": "10", "askAt": {"costUSD": "0.25"}}))
    run = runs.wait_phase("asks", "Waiting", timeout=60)
    status = run["status"]
    assert (status["waitingFor"]["budget"], status["cost"]["usd"]) == ("costUSD", "0.30")
    assert "policy.askAt.costUSD reached" in status["message"]
    assert f"kubectl durablerun budget asks -n {runs.namespace} --ask-at-usd <higher>" in status["message"]
    assert "$0.30 and 0 tokens spent" in status["message"]
    # The Event is posted after the status that says Waiting: wait for it.
    procs.wait_for(lambda: "BudgetReached" in [e["reason"] for e in runs.events("asks")], timeout=30,
                   what="the BudgetReached Event")
    procs.wait_for(lambda: all(p["status"].get("phase") in ("Succeeded", "Failed") for p in runs.pods("asks")),
                   timeout=30, what="no runner pod while the run waits on its budget")
    said = plugin.dr("status", "asks")
    assert "waiting for a person to raise policy.askAt.costUSD" in said.stdout, said.stdout + said.stderr
    assert [runs.executions(f"s{i}") for i in range(5)] == [1, 1, 1, 0, 0]

    wrong = plugin.dr("budget", "asks", "--ask-at-usd", "lots")
    assert wrong.returncode == 1
    assert "--ask-at-usd 'lots': give an amount in USD such as 5.00, or none to remove it" in wrong.stderr
    raised = plugin.dr("budget", "asks", "--ask-at-usd", "0.35")  # one step more, then it asks again
    assert raised.returncode == 0, raised.stderr
    procs.wait_for(lambda: runs.executions("s3") == 1, timeout=60, what="step s3 after the budget was raised")
    again = runs.wait_phase("asks", "Waiting", timeout=60)["status"]
    assert (again["waitingFor"]["budget"], again["cost"]["usd"]) == ("costUSD", "0.40")
    removed = plugin.dr("budget", "asks", "--ask-at-usd", "none")
    assert removed.returncode == 0, removed.stderr
    done = runs.wait_phase("asks", "Succeeded", timeout=60)["status"]
    assert [runs.executions(f"s{i}") for i in range(5)] == [1] * 5
    assert (done["cost"]["usd"], done.get("restarts", 0)) == ("0.50", 0)
