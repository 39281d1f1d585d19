"""Invalid DurableRuns are refused by `kubectl apply`, and the refusal names the field to fix.

The CRD is generated from ``durablerun.api``; these cases pin that wrong
types, negative or zero durations, bad URIs, unknown fields and absurd limits
never reach the operator (docs/bad-input.md lists them with what the user sees).
"""

from __future__ import annotations

import copy
import json
import re
from pathlib import Path
from typing import Any

import pytest
import yaml

from durablerun import api, quotas
from durablerun_testbed.testbed import TestBed

pytestmark = pytest.mark.testbed

VALID: dict[str, Any] = {
    "apiVersion": api.API_VERSION, "kind": "DurableRun",
    "metadata": {"name": "bad", "namespace": "default"},
    "spec": {"workflow": "agents.research:run", "input": {"topic": "x"},
             "checkpoint": {"uri": "s3://runs/prefix", "endpoint": "http://minio:9000"}},
}


def with_(path: str, value: Any) -> dict[str, Any]:
    """VALID with ``path`` (dotted, under the manifest) set to ``value``; the value ``DELETE`` removes it."""
    body = copy.deepcopy(VALID)
    *parents, last = path.split(".")
    node = body
    for key in parents:
        node = node.setdefault(key, {})
    if value is DELETE:
        del node[last]
    else:
        node[last] = value
    return body


DELETE = object()

