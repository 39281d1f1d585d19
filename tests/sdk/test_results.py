"""A run's result: where it lives, small ones inline, and reading a Kubernetes run's journal."""

from __future__ import annotations

import json

import pytest

from durablerun import api
from durablerun._private.records import codec
from durablerun.api import Outcome
from durablerun.engine import EngineConfig, Run
from durablerun.resource import RESULT_INLINE_MAX
from durablerun.stores import RunRef
from tests.helpers.local_runs import StoreSpec

from .helpers import cli


@pytest.mark.parametrize("size", [10, RESULT_INLINE_MAX + 100, 3000])
def test_a_completed_run_says_where_its_result_lives(durable_store_spec: StoreSpec,
                                                      size: int) -> None:
    spec = durable_store_spec
    store = spec.open()
    ref = RunRef.local(f"res-{size}")
    # 3000 bytes with inline_result_max 2048: the result is its own object (a blob).
    config = EngineConfig(inline_result_max=2048 if size == 3000 else 256 * 1024)
    first = Run(store=store, run=ref, workflow="racing:sized_result", input={"bytes": size},
                config=config).run_attempt()
    assert first.outcome == Outcome.COMPLETED
    body = codec.dumps({"text": "x" * size})
    info = first.result_info
    assert info is not None
    assert (info["size"], info["sha256"]) == (len(body), codec.sha256_hex(body))
    assert info["ref"].startswith(f"{spec.uri}/_local/res-{size}/")
    if len(body) <= RESULT_INLINE_MAX:
        assert json.loads(info["inline"]) == {"text": "x" * size}
    else:
        assert "inline" not in info
    where = info["ref"][len(spec.uri) + 1:]
    if size == 3000:
        assert where == f"_local/res-{size}/blobs/{info['sha256']}.json"
        assert store.backend.get(where) is not None
    elif spec.kind == "s3":
        assert where == f"_local/res-{size}/journal/000000000001.json"
        assert store.backend.get(where) is not None  # the complete record's own object
    else:
        assert where == f"_local/res-{size}/journal/000000000000.log#1"
    # The same on a re-run of the completed run, and the CLI prints the full result.
    again = Run(store=store, run=ref, workflow="racing:sized_result", input={"bytes": size},
                config=config).run_attempt()
    assert again.result_info == info
    assert (store.read_run(run=ref).status or {})["resultRef"] == info["ref"]
    printed = cli(["inspect", "--run-id", f"res-{size}", "--store", spec.uri, *spec.cli_args,
                   "--result"], env=spec.env)
    assert printed.returncode == 0, printed.stderr
    assert json.loads(printed.stdout) == {"text": "x" * size}


def test_inspect_opens_a_kubernetes_run_by_namespace_and_name(testbed: object, namespace: str,
                                                              s3_spec: StoreSpec) -> None:
    from durablerun_testbed.testbed import TestBed

    assert isinstance(testbed, TestBed)
    bucket = s3_spec.uri.split("/")[2]
    body = {"apiVersion": api.API_VERSION, "kind": "DurableRun",
            "metadata": {"name": "agent", "namespace": namespace},
            "spec": {"workflow": "racing:many_steps", "input": {"steps": 4},
                     "checkpoint": {"uri": f"s3://{bucket}/runs",
                                    "endpoint": s3_spec.options["endpoint_url"]}}}
    testbed.kubectl("apply", "-f", "-", input=json.dumps(body))
    uid = json.loads(testbed.kubectl("get", "dr", "agent", "-n", namespace, "-o", "json").stdout
                     )["metadata"]["uid"]
    # What the runner pod would have journaled (no operator runs here).
    store = s3_spec.open()
    done = Run(store=store, run=RunRef.kubernetes(namespace, "agent", uid),
               workflow="racing:many_steps", input={"steps": 4}).run_attempt()
    assert done.outcome == Outcome.COMPLETED
    objects = {k: store.backend.get(k) for k in store.backend.list_keys(f"{namespace}/")}

    # The user's shell: a kubeconfig and their own S3 credentials, no --store.
    env = {"KUBECONFIG": str(testbed.kubeconfig), "AWS_ACCESS_KEY_ID": s3_spec.env["AWS_ACCESS_KEY_ID"],
           "AWS_SECRET_ACCESS_KEY": s3_spec.env["AWS_SECRET_ACCESS_KEY"]}
    table = cli(["inspect", "--kubernetes", f"{namespace}/agent"], env=env)
    assert table.returncode == 0, table.stderr
    assert f"run       {namespace}/agent/{uid}   (s3://{bucket}/runs)" in table.stdout
    assert "quick-3" in table.stdout
    assert "Completed" in table.stdout
    result = cli(["inspect", "--kubernetes", f"{namespace}/agent", "--result"], env=env)
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout) == 6
    missing = cli(["inspect", "--kubernetes", f"{namespace}/nope"], env=env)
    assert missing.returncode == 1
    assert f"no DurableRun {namespace}/nope" in missing.stderr
    bad = cli(["inspect", "--kubernetes", "agent"], env=env)
    assert bad.returncode == 2
    assert "use NAMESPACE/NAME" in bad.stderr
    # Read-only: nothing was written.
    assert {k: store.backend.get(k) for k in store.backend.list_keys(f"{namespace}/")} == objects


