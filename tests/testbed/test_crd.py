"""The DurableRun CRD on a real API server: validation, defaults, printer columns, explain."""

from __future__ import annotations

import json
import subprocess
from typing import Any

import pytest

from durablerun import api
from durablerun_testbed.testbed import TestBed

pytestmark = pytest.mark.testbed


def manifest(name: str, **spec: Any) -> str:
    body: dict[str, Any] = {
        "workflow": "examples.hello:main",
        "checkpoint": {"uri": "s3://runs/durable"},
    }
    body.update(spec)
    return json.dumps({
        "apiVersion": api.API_VERSION, "kind": "DurableRun",
        "metadata": {"name": name}, "spec": {k: v for k, v in body.items() if v is not None},
    })


def test_minimal_run_is_accepted_with_defaults(testbed: TestBed, namespace: str) -> None:
    testbed.kubectl("apply", "-n", namespace, "-f", "-", input=manifest("minimal"))
    stored = json.loads(testbed.kubectl("get", "dr", "minimal", "-n", namespace, "-o", "json").stdout)
    policy = stored["spec"]["policy"]
    assert policy["maxRestarts"] == 3
    assert policy["maxDisruptions"] == 20
    assert policy["maxDuration"] == "8h"
    assert policy["progressTimeout"] == "10m"
    assert policy["leaseDuration"] == "3m"
    assert policy["backoff"] == {"initial": "10s", "max": "5m"}
    assert stored["spec"]["checkpoint"]["snapshotEvery"] == 100
    assert stored["spec"]["checkpoint"]["retention"] == "Retain"
    assert stored["spec"]["suspend"] is False


@pytest.mark.parametrize(
    ("spec", "field", "hint"),
    [
        ({"workflow": None}, "spec.workflow", "Required value"),
        ({"workflow": "not a function"}, "spec.workflow", "should match"),
        ({"policy": {"maxRestarts": -1}}, "spec.policy.maxRestarts", "greater than or equal to 0"),
        ({"checkpoint": {"uri": "gs://bucket/x"}}, "spec.checkpoint.uri",
         "must be s3://<bucket>[/prefix] or file:///<absolute path>"),
        ({"checkpoint": {"uri": "s3://runs"}, "policy": {"maxDuration": "forever"}},
         "spec.policy.maxDuration", "should match"),
        ({"policy": {"costCeilingUSD": 5}}, "spec.policy.costCeilingUSD", "must be of type string"),
        ({"policy": {"maxRetries": "three"}}, "spec.policy.maxRetries", "must be of type integer"),
        ({"checkpoint": {"uri": "s3://runs", "retention": "Forever"}}, "spec.checkpoint.retention",
         'supported values: "Retain", "Delete"'),
        ({"policy": {"maxRestarts": 3, "maxRestartz": 4}}, "spec.policy.maxRestartz", "unknown field"),
    ],
    ids=["missing-workflow", "bad-workflow", "negative-maxRestarts", "bad-uri-scheme",
         "bad-duration", "cost-not-string", "retries-not-int", "bad-retention", "unknown-field"],
)
def test_invalid_run_is_refused_naming_the_field(
    testbed: TestBed, namespace: str, spec: dict[str, Any], field: str, hint: str
) -> None:
    result = testbed.kubectl("apply", "-n", namespace, "-f", "-", input=manifest("bad", **spec), check=False)
    assert result.returncode != 0, "the API server accepted an invalid DurableRun"
    assert field in result.stderr, result.stderr
    assert hint in result.stderr, result.stderr
    assert testbed.kubectl("get", "dr", "-n", namespace, "-o", "name").stdout == ""