# (manifest, the field the error must name, a phrase of the reason)
CASES: dict[str, tuple[dict[str, Any], str, str]] = {
    "workflow-missing": (with_("spec.workflow", DELETE), "spec.workflow", "Required value"),
    "workflow-not-module-function": (with_("spec.workflow", "run my agent"), "spec.workflow", "should match"),
    "workflow-not-a-string": (with_("spec.workflow", 42), "spec.workflow", "must be of type string"),
    "checkpoint-missing": (with_("spec.checkpoint", DELETE), "spec.checkpoint", "Required value"),
    "uri-missing": (with_("spec.checkpoint.uri", DELETE), "spec.checkpoint.uri", "Required value"),
    "uri-http-scheme": (with_("spec.checkpoint.uri", "https://bucket.s3.amazonaws.com/x"), "spec.checkpoint.uri",
                        "must be s3://<bucket>[/prefix] or file:///<absolute path>"),
    "uri-bad-bucket": (with_("spec.checkpoint.uri", "s3://My_Bucket/x"), "spec.checkpoint.uri", "must be s3://"),
    "uri-relative-file": (with_("spec.checkpoint.uri", "file://runs"), "spec.checkpoint.uri", "must be s3://"),
    "endpoint-no-scheme": (with_("spec.checkpoint.endpoint", "minio:9000"), "spec.checkpoint.endpoint",
                           "should match"),
    "snapshot-every-zero": (with_("spec.checkpoint.snapshotEvery", 0), "spec.checkpoint.snapshotEvery",
                            "greater than or equal to 1"),
    "retention-unknown": (with_("spec.checkpoint.retention", "Forever"), "spec.checkpoint.retention",
                          "Unsupported value"),
    "sse-unknown": (with_("spec.checkpoint.serverSideEncryption", "rot13"), "spec.checkpoint.serverSideEncryption",
                    "Unsupported value"),
    "kms-key-without-kms": (with_("spec.checkpoint.kmsKeyId", "alias/runs"), "spec.checkpoint",
                            "kmsKeyId needs serverSideEncryption: aws:kms"),
    "run-id-bad-characters": (with_("spec.checkpoint.runId", "team/run 1"), "spec.checkpoint.runId",
                              "should match"),
    "run-id-too-long": (with_("spec.checkpoint.runId", "r" * 129), "spec.checkpoint.runId", "Too long"),
    "max-duration-negative": (with_("spec.policy.maxDuration", "-5m"), "spec.policy.maxDuration", "should match"),
    "max-duration-zero": (with_("spec.policy.maxDuration", "0s"), "spec.policy.maxDuration",
                          "must be longer than zero"),
    "lease-no-unit": (with_("spec.policy.leaseDuration", "60"), "spec.policy.leaseDuration", "should match"),
    "lease-zero": (with_("spec.policy.leaseDuration", "0s"), "spec.policy.leaseDuration",
                   "must be longer than zero"),
    "progress-timeout-words": (with_("spec.policy.progressTimeout", "ten minutes"), "spec.policy.progressTimeout",
                               "should match"),
    "backoff-initial-bad": (with_("spec.policy.backoff.initial", "soon"), "spec.policy.backoff.initial",
                            "should match"),
    "max-restarts-negative": (with_("spec.policy.maxRestarts", -1), "spec.policy.maxRestarts",
                              "greater than or equal to 0"),
    "max-restarts-absurd": (with_("spec.policy.maxRestarts", 1_000_000), "spec.policy.maxRestarts",
                            "less than or equal to 1000"),
    "max-disruptions-absurd": (with_("spec.policy.maxDisruptions", 10**9), "spec.policy.maxDisruptions",
                               "less than or equal to 10000"),
    "max-retries-string": (with_("spec.policy.maxRetries", "three"), "spec.policy.maxRetries",
                           "must be of type integer"),
    "quota-priority-absurd": (with_("spec.policy.quotaPriority", 5000), "spec.policy.quotaPriority",
                              "less than or equal to 1000"),
    "quota-priority-name": (with_("spec.policy.quotaPriority", "urgent"), "spec.policy.quotaPriority",
                            "must be of type integer"),
    "cost-ceiling-negative": (with_("spec.policy.costCeilingUSD", "-5"), "spec.policy.costCeilingUSD",
                              "should match"),
    "cost-ceiling-currency": (with_("spec.policy.costCeilingUSD", "$5"), "spec.policy.costCeilingUSD",
                              "should match"),
    "cost-ceiling-number": (with_("spec.policy.costCeilingUSD", 5), "spec.policy.costCeilingUSD",
                            "must be of type string"),
    "max-tokens-negative": (with_("spec.policy.maxTokens", -10), "spec.policy.maxTokens",
                            "greater than or equal to 0"),
    "max-steps-zero": (with_("spec.policy.maxSteps", 0), "spec.policy.maxSteps", "greater than or equal to 1"),
    "suspend-string": (with_("spec.suspend", "yes"), "spec.suspend", "must be of type boolean"),
    "input-a-list": (with_("spec.input", [1, 2]), "spec.input", "must be of type object"),
    "template-a-string": (with_("spec.template", "my-pod"), "spec.template", "must be of type object"),
    # spec.template is a PodTemplateSpec: a typo is refused, not turned into a pod that cannot start.
    "template-typo-containres": (with_("spec.template", {"spec": {"containres": [{"name": "runner"}]}}),
                                 "spec.template.spec.containres", "unknown field"),
    "template-typo-imagee": (with_("spec.template", {"spec": {"containers": [{"name": "runner", "imagee": "x"}]}}),
                             "spec.template.spec.containers[0].imagee", "unknown field"),
    "template-bad-quantity": (with_("spec.template", {"spec": {"containers": [
        {"name": "runner", "resources": {"limits": {"memory": "lots"}}}]}}),
        "spec.template.spec.containers[0].resources.limits.memory", "should match"),
    "template-grace-a-string": (with_("spec.template", {"spec": {"terminationGracePeriodSeconds": "ten"}}),
                                "spec.template.spec.terminationGracePeriodSeconds", "must be of type integer"),
    "template-container-unnamed": (with_("spec.template", {"spec": {"containers": [{"image": "x"}]}}),
                                   "spec.template.spec.containers[0].name", "Required value"),
    "template-metadata-name": (with_("spec.template", {"metadata": {"name": "mine"}}),
                               "spec.template.metadata.name", "unknown field"),
    "events-a-list": (with_("spec.events", ["go"]), "spec.events", "must be of type object"),
    # A run keeps every event it was sent: their number is bounded, so the object is (etcd refuses > 1.5 MiB).
    "events-too-many": (with_("spec.events", {f"e{i}": True for i in range(2001)}), "spec.events",
                        "must have at most 2000 items"),
    "ttl-negative": (with_("spec.ttlSecondsAfterFinished", -1), "spec.ttlSecondsAfterFinished",
                     "greater than or equal to 0"),
    # A run's own webhook source: only schemes the ingress checks, and a Secret to check them with.
    "webhook-scheme-unknown": (with_("spec.webhook", {"scheme": "slack", "secret": "hooks"}), "spec.webhook.scheme",
                               'supported values: "github", "stripe", "hmac"'),
    "webhook-secret-missing": (with_("spec.webhook", {"scheme": "github"}), "spec.webhook.secret", "Required value"),
    "webhook-secret-bad-name": (with_("spec.webhook", {"scheme": "hmac", "secret": "My Hooks"}),
                                "spec.webhook.secret", "should match"),
    "unknown-spec-field": (with_("spec.workflw", "agents.research:run"), "spec.workflw", "unknown field"),
    "unknown-policy-field": (with_("spec.policy.maxRestart", 3), "spec.policy.maxRestart", "unknown field"),
}