def test_inspect_opens_a_run_id_journal_by_its_identity_read_only(testbed: object, namespace: str,
                                                                  s3_spec: StoreSpec) -> None:
    """A DurableRun with spec.checkpoint.runId: `inspect --kubernetes` and `inspect --run-id` open the run
    id's journal (wherever its runner is), show who holds it, and write nothing."""
    from durablerun._private.storage.owner import Holder, OwnerLease
    from durablerun_testbed.testbed import TestBed

    assert isinstance(testbed, TestBed)
    bucket = s3_spec.uri.split("/")[2]
    body = {"apiVersion": api.API_VERSION, "kind": "DurableRun",
            "metadata": {"name": "agent", "namespace": namespace},
            "spec": {"workflow": "racing:many_steps", "input": {"steps": 4},
                     "checkpoint": {"uri": f"s3://{bucket}/runs", "runId": "moved-1",
                                    "endpoint": s3_spec.options["endpoint_url"]}}}
    testbed.kubectl("apply", "-f", "-", input=json.dumps(body))
    store = s3_spec.open()
    ref = RunRef.local("moved-1")
    # A runner in another cluster holds the journal and has written it.
    held = OwnerLease(store.backend, ref, Holder(cluster="prod-eu", namespace="team-a", name="agent", uid="u-1",
                                                 pod="agent-a2", epoch=2), 60)
    held.acquire()
    assert Run(store=store, run=ref, workflow="racing:many_steps", input={"steps": 4}).run_attempt().outcome \
        == Outcome.COMPLETED
    objects = {k: store.backend.get(k) for k in store.backend.list_keys("_local/moved-1/")}

    env = {"KUBECONFIG": str(testbed.kubeconfig), "AWS_ACCESS_KEY_ID": s3_spec.env["AWS_ACCESS_KEY_ID"],
           "AWS_SECRET_ACCESS_KEY": s3_spec.env["AWS_SECRET_ACCESS_KEY"]}
    for argv in (["--kubernetes", f"{namespace}/agent"],
                 ["--run-id", "moved-1", "--store", s3_spec.uri, *s3_spec.cli_args]):
        table = cli(["inspect", *argv], env=env)
        assert table.returncode == 0, table.stderr
        assert f"run       _local/moved-1   (s3://{bucket}/runs)" in table.stdout, table.stdout
        assert "owner     held by DurableRun team-a/agent (uid u-1, pod agent-a2, epoch 2) in cluster prod-eu" \
            in table.stdout, table.stdout
    as_json = json.loads(cli(["inspect", "--kubernetes", f"{namespace}/agent", "--json"], env=env).stdout)
    assert as_json["owner"]["holder"]["cluster"] == "prod-eu"
    assert {k: store.backend.get(k) for k in store.backend.list_keys("_local/moved-1/")} == objects
