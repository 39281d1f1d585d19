"""Least privilege, asked of the real RBAC authorizer with real ServiceAccount tokens.

The operator's ServiceAccount and permissions come from the chart; the runner's
ServiceAccount, Role and RoleBinding (the namespace's, or per run) are built by
the operator's own builder and created with the operator's token, as the
operator creates them (which also proves RBAC's escalation check lets it grant
them); the runner-status admission policy then holds each runner to its run.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from durablerun import api, resource
from durablerun_operator import builders
from durablerun_operator.config import Settings
from durablerun_testbed import procs
from durablerun_testbed.testbed import TestBed
from tests.helpers.clis import CHART, Helm, Kubectl, dump, service_account_kubectl

pytestmark = pytest.mark.testbed

RUNS = api.CRD_NAME
SCHEDULES = api.SCHEDULE_CRD_NAME

# What the operator must be able to do in every namespace it watches (the operator's contract).
OPERATOR_NEEDS: list[tuple[str, str, str | None]] = [
    # create: the child runs runners ask for (a runner itself cannot create runs).
    *((verb, RUNS, None) for verb in ("get", "list", "watch", "create", "patch", "update", "delete")),
    *((verb, RUNS, "status") for verb in ("get", "patch", "update")),
    ("update", RUNS, "finalizers"),
    # DurableRunSchedules: read and watched, their status written, runs owned by them (blockOwnerDeletion).
    *((verb, SCHEDULES, None) for verb in ("get", "list", "watch")),
    *((verb, SCHEDULES, "status") for verb in ("get", "patch")),
    ("update", SCHEDULES, "finalizers"),
    *((verb, "pods", None) for verb in ("get", "list", "watch", "create", "delete", "patch")),
    *((verb, "events", None) for verb in ("create", "patch")),
    *((verb, "events.events.k8s.io", None) for verb in ("create", "patch")),
    *((verb, "serviceaccounts", None) for verb in ("get", "create", "delete")),
    *((verb, kind, None) for kind in ("roles.rbac.authorization.k8s.io", "rolebindings.rbac.authorization.k8s.io")
      for verb in ("get", "create", "patch", "delete")),
]
# What it must not: read credentials, run code in pods or change cluster-wide state.
OPERATOR_MUST_NOT: list[tuple[str, str, str | None]] = [
    ("get", "secrets", None), ("list", "secrets", None), ("get", "configmaps", None),
    ("create", "pods", "exec"), ("create", "serviceaccounts", "token"),
    ("update", "pods", None), ("create", "deployments.apps", None),
    ("escalate", "roles.rbac.authorization.k8s.io", None), ("bind", "roles.rbac.authorization.k8s.io", None),
    # A schedule is its user's: the operator neither makes, changes nor deletes one.
    ("create", SCHEDULES, None), ("patch", SCHEDULES, None), ("update", SCHEDULES, None), ("delete", SCHEDULES, None),
]
OPERATOR_MUST_NOT_CLUSTER: list[tuple[str, str, str | None]] = [
    ("create", "clusterroles.rbac.authorization.k8s.io", None),
    ("create", "clusterrolebindings.rbac.authorization.k8s.io", None),
    ("delete", "nodes", None), ("list", "namespaces", None),
    ("create", "customresourcedefinitions.apiextensions.k8s.io", None),
]


def can(kubectl: Kubectl, verb: str, resource: str, subresource: str | None, namespace: str | None) -> bool:
    extra = [f"--subresource={subresource}"] if subresource else []
    return kubectl.can_i(verb, resource, namespace, *extra)


def denied(kubectl: Kubectl, asks: list[tuple[str, str, str | None]], namespace: str | None) -> list[str]:
    return [f"{v} {r}{'/' + s if s else ''}" for v, r, s in asks if not can(kubectl, v, r, s, namespace)]


def granted(kubectl: Kubectl, asks: list[tuple[str, str, str | None]], namespace: str | None) -> list[str]:
    return [f"{v} {r}{'/' + s if s else ''}" for v, r, s in asks if can(kubectl, v, r, s, namespace)]


@pytest.fixture
def other_namespace(testbed: TestBed) -> Iterator[str]:
    name = "t-" + uuid.uuid4().hex[:10]
    testbed.kubectl("create", "namespace", name)
    yield name
    testbed.kubectl("delete", "namespace", name, "--wait=false", check=False)


@pytest.fixture
def install_rbac(helm: Helm, admin: Kubectl) -> Iterator[Any]:
    """Apply only the chart's ServiceAccount and RBAC (no Deployment: nothing runs); delete them after."""
    applied: list[str] = []

    def install(namespace: str, *values: str) -> str:
        release = "dr-" + uuid.uuid4().hex[:6]
        rendered = helm("template", release, str(CHART), "--namespace", namespace, *values,
                        "--show-only", "templates/serviceaccount.yaml",
                        "--show-only", "templates/rbac-operator.yaml",
                        "--show-only", "templates/rbac-users.yaml").stdout
        admin("apply", "-f", "-", input=rendered)
        applied.append(rendered)
        return f"{release}-durable-run"

    yield install
    for rendered in applied:
        admin("delete", "--ignore-not-found", "--wait=false", "-f", "-", input=rendered, check=False)