def apply(testbed: TestBed, body: dict[str, Any]) -> Any:
    """`kubectl apply` validated by the API server without storing anything (the operator never sees it)."""
    return testbed.kubectl("apply", "--dry-run=server", "-f", "-", input=json.dumps(body), check=False)


def test_the_valid_manifest_is_accepted(testbed: TestBed) -> None:
    """So each refusal below is caused by its one change."""
    accepted = apply(testbed, VALID)
    assert accepted.returncode == 0, accepted.stderr


def test_a_full_pod_template_is_accepted(testbed: TestBed) -> None:
    """What a Pod accepts, spelt the ways users write it (quantities as numbers, ports without a protocol)."""
    template = {"metadata": {"labels": {"team": "a"}, "annotations": {"note": "x"}}, "spec": {
        "serviceAccountName": "agent", "nodeSelector": {"pool": "agents"},
        "tolerations": [{"key": "agents", "operator": "Exists", "effect": "NoSchedule"}],
        "containers": [{"name": "runner", "image": "example/agent:1", "ports": [{"containerPort": 8080}],
                        "resources": {"requests": {"cpu": 1, "memory": "512Mi"}, "limits": {"cpu": "1500m"}},
                        "env": [{"name": "A", "valueFrom": {"secretKeyRef": {"name": "s", "key": "k"}}}],
                        "livenessProbe": {"httpGet": {"path": "/", "port": "http"}}}],
        "volumes": [{"name": "scratch", "emptyDir": {"sizeLimit": "1Gi"}}],
        "imagePullSecrets": [{"name": "registry"}]}}
    accepted = apply(testbed, with_("spec.template", template))
    assert accepted.returncode == 0, accepted.stderr


REPO = Path(__file__).resolve().parent.parent.parent


def shipped_runs() -> list[tuple[str, dict[str, Any]]]:
    """Every DurableRun users are shown: deploy/samples/ and the YAML blocks of README.md, docs/ and examples/."""
    found: list[tuple[str, dict[str, Any]]] = []
    for path in sorted((REPO / "deploy" / "samples").glob("*.yaml")):
        found += [(path.name, doc) for doc in yaml.safe_load_all(path.read_text()) if doc]
    for path in [REPO / "README.md", *sorted((REPO / "docs").glob("*.md")), *sorted((REPO / "examples").rglob("*.md"))]:
        for block in re.findall(r"```ya?ml\n(.*?)```", path.read_text(), re.S):
            found += [(path.name, doc) for doc in yaml.safe_load_all(block)
                      if isinstance(doc, dict) and doc.get("kind") == "DurableRun"]
    return found


def test_every_sample_and_documented_run_applies(testbed: TestBed, namespace: str) -> None:
    runs = shipped_runs()
    assert len(runs) >= 2, runs  # the sample and docs/install.md's
    for source, run in runs:
        run = copy.deepcopy(run)
        run["metadata"]["namespace"] = namespace
        accepted = apply(testbed, run)
        assert accepted.returncode == 0, f"{source}: {accepted.stderr}"


def test_kubectl_explains_the_pod_template(testbed: TestBed) -> None:
    explained = testbed.kubectl("explain", "durablerun.spec.template.spec.containers").stdout
    for field in ("image", "resources", "volumeMounts", "securityContext"):
        assert field in explained, explained
    explained = testbed.kubectl("explain", "durablerun.spec.template.spec.containers.resources.limits").stdout
    assert "Limits describes the maximum amount of compute resources allowed." in explained, explained


def test_at_least_twenty_cases() -> None:
    assert len(CASES) >= 20


def assert_refused(testbed: TestBed, case: str, body: dict[str, Any], field: str, reason: str) -> None:
    refused = apply(testbed, body)
    assert refused.returncode != 0, f"{case} was accepted"
    assert field in refused.stderr, refused.stderr
    assert reason in refused.stderr, refused.stderr


