"""A running runner's own token can write its own DurableRun and nothing else.

tests/install/test_rbac.py proves the chart's ServiceAccounts and the shape of
the runner Roles with tokens from the TokenRequest API. This proves the
running system: the namespace's runner ServiceAccount, Role and RoleBinding the
operator created at run time, the runner-status admission policy, and the very
token the runner's pod has mounted (its projected ServiceAccount token, bound to
the pod), used while the runner works.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest
import yaml

from durablerun import api, resource
from durablerun_testbed import binaries, procs
from tests.helpers.pods import process_of
from tests.helpers.runs import Operator, RunEnv
from tests.helpers.torture_runs import Ledger, manifest, torture_input

pytestmark = pytest.mark.testbed


def test_the_runner_pods_token_reaches_its_own_run_only(operator: Operator, runs: RunEnv, tmp_path: Path) -> None:
    ns = runs.namespace
    runs.apply(manifest(runs, "theirs", "bad_flows:approval", input=torture_input("theirs", pace=0.05)))
    runs.apply(manifest(runs, "mine", "bad_flows:approval", input=torture_input("mine", slow=60)))
    procs.wait_for(lambda: Ledger.read(runs, "mine").starts("s2"), timeout=90, what="mine's long step")
    runs.wait_phase("theirs", "Waiting", timeout=60)
    pod = runs.get("mine")["status"]["pod"]
    entry = process_of(runs.testbed, ns, pod)
    assert entry
    assert entry["running"]
    tokens = list(Path(entry["log"]).parent.glob("volumes/kube-api-access-*/token"))
    assert len(tokens) == 1, tokens
    assert runs.testbed.controlplane
    user = f"system:serviceaccount:{ns}:{api.RUNNER_ACCOUNT}"
    config = tmp_path / "runner.kubeconfig"
    config.write_text(yaml.safe_dump(runs.testbed.controlplane.kubeconfig_dict(user, tokens[0].read_text())))

    def as_runner(*args: str, input: str | None = None) -> subprocess.CompletedProcess[str]:
        return subprocess.run([str(binaries.kubectl()), "--kubeconfig", str(config), *args, "-n", ns],
                              input=input, capture_output=True, text=True, timeout=60)

    # What the runner does: read its run, and patch its status (a JSON patch with only a test op changes nothing).
    assert as_runner("auth", "whoami", "-o", "jsonpath={.status.userInfo.username}").stdout == user
    assert as_runner("get", "dr", "mine", "-o", "name").returncode == 0
    noop = json.dumps([{"op": "test", "path": "/metadata/name", "value": "mine"}])
    allowed = as_runner("patch", "dr", "mine", "--subresource=status", "--type=json", "-p", noop)
    assert allowed.returncode == 0, allowed.stderr
    # It may read the namespace's runs (the namespace's runner Role: docs/security.md), but write no other run's
    # status: the runner-status admission policy refuses it, as not that run's current attempt.
    assert as_runner("get", "dr", "theirs", "-o", "name").returncode == 0
    theirs = as_runner("patch", "dr", "theirs", "--subresource=status", "--type=json",
                       "-p", noop.replace("mine", "theirs"))
    assert theirs.returncode != 0, "the runner wrote another run's status"
    assert resource.CURRENT_ATTEMPT_ONLY in theirs.stderr, theirs.stderr
    # And nothing else.
    refused = {
        "list runs": ["get", "dr"],
        "change its own spec": ["patch", "dr", "mine", "--type=merge", "-p", '{"spec": {"suspend": true}}'],
        "delete its own run": ["delete", "dr", "mine", "--wait=false"],
        "read Secrets": ["get", "secret", "s3-credentials"],
        "list pods": ["get", "pods"],
        "delete its pod": ["delete", "pod", pod, "--wait=false"],
        "read Events": ["get", "events"],
    }
    for what, args in refused.items():
        result = as_runner(*args)
        assert result.returncode != 0, f"the runner's token may {what}"
        assert "forbidden" in result.stderr.lower(), (what, result.stderr)
    assert runs.get("theirs")["status"]["phase"] == "Waiting"
    assert runs.get("mine")["spec"]["suspend"] is False

    # Once the operator moves the run on (status.pod names the next attempt's pod), this pod may no longer write
    # the status at all, even without the epoch guard the runner puts in its own writes: the runner-status
    # admission policy refuses it (422, as a failed guard), wherever the workflow's code would try it.
    runs.patch_status("mine", {"pod": "mine-a99"})
    renewal = json.dumps([{"op": "add", "path": "/status/lease/renewTime", "value": api.format_time(api.now())}])
    zombie = as_runner("patch", "dr", "mine", "--subresource=status", "--type=json", "-p", renewal)
    assert zombie.returncode != 0, "a pod that is no longer the run's attempt wrote its status"
    assert resource.CURRENT_ATTEMPT_ONLY in zombie.stderr, zombie.stderr