def make_run(admin: Kubectl, namespace: str, name: str) -> dict[str, Any]:
    run = {"apiVersion": api.API_VERSION, "kind": "DurableRun",
           "metadata": {"name": name, "namespace": namespace},
           "spec": {"workflow": "agents.research:run", "checkpoint": {"uri": "s3://runs/prefix"}}}
    admin("apply", "-f", "-", input=json.dumps(run))
    return dict(json.loads(admin("get", "dr", name, "-n", namespace, "-o", "json").stdout))


def test_operator_can_do_its_job_everywhere_and_nothing_more(
    testbed: TestBed, admin: Kubectl, install_rbac: Any, namespace: str, other_namespace: str, tmp_path: Path
) -> None:
    account = install_rbac(namespace)
    operator = service_account_kubectl(testbed, account, namespace, tmp_path)
    for where in (namespace, other_namespace):
        assert denied(operator, OPERATOR_NEEDS, where) == [], f"the operator lacks these in {where}"
        assert granted(operator, OPERATOR_MUST_NOT, where) == [], f"the operator holds these in {where}"
    assert granted(operator, OPERATOR_MUST_NOT_CLUSTER, None) == []


def test_operator_watching_listed_namespaces_has_no_rights_elsewhere(
    testbed: TestBed, install_rbac: Any, namespace: str, other_namespace: str, tmp_path: Path
) -> None:
    account = install_rbac(namespace, "--set", f"watchNamespaces={{{namespace}}}")
    operator = service_account_kubectl(testbed, account, namespace, tmp_path)
    assert denied(operator, OPERATOR_NEEDS, namespace) == []
    assert granted(operator, OPERATOR_NEEDS, other_namespace) == []
    assert granted(operator, [("list", RUNS, None), ("list", "pods", None)], None) == []


STATUS = {"status": {"lease": {"holder": "x", "epoch": 1, "durationSeconds": 60}}}
# What no runner may do, in either access: write a run itself, or touch pods, Secrets or RBAC.
RUNNER_MUST_NOT: list[tuple[str, str, str | None]] = [
    ("patch", f"{RUNS}/mine", None), ("update", f"{RUNS}/mine", None), ("delete", f"{RUNS}/mine", None),
    ("create", RUNS, None), ("list", RUNS, None),
    ("delete", "pods", None), ("create", "pods", None), ("list", "pods", None),
    ("get", "secrets", None), ("list", "secrets", None), ("get", "configmaps", None),
    ("create", "serviceaccounts", "token"), ("create", "roles.rbac.authorization.k8s.io", None),
]


def mine_and_theirs(admin: Kubectl, namespace: str, other_namespace: str) -> dict[str, Any]:
    """The run "mine", another run "theirs" beside it, and a "mine" in another namespace: the first, as stored."""
    make_run(admin, namespace, "theirs")
    make_run(admin, other_namespace, "mine")
    return make_run(admin, namespace, "mine")