@pytest.mark.parametrize("case", sorted(CASES))
def test_invalid_manifest_is_refused_naming_the_field(testbed: TestBed, case: str) -> None:
    assert_refused(testbed, case, *CASES[case])


def test_a_refused_manifest_creates_nothing(testbed: TestBed, namespace: str) -> None:
    """Without --dry-run too: the API server refuses, nothing is stored, the operator never sees it."""
    body = copy.deepcopy(CASES["lease-zero"][0])
    body["metadata"]["namespace"] = namespace
    refused = testbed.kubectl("apply", "-f", "-", input=json.dumps(body), check=False)
    assert refused.returncode != 0
    assert "spec.policy.leaseDuration" in refused.stderr
    assert testbed.kubectl("get", "dr", "bad", "-n", namespace, check=False).returncode != 0


# --- updates the API server refuses -------------------------------------------------------------------


def patch(testbed: TestBed, namespace: str, spec: dict[str, Any]) -> Any:
    return testbed.kubectl("patch", "dr", "bad", "-n", namespace, "--type=merge",
                           "-p", json.dumps({"spec": spec}), check=False)


def stored(testbed: TestBed, namespace: str) -> dict[str, Any]:
    return dict(json.loads(testbed.kubectl("get", "dr", "bad", "-n", namespace, "-o", "json").stdout)["spec"])


@pytest.fixture
def created(testbed: TestBed, namespace: str) -> str:
    """VALID, stored in a namespace of its own (no operator: only the API server's rules are at work)."""
    body = copy.deepcopy(VALID)
    body["metadata"]["namespace"] = namespace
    testbed.kubectl("apply", "-f", "-", input=json.dumps(body))
    return namespace


@pytest.mark.parametrize("change", [
    {"input": {"topic": "y"}},           # a value changed
    {"input": {"extra": 1}},             # a key added (merge patch)
    {"input": None},                     # removed altogether
    {"input": {"topic": None, "subject": "x"}},  # a key renamed: as many keys, the same values
    {"input": {"topic": {"nested": "x"}}},
])
def test_spec_input_is_immutable(testbed: TestBed, created: str, change: dict[str, Any]) -> None:
    refused = patch(testbed, created, change)
    assert refused.returncode != 0, f"{change} was accepted"
    assert "spec.input is immutable" in refused.stderr, refused.stderr
    assert "create a new DurableRun" in refused.stderr
    assert stored(testbed, created)["input"] == {"topic": "x"}


def test_the_rest_of_the_spec_stays_editable(testbed: TestBed, created: str) -> None:
    assert patch(testbed, created, {"input": {"topic": "x"}, "policy": {"maxRestarts": 5}}).returncode == 0
    assert patch(testbed, created, {"suspend": True}).returncode == 0
    assert stored(testbed, created)["policy"]["maxRestarts"] == 5


@pytest.mark.parametrize("change", [{"runId": "adopted"}, {"runId": None}, {"runId": "other"}])
def test_spec_checkpoint_run_id_is_immutable(testbed: TestBed, namespace: str, change: dict[str, Any]) -> None:
    body = copy.deepcopy(VALID)
    body["metadata"]["namespace"] = namespace
    if change["runId"] != "adopted":  # added later, removed, changed
        body["spec"]["checkpoint"]["runId"] = "moving-run"
    testbed.kubectl("apply", "-f", "-", input=json.dumps(body))
    refused = patch(testbed, namespace, {"checkpoint": change})
    assert refused.returncode != 0, f"{change} was accepted"
    assert "spec.checkpoint.runId is immutable" in refused.stderr, refused.stderr
    assert stored(testbed, namespace)["checkpoint"].get("runId") == body["spec"]["checkpoint"].get("runId")
    assert patch(testbed, namespace, {"checkpoint": {"snapshotEvery": 50}}).returncode == 0


def test_a_set_event_is_immutable_and_new_ones_may_be_added(testbed: TestBed, created: str) -> None:
    assert patch(testbed, created, {"events": {"go": {"v": 1}}}).returncode == 0
    for change in ({"go": {"v": 2}}, {"go": None}, {"go": {"v": 1, "w": 2}}, {"go": True},
                   {"go": {"v": 2}, "also": 1}):  # a change hidden in an update that adds a name
        refused = patch(testbed, created, {"events": change})
        assert refused.returncode != 0, f"{change} was accepted"
        assert "spec.events: an event already set cannot be changed or removed" in refused.stderr, refused.stderr
    assert patch(testbed, created, {"events": {"go": {"v": 1}}}).returncode == 0  # the same value again
    assert patch(testbed, created, {"events": {"next": False}}).returncode == 0
    assert stored(testbed, created)["events"] == {"go": {"v": 1}, "next": False}


