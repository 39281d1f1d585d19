"""A pod the operator cannot create fails the run with an Event and a condition naming why, never a phantom Running."""

from __future__ import annotations

import json

import pytest
from kubernetes.client.rest import ApiException
from urllib3.exceptions import ProtocolError

from durablerun import api
from durablerun_operator.kube import Kube
from durablerun_testbed import procs
from tests.helpers.runs import Operator, RunEnv


def refusal(status: int, message: str) -> ApiException:
    error = ApiException(status=status, reason="Refused")
    error.body = json.dumps({"kind": "Status", "message": message})
    return error


@pytest.mark.parametrize(("error", "permanent"), [
    (refusal(422, 'Pod "r-a1" is invalid: spec.containers[0].name: Invalid value'), True),
    (refusal(400, "bad request"), True),
    (refusal(403, 'pods "r-a1" is forbidden: violates PodSecurity "restricted:latest"'), True),
    (refusal(403, 'pods "r-a1" is forbidden: exceeded quota: q, requested: pods=1'), False),
    (refusal(429, "too many requests"), False),
    (refusal(500, "etcd timeout"), False),
    (ProtocolError("connection reset"), False),
    (ConnectionRefusedError("refused"), False),
    (ValueError("Invalid value for `name`, must not be `None`"), True),  # the client building the request
    (TypeError("unhashable type: 'dict'"), True),
])
def test_what_a_failed_create_says_and_whether_it_may_pass(error: Exception, permanent: bool) -> None:
    message, is_permanent = Kube.create_error(error)
    assert is_permanent == permanent
    assert message
    if isinstance(error, ApiException):
        assert message == json.loads(error.body)["message"]


@pytest.mark.testbed
def test_a_template_the_api_server_refuses_fails_the_run_and_a_retry_after_the_fix_succeeds(
        operator: Operator, runs: RunEnv) -> None:
    # The CRD's schema accepts any container name; the API server's Pod validation does not.
    manifest = runs.manifest("refused", "optest_flows:steps", {"steps": 2, "sleep": 0.1})
    manifest["spec"]["template"]["spec"]["containers"][0]["name"] = "Runner_1"
    runs.apply(manifest)

    run = runs.wait_phase("refused", "Failed", "Succeeded", "Aborted", timeout=60)
    status = run["status"]
    assert status["phase"] == "Failed", status
    assert status["message"].startswith("FailedCreate: pod refused-a1 could not be created"), status["message"]
    assert "spec.containers[0].name" in status["message"], status["message"]
    failed = next(c for c in status["conditions"] if c["type"] == "Failed")
    assert failed["status"] == "True", failed
    assert "spec.containers[0].name" in failed["message"], failed
    assert runs.pods("refused") == []
    warnings = [e for e in runs.events("refused") if e["type"] == "Warning" and e["reason"] == "FailedCreate"]
    assert warnings, runs.events("refused")
    assert "spec.containers[0].name" in warnings[0]["message"], warnings

    # The fix, then a retry: the next attempt starts from the journal with the fixed template.
    runs.testbed.kubectl("patch", "dr", "refused", "-n", runs.namespace, "--type=json", "-p", json.dumps(
        [{"op": "replace", "path": "/spec/template/spec/containers/0/name", "value": api.RUNNER_CONTAINER}]))
    runs.testbed.kubectl("annotate", "dr", "refused", "-n", runs.namespace, f"{api.ANNOTATION_RETRY}=1")
    retried = procs.wait_for(
        lambda: (run := runs.get("refused"))["status"].get("retry") == "1"
        and run["status"]["phase"] in ("Succeeded", "Failed", "Aborted") and run,
        timeout=90, what="the retried run to finish")
    assert retried["status"]["phase"] == "Succeeded", retried["status"]