def as_attempt(testbed: TestBed, admin: Kubectl, run: str, account: str, namespace: str, tmp_path: Path) -> Kubectl:
    """A runner's kubectl whose token is bound to ``run``'s current attempt's pod (a pod held unscheduled by a
    scheduling gate, never run), as the node mounts it."""
    pod = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": f"{run}-a1", "namespace": namespace},
           "spec": {"serviceAccountName": account, "schedulingGates": [{"name": "test.durablerun.dev/never"}],
                    "containers": [{"name": "runner", "image": "registry.example/none:1"}]}}
    admin("apply", "-f", "-", input=json.dumps(pod))
    admin("patch", "dr", run, "-n", namespace, "--subresource=status", "--type=merge",
          "-p", json.dumps({"status": {"pod": f"{run}-a1"}}))
    return service_account_kubectl(testbed, account, namespace, tmp_path, pod=f"{run}-a1")


def patch_status(kubectl: Kubectl, run: str, namespace: str) -> Any:
    return kubectl("patch", "dr", run, "-n", namespace, "--subresource=status", "--type=merge",
                   "-p", json.dumps(STATUS), check=False)


def test_namespace_runner_writes_only_its_current_attempts_run(
    testbed: TestBed, admin: Kubectl, install_rbac: Any, namespace: str, other_namespace: str, tmp_path: Path
) -> None:
    operator = service_account_kubectl(testbed, install_rbac(namespace), namespace, tmp_path)
    run = mine_and_theirs(admin, namespace, other_namespace)

    # The namespace's objects, shaped by the operator's builder and created with the operator's token: nothing
    # of a run's own, so nothing more to create for the next run.
    objects = builders.runner_rbac(run, Settings())
    assert [(o["kind"], o["metadata"]["name"]) for o in objects] == [
        ("ServiceAccount", api.RUNNER_ACCOUNT), ("Role", api.RUNNER_ROLE),
        ("RoleBinding", api.runner_binding(api.RUNNER_ACCOUNT))]
    assert all("ownerReferences" not in o["metadata"] for o in objects)
    assert builders.runner_rbac(make_run(admin, namespace, "next"), Settings()) == objects
    operator("create", "-f", "-", input=dump(objects))

    runner = as_attempt(testbed, admin, "mine", api.RUNNER_ACCOUNT, namespace, tmp_path)
    assert can(runner, "get", f"{RUNS}/theirs", None, namespace)  # reads: the namespace's runs
    assert can(runner, "patch", f"{RUNS}/theirs", "status", namespace)  # RBAC: yes; the policy: see below
    assert granted(runner, RUNNER_MUST_NOT, namespace) == []
    assert granted(runner, [("get", RUNS, None), ("patch", RUNS, "status")], other_namespace) == []

    # Its own run's status, while its pod is the current attempt: written.
    written = patch_status(runner, "mine", namespace)
    assert written.returncode == 0, written.stderr
    assert json.loads(admin("get", "dr", "mine", "-n", namespace, "-o", "json").stdout)["status"]["lease"][
        "holder"] == "x"
    # Another run's status: refused by the runner-status policy, as not that run's attempt.
    refused = patch_status(runner, "theirs", namespace)
    assert refused.returncode != 0
    assert resource.CURRENT_ATTEMPT_ONLY in refused.stderr, refused.stderr
    # Its own run's, with a token of its ServiceAccount not bound to the attempt's pod: refused too.
    unbound = service_account_kubectl(testbed, api.RUNNER_ACCOUNT, namespace, tmp_path)
    refused = patch_status(unbound, "mine", namespace)
    assert refused.returncode != 0
    assert resource.CURRENT_ATTEMPT_ONLY in refused.stderr, refused.stderr
    assert "status" not in json.loads(admin("get", "dr", "theirs", "-n", namespace, "-o", "json").stdout)