def test_events_past_the_limit_are_refused_when_sent(testbed: TestBed, created: str) -> None:
    """The 2,001st event is refused by the API server naming the limit; the ones before it stay."""
    assert patch(testbed, created, {"events": {f"e{i}": i for i in range(2000)}}).returncode == 0
    refused = patch(testbed, created, {"events": {"one-more": True}})
    assert refused.returncode != 0, "a 2,001st event was accepted"
    assert "spec.events" in refused.stderr, refused.stderr
    assert "must have at most 2000 items" in refused.stderr, refused.stderr
    assert len(stored(testbed, created)["events"]) == 2000


def test_child_requests_past_the_limit_are_refused_by_the_api_server(testbed: TestBed, created: str) -> None:
    """The backstop behind ctx.start_child's own check: a status.childRequests past api.CHILDREN_MAX is refused
    naming the field and the limit, and what was stored stays."""
    request = {"workflow": "m:w", "input": {}, "policy": {}}

    def status_patch(requests: dict[str, Any]) -> Any:
        return testbed.kubectl("patch", "dr", "bad", "-n", created, "--subresource=status", "--type=merge",
                               "-p", json.dumps({"status": {"childRequests": requests}}), check=False)

    assert status_patch({f"c{i}": request for i in range(api.CHILDREN_MAX)}).returncode == 0
    refused = status_patch({"one-more": request})
    assert refused.returncode != 0, "a child request past the limit was accepted"
    assert "status.childRequests" in refused.stderr, refused.stderr
    assert f"must have at most {api.CHILDREN_MAX} items" in refused.stderr, refused.stderr
    stored_status = json.loads(testbed.kubectl("get", "dr", "bad", "-n", created, "-o", "json").stdout)["status"]
    assert len(stored_status["childRequests"]) == api.CHILDREN_MAX


# --- ModelQuotas ----------------------------------------------------------------------------------------

QUOTA: dict[str, Any] = {"apiVersion": api.API_VERSION, "kind": api.QUOTA_KIND, "metadata": {"name": "bad-quota"},
                         "spec": {"models": "gpt-4o*", "tokensPerMinute": 60000, "namespaces": ["team-a"],
                                  "weights": {"team-a": 2}}}


def quota_with(**spec: Any) -> dict[str, Any]:
    body = copy.deepcopy(QUOTA)
    body["spec"].update(spec)
    body["spec"] = {k: v for k, v in body["spec"].items() if v is not DELETE}
    return body


QUOTA_CASES: dict[str, tuple[dict[str, Any], str, str]] = {
    "no-limit": (quota_with(tokensPerMinute=DELETE), "spec", quotas.LIMIT_MISSING),
    "negative-tokens": (quota_with(tokensPerMinute=-1), "spec.tokensPerMinute", "greater than or equal to 1"),
    "zero-requests": (quota_with(requestsPerMinute=0), "spec.requestsPerMinute", "greater than or equal to 1"),
    "zero-concurrent": (quota_with(concurrent=0), "spec.concurrent", "greater than or equal to 1"),
    "zero-weight": (quota_with(weights={"team-a": 0}), "spec.weights.team-a", "greater than or equal to 1"),
    "no-models": (quota_with(models=DELETE), "spec.models", "Required value"),
    "bad-namespace": (quota_with(namespaces=["Team A"]), "spec.namespaces[0]", "should match"),
    "unknown-field": (quota_with(tokensPerMinut=1000), "tokensPerMinut", "unknown field"),
    "tokens-as-text": (quota_with(tokensPerMinute="60k"), "spec.tokensPerMinute", "must be of type integer"),
}


def test_a_valid_model_quota_is_accepted(testbed: TestBed) -> None:
    accepted = apply(testbed, QUOTA)
    assert accepted.returncode == 0, accepted.stderr


@pytest.mark.parametrize("case", sorted(QUOTA_CASES))
def test_an_invalid_model_quota_is_refused_naming_the_field(testbed: TestBed, case: str) -> None:
    assert_refused(testbed, case, *QUOTA_CASES[case])
