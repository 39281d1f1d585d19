"""The CRDs' admission rules, fuzzed against the real API server: a DurableRun or ModelQuota with hostile values
in its fields is either refused at apply time or is one the operator and the runner can work with. An object
the API server accepts and our own models then refuse (or whose durations overflow when the operator computes
with them) would fail later, in a reconcile, instead of at `kubectl apply`.

Bounded in `make test` (FUZZ_EXAMPLES, 150 by default, over both kinds); `make faults` runs thousands.
"""

from __future__ import annotations

import copy
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
import yaml
from hypothesis import HealthCheck, given
from hypothesis import strategies as st

from durablerun import api, quotas, resource
from durablerun_operator import builders
from durablerun_operator.config import Settings
from durablerun_testbed.testbed import TestBed
from tests.helpers.fuzz import EXAMPLES, fuzz

pytestmark = pytest.mark.testbed

FUZZ = fuzz(max(EXAMPLES // 2, 20), HealthCheck.function_scoped_fixture)
CRDS = Path(__file__).resolve().parents[2] / "deploy" / "crd"
#: Fields whose content is the user's own (free JSON, or the Kubernetes pod template, checked by its own schema).
OPAQUE = {"input", "events", "template"}

RUN: dict[str, Any] = {
    "apiVersion": api.API_VERSION, "kind": api.KIND,
    "metadata": {"name": "fuzzed"},
    "spec": {"workflow": "agents.research:run", "input": {"topic": "x"},
             "checkpoint": {"uri": "s3://runs/prefix", "endpoint": "http://minio:9000"}},
}
QUOTA: dict[str, Any] = {
    "apiVersion": api.API_VERSION, "kind": api.QUOTA_KIND, "metadata": {"name": "fuzzed"},
    "spec": {"models": "gpt-4o*", "tokensPerMinute": 60000},
}


def leaf_paths(schema: dict[str, Any], prefix: tuple[str, ...] = ()) -> list[tuple[str, ...]]:
    """Every field of the CRD's schema under ``prefix``, objects and leaves alike, but not into opaque ones."""
    paths = []
    for name, child in (schema.get("properties") or {}).items():
        path = (*prefix, name)
        paths.append(path)
        if name not in OPAQUE:
            paths += leaf_paths(child, path)
    return paths


def spec_paths(crd_file: str) -> list[tuple[str, ...]]:
    crd = next(doc for doc in yaml.safe_load_all((CRDS / crd_file).read_text())
               if doc and doc.get("kind") == "CustomResourceDefinition")
    return leaf_paths(crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"])


RUN_PATHS = spec_paths(f"{api.CRD_NAME}.yaml")
QUOTA_PATHS = spec_paths(f"{api.QUOTA_CRD_NAME}.yaml")

#: What a hand-written or hostile manifest puts where a field belongs: wrong types, edges of ranges, durations
#: and amounts that almost parse, overflow.
hostile = st.one_of(
    st.none(), st.booleans(), st.integers(-(2**63), 2**63), st.sampled_from([0, 1, -1, 1000, 1001, 2**31]),
    st.floats(allow_nan=False, allow_infinity=False),
    st.sampled_from(["0s", "1s", "-1s", "1h", "99999999999h", "9" * 30 + "s", "1.5h", "1h30m", "P1D", "", " ",
                     "1e3", "-0", "0.000001", "99999999999999999999.99", "abc", "gpt-*", "a" * 300, "default",
                     "team-a", "s3://b/p", "file:///x", "http://x", "Forbid"]),
    st.text(max_size=12),
    st.lists(st.sampled_from(["team-a", "", "Team A", 1]), max_size=3),
    st.dictionaries(st.sampled_from(["team-a", "Bad NS", "x"]), st.sampled_from([0, 1, 2, -1, "2"]), max_size=2),
)


@st.composite
def mutated(draw: st.DrawFn, valid: dict[str, Any], paths: list[tuple[str, ...]]) -> dict[str, Any]:
    body = copy.deepcopy(valid)
    for _ in range(draw(st.integers(1, 3))):
        path = draw(st.sampled_from(paths))
        node = body["spec"]
        for key in path[:-1]:
            if not isinstance(node.get(key), dict):
                node[key] = {}
            node = node[key]
        node[path[-1]] = draw(hostile)
    return body


def admitted(testbed: TestBed, body: dict[str, Any], namespace: str | None) -> dict[str, Any] | None:
    """The object as the API server would store it (server-side dry run), or None if it refuses it."""
    from kubernetes import client
    from kubernetes.client.exceptions import ApiException

    objects = client.CustomObjectsApi(testbed.api_client())
    try:
        if namespace is None:
            return dict(objects.create_cluster_custom_object(api.GROUP, api.VERSION, api.QUOTA_PLURAL, body,
                                                             dry_run="All"))
        return dict(objects.create_namespaced_custom_object(api.GROUP, api.VERSION, namespace, api.PLURAL, body,
                                                            dry_run="All"))
    except ApiException as refused:
        if refused.status in (400, 422):
            return None
        raise


@FUZZ
@given(body=mutated(RUN, RUN_PATHS))
def test_a_run_the_api_server_accepts_is_one_the_operator_can_start(testbed: TestBed, body: dict[str, Any]) -> None:
    stored = admitted(testbed, body, "default")
    if stored is None:
        return
    spec = resource.DurableRunSpec.model_validate(stored["spec"])
    policy = spec.policy
    # What the operator computes from an accepted run: each must work for any value the schema let through.
    for delay in (policy.max_duration, policy.progress_timeout, policy.lease_duration, policy.abort_grace_period,
                  policy.backoff.initial_delay, policy.backoff.max_delay):
        assert datetime.now(UTC) + delay > datetime.now(UTC) - delay
    policy.backoff.delay(policy.maxRestarts)
    stored["metadata"].setdefault("uid", "00000000-0000-0000-0000-000000000000")
    builders.runner_pod(stored, 1, Settings())


@FUZZ
@given(body=mutated(QUOTA, QUOTA_PATHS))
def test_a_model_quota_the_api_server_accepts_is_one_the_runners_can_read(
        testbed: TestBed, body: dict[str, Any]) -> None:
    stored = admitted(testbed, body, None)
    if stored is None:
        return
    spec = quotas.ModelQuotaSpec.model_validate(stored["spec"])
    for namespace in ("default", *spec.namespaces, *spec.weights):
        quotas.runner_quota("fuzzed", spec, namespace)


def test_the_fuzzer_reaches_both_answers(testbed: TestBed) -> None:
    """The valid manifests are accepted, so the properties above are tested on accepted objects too."""
    assert admitted(testbed, RUN, "default") is not None
    assert admitted(testbed, QUOTA, None) is not None
    assert admitted(testbed, {**RUN, "spec": {**RUN["spec"], "policy": {"maxRestarts": -1}}}, "default") is None
