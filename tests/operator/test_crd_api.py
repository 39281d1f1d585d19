"""The DurableRun API as Kubernetes tools expect it: standard conditions, kubectl wait, column descriptions."""

from __future__ import annotations

import json
from typing import Any

import pytest

from durablerun import api
from tests.helpers.runs import Operator, RunEnv

pytestmark = pytest.mark.testbed


def condition(type_: str, **fields: Any) -> dict[str, Any]:
    return {"type": type_, "status": "True", "reason": "Running", "message": "",
            "lastTransitionTime": "2026-01-01T00:00:00Z", "observedGeneration": 1, **fields}


def test_conditions_have_the_standard_schema(runs: RunEnv) -> None:
    """No operator: the API server alone holds writers of the status to metav1.Condition's shape."""
    runs.apply(runs.manifest("shape", "optest_flows:steps"))
    assert runs.patch_status("shape", {"conditions": [condition("Progressing")]}, check=False).returncode == 0
    for bad, complaint in (
        ([condition("Complete"), condition("Complete", status="False")], "Duplicate value"),
        ([condition("Complete", lastTransitionTime="yesterday")], "lastTransitionTime"),
        ([condition("Complete", reason="not camel case")], "reason"),
        ([{"type": "Complete", "status": "True"}], "Required value"),
    ):
        refused = runs.patch_status("shape", {"conditions": bad}, check=False)
        assert refused.returncode != 0, bad
        assert complaint in refused.stderr, refused.stderr
    explained = runs.testbed.kubectl("explain", "durablerun.status.conditions").stdout
    for field in ("lastTransitionTime", "observedGeneration", "reason", "kubectl wait"):
        assert field in explained, field


def test_kubectl_wait_for_complete_and_the_suspended_column(operator: Operator, runs: RunEnv) -> None:
    runs.apply(runs.manifest("waited", "optest_flows:steps", {"steps": 3, "sleep": 0.1}))
    runs.testbed.kubectl("wait", "--for=condition=Complete", "dr/waited", "-n", runs.namespace, "--timeout=60s")
    run = runs.get("waited")
    assert run["status"]["phase"] == "Succeeded"
    conditions = {c["type"]: c for c in run["status"]["conditions"]}
    assert conditions["Complete"]["observedGeneration"] == run["metadata"]["generation"]

    runs.testbed.kubectl("patch", "dr", "waited", "-n", runs.namespace, "--type=merge",
                         "-p", '{"spec": {"suspend": true}}')
    table = runs.testbed.kubectl("get", "dr", "waited", "-n", runs.namespace).stdout.splitlines()
    assert table[1].split()[table[0].split().index("SUSPENDED")] == "true"
    crd = json.loads(runs.testbed.kubectl("get", "crd", api.CRD_NAME, "-o", "json").stdout)
    columns = crd["spec"]["versions"][0]["additionalPrinterColumns"]
    assert all(column.get("description") for column in columns), columns
