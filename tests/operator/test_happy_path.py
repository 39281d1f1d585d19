"""A DurableRun applied with kubectl runs to Succeeded through a runner pod."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import urllib.request

import pytest

from durablerun_testbed import procs
from tests.helpers.runs import Operator, RunEnv

pytestmark = pytest.mark.testbed


def test_run_succeeds_and_kubectl_shows_it(operator: Operator, runs: RunEnv) -> None:
    runs.apply(runs.manifest("happy", "optest_flows:steps", {"steps": 3, "sleep": 0.1, "usd": "0.01"}))
    runs.testbed.kubectl("wait", "dr/happy", "-n", runs.namespace, "--for=jsonpath={.status.phase}=Succeeded",
                         "--timeout=60s", timeout=90)
    run = runs.get("happy")
    status = run["status"]
    assert status["outcome"] == "Completed"
    assert status["progress"]["completedSteps"] == 3
    assert status["cost"]["usd"] == "0.03"
    assert status["restarts"] == 0
    assert [runs.executions(f"s{i}") for i in range(3)] == [1, 1, 1]
    # The result: small, so in status, and always where it lives in the store.
    result = status["result"]
    assert json.loads(result["inline"]) == {"results": ["S0", "S1", "S2"]}
    uid = run["metadata"]["uid"]
    assert result["ref"] == f"s3://{runs.bucket}/runs/{runs.namespace}/happy/{uid}/journal/000000000003.json"
    assert runs.testbed.s3
    shown = subprocess.run(
        [sys.executable, "-m", "durablerun", "inspect", "--kubernetes", f"{runs.namespace}/happy", "--result"],
        capture_output=True, text=True, timeout=60, check=False,
        env={**os.environ, "KUBECONFIG": str(runs.testbed.kubeconfig), "AWS_ACCESS_KEY_ID": runs.testbed.s3.access_key,
             "AWS_SECRET_ACCESS_KEY": runs.testbed.s3.secret_key})
    assert shown.returncode == 0, shown.stderr
    assert json.loads(shown.stdout) == json.loads(result["inline"])
    table = runs.testbed.kubectl("get", "dr", "-n", runs.namespace).stdout.splitlines()
    assert table[1].split()[:2] == ["happy", "Succeeded"]
    # The operator posts a transition's Events after its status: wait for the last one.
    reasons = procs.wait_for(lambda: "Succeeded" in (r := [e["reason"] for e in runs.events("happy")]) and r,
                             timeout=30, what="the Succeeded Event")
    assert "AttemptStarted" in reasons


def test_a_declared_total_shows_as_done_of_total_and_as_the_ratio_while_running(operator: Operator,
                                                                                runs: RunEnv) -> None:
    runs.apply(runs.manifest("counted", "optest_flows:steps", {"steps": 6, "sleep": 1.0, "declare_total": True}))

    def midway_row() -> list[str] | None:
        row = runs.testbed.kubectl("get", "dr", "counted", "-n", runs.namespace, "--no-headers").stdout.split()
        return row if any(re.fullmatch(r"[1-5]/6", cell) for cell in row) else None

    procs.wait_for(midway_row, timeout=60, what="the Progress column to show k/6 while the run runs")

    def ratio() -> float | None:
        text = urllib.request.urlopen(f"http://127.0.0.1:{operator.metrics_port}/metrics", timeout=5).read().decode()
        match = re.search(r'^durablerun_run_progress_ratio\{[^}]*name="counted"[^}]*\} (\S+)$', text, re.M)
        value = float(match[1]) if match else None
        return value if value is not None and 0 < value < 1 else None

    procs.wait_for(ratio, timeout=30, what="durablerun_run_progress_ratio between 0 and 1 while running")
    status = runs.wait_phase("counted", "Succeeded", timeout=60)["status"]
    assert status["progress"]["summary"] == "6/6"
    assert status["progress"]["fraction"] == "1"