def test_printer_columns(testbed: TestBed, namespace: str) -> None:
    testbed.kubectl("apply", "-n", namespace, "-f", "-", input=manifest("columns"))
    testbed.kubectl("label", "dr", "columns", "-n", namespace, f"{api.LABEL_QUEUE_NAME}=team-a")
    status = {"status": {"phase": "Running", "restarts": 2, "abortReason": "ProgressTimeout",
                         "reason": "ProgressTimeout",
                         "progress": {"stepName": "plan", "summary": "3/12", "completedSteps": 3},
                         "cost": {"usd": "1.50", "tokens": 10}, "pod": "columns-a3",
                         "childrenTotal": {"runs": 5, "finished": 3, "summary": "3/5", "usd": "0.40"},
                         "traceID": "0af7651916cd43dd8448eb211c80319c",
                         "pin": {"image": "localhost/wf@sha256:" + "a" * 64}}}
    testbed.kubectl("patch", "dr", "columns", "-n", namespace, "--subresource=status",
                    "--type=merge", "-p", json.dumps(status))
    table = testbed.kubectl("get", "dr", "-n", namespace).stdout.splitlines()
    assert table[0].split() == ["NAME", "PHASE", "STEP", "PROGRESS", "COST", "RESTARTS", "SUSPENDED", "AGE"]
    assert table[1].split()[:7] == ["columns", "Running", "plan", "3/12", "1.50", "2", "false"]
    wide = testbed.kubectl("get", "durableruns", "-n", namespace, "-o", "wide").stdout.splitlines()
    assert wide[0].split()[-11:] == ["REASON", "STEPS", "POD", "CHILDREN", "CHILD", "COST", "RUN", "ID", "TRACE",
                                     "QUEUE", "IMAGE"]
    # No run id: that cell is empty.
    assert wide[1].split()[-8:] == ["ProgressTimeout", "3", "columns-a3", "3/5", "0.40",
                                    "0af7651916cd43dd8448eb211c80319c", "team-a", "localhost/wf@sha256:" + "a" * 64]


def test_status_fields_survive_and_unknown_ones_are_pruned(testbed: TestBed, namespace: str) -> None:
    testbed.kubectl("apply", "-n", namespace, "-f", "-", input=manifest("status"))
    lease = {"holder": "status-a1", "epoch": 1, "renewTime": "2026-01-01T00:00:00Z", "durationSeconds": 60}
    status = {"status": {"epoch": 1, "lease": lease, "notAField": "x",
                         "waitingFor": {"event": "plan_review", "since": "2026-01-01T00:00:00Z"}}}
    testbed.kubectl("patch", "dr", "status", "-n", namespace, "--subresource=status",
                    "--type=merge", "-p", json.dumps(status))
    stored = json.loads(testbed.kubectl("get", "dr", "status", "-n", namespace, "-o", "json").stdout)
    assert stored["status"]["lease"] == lease
    assert stored["status"]["waitingFor"]["event"] == "plan_review"
    assert "notAField" not in stored["status"]


def test_kubectl_explain_teaches_every_field(testbed: TestBed) -> None:
    policy = testbed.kubectl("explain", "durablerun.spec.policy").stdout
    for field in ("maxDuration", "costCeilingUSD", "maxRestarts", "maxDisruptions",
                  "progressTimeout", "leaseDuration", "backoff"):
        assert field in policy
    assert "Infrastructure failures do not consume maxRestarts" in policy
    checkpoint = testbed.kubectl("explain", "durablerun.spec.checkpoint.uri").stdout
    assert "s3://bucket/prefix" in checkpoint


def test_short_name_and_status_subresource(testbed: TestBed, namespace: str) -> None:
    testbed.kubectl("apply", "-n", namespace, "-f", "-", input=manifest("sub"))
    # A status change through the main resource is ignored: status is a subresource.
    testbed.kubectl("patch", "dr", "sub", "-n", namespace, "--type=merge",
                    "-p", '{"status": {"phase": "Succeeded"}}')
    phase = testbed.kubectl("get", "dr", "sub", "-n", namespace, "-o", "jsonpath={.status.phase}").stdout
    assert phase == ""
    with pytest.raises(subprocess.CalledProcessError):
        testbed.kubectl("get", "dr", "does-not-exist", "-n", namespace)