def test_per_run_runner_reads_its_run_and_patches_its_status_and_nothing_else(
    testbed: TestBed, admin: Kubectl, install_rbac: Any, namespace: str, other_namespace: str, tmp_path: Path
) -> None:
    operator = service_account_kubectl(testbed, install_rbac(namespace), namespace, tmp_path)
    run = mine_and_theirs(admin, namespace, other_namespace)

    # The per-run objects (api.RUNNER_ACCESS_RUN), shaped by the operator's builder, created with its token.
    objects = builders.runner_rbac(run, Settings(runner_access=api.RUNNER_ACCESS_RUN))
    assert [(o["kind"], o["metadata"]["name"]) for o in objects] == [
        ("ServiceAccount", "durablerun-mine"), ("Role", "durablerun-mine"), ("RoleBinding", "durablerun-mine")]
    role = objects[1]
    assert role["rules"] == [
        {"apiGroups": [api.GROUP], "resources": [api.PLURAL], "resourceNames": ["mine"],
         "verbs": ["get", "watch"]},
        {"apiGroups": [api.GROUP], "resources": [f"{api.PLURAL}/status"], "resourceNames": ["mine"],
         "verbs": ["get", "patch"]},
    ]
    assert all(o["metadata"]["ownerReferences"][0]["uid"] == run["metadata"]["uid"] for o in objects)
    operator("create", "-f", "-", input=dump(objects))

    runner = as_attempt(testbed, admin, "mine", "durablerun-mine", namespace, tmp_path)
    # What a runner does: read its run, renew its lease and report progress in its status.
    assert can(runner, "get", f"{RUNS}/mine", None, namespace)
    assert can(runner, "watch", f"{RUNS}/mine", None, namespace)
    runner("get", "dr", "mine", "-n", namespace)
    written = patch_status(runner, "mine", namespace)
    assert written.returncode == 0, written.stderr

    # And nothing else: not even reading another run.
    must_not = [("get", f"{RUNS}/theirs", None), ("patch", f"{RUNS}/theirs", "status"), *RUNNER_MUST_NOT]
    assert granted(runner, must_not, namespace) == []
    assert granted(runner, [("get", f"{RUNS}/mine", None), ("patch", f"{RUNS}/mine", "status")],
                   other_namespace) == []
    for args in (["patch", "dr", "theirs", "-n", namespace, "--subresource=status"],
                 ["patch", "dr", "mine", "-n", other_namespace, "--subresource=status"]):
        refused = runner(*args, "--type=merge", "-p", json.dumps(STATUS), check=False)
        assert refused.returncode != 0
        assert "forbidden" in refused.stderr.lower(), refused.stderr


def test_operator_cannot_grant_what_it_does_not_hold(
    testbed: TestBed, install_rbac: Any, namespace: str, tmp_path: Path
) -> None:
    operator = service_account_kubectl(testbed, install_rbac(namespace), namespace, tmp_path)
    role = {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "Role",
            "metadata": {"name": "sneaky", "namespace": namespace},
            "rules": [{"apiGroups": [""], "resources": ["secrets"], "verbs": ["get"]}]}
    refused = operator("create", "-f", "-", input=json.dumps(role), check=False)
    assert refused.returncode != 0
    assert "attempting to grant RBAC permissions not currently held" in refused.stderr, refused.stderr


def test_user_roles_are_aggregated_into_admin_edit_view(
    admin: Kubectl, install_rbac: Any, namespace: str
) -> None:
    install_rbac(namespace)
    for role, user in (("edit", "edna"), ("view", "vic"), ("admin", "ada")):
        admin("create", "rolebinding", f"{user}-{role}", f"--clusterrole={role}", f"--user={user}", "-n", namespace)

    def as_user(user: str, verb: str, subresource: str | None = None) -> bool:
        extra = ["--as", user] + ([f"--subresource={subresource}"] if subresource else [])
        return admin.can_i(verb, RUNS, namespace, *extra)

    # Aggregation is done by a controller: wait for it.
    procs.wait_for(lambda: as_user("vic", "list") and as_user("edna", "create") and as_user("ada", "deletecollection"),
                   timeout=30, what="admin/edit/view to aggregate the durable-run roles")
    assert not as_user("vic", "create")
    assert as_user("edna", "patch")  # suspend, resume, send events: spec changes
    # Status is the operator's and the runner's: people read it, never write it.
    for user in ("vic", "edna", "ada"):
        assert as_user(user, "get", "status")
        assert not as_user(user, "patch", "status")
