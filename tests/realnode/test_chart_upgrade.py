"""A chart upgrade under waiting runs on the real node (issue 27): `helm upgrade` to a new operator image and a
new default runner image, while runs wait, changes no code under them.

The chart's default runner image is first set to version 1 of tests/realnode/workflows' upgrade_flows (runs that
name no image take it), runs start on it and wait, then one `helm upgrade` rolls the operator to a new image and
makes version 2 the default. The runs finish on version 1, the digest they were pinned to, each step executed
once; a run created after the upgrade gets version 2, and fails naming its digest once that image is gone from
the node. The release is rolled back to where the session had it.

Three operator rollouts take minutes on a loaded machine: `make faults` runs it, `make test` leaves it out.
"""

from __future__ import annotations

import contextlib
import json
from typing import Any

from durablerun import api
from durablerun_testbed import binaries, procs
from durablerun_testbed.realnode import build_workflow_image, built_image
from durablerun_testbed.testbed import TestBed
from tests.helpers.clis import Helm
from tests.realnode.helpers import MOVING, OPERATOR_NAMESPACE, RELEASE, V2, RealRuns


def _repository_and_tag(ref: str) -> tuple[str, str]:
    repository, _, tag = ref.rpartition(":")
    return repository, tag


def _operator_pod(real_bed: TestBed) -> dict[str, Any]:
    pods = json.loads(real_bed.kubectl("get", "pods", "-n", OPERATOR_NAMESPACE, "-l", api.OPERATOR_SELECTOR,
                                       "-o", "json").stdout)["items"]
    running = [p for p in pods if p["status"].get("phase") == "Running" and "deletionTimestamp" not in p["metadata"]]
    return dict(running[0]) if len(running) == 1 else {}


def _upgrade(real_helm: Helm, *values: str) -> None:
    sets = [arg for value in values for arg in ("--set", value)]
    real_helm("upgrade", RELEASE, str(binaries.REPO_ROOT / "charts" / "durable-run"), "--namespace",
              OPERATOR_NAMESPACE, "--reuse-values", "--wait", "--timeout=180s", *sets, timeout=240)


def test_a_chart_upgrade_changes_no_code_under_waiting_runs(
    real_bed: TestBed, real_runs: RealRuns, real_helm: Helm, chart_operator: dict[str, Any],
) -> None:
    node = real_bed.real_node
    assert node is not None
    history = json.loads(real_helm("history", RELEASE, "--namespace", OPERATOR_NAMESPACE, "-o", "json").stdout)
    revision = str(history[-1]["revision"])
    archive, v2 = build_workflow_image(V2)
    node.import_image(archive)
    operator = built_image("operator")[1]
    repository, tag = _repository_and_tag(operator)
    node.ctr("images", "tag", "--force", operator, f"{repository}:{tag}-next")  # the next release's operator
    v1_repository, v1_tag = _repository_and_tag(real_runs.image)
    v2_repository, v2_tag = _repository_and_tag(v2)
    try:
        _upgrade(real_helm, f"runner.image.repository={v1_repository}", f"runner.image.tag={v1_tag}")
        for name in ("chart-a", "chart-b"):
            manifest = real_runs.manifest(name, "upgrade_flows:kept", {"marks": name})
            del manifest["spec"]["template"]["spec"]["containers"][0]["image"]  # the chart's default runner image
            real_runs.apply(manifest)
        pins = {name: real_runs.wait_phase(name, "Waiting").get("pin", {}).get("image") for name in ("chart-a",
                                                                                                    "chart-b")}
        assert pins["chart-a"] is not None
        assert pins["chart-a"] == pins["chart-b"]
        before = _operator_pod(real_bed)["metadata"]["name"]

        # The deploy, while both runs wait: a new operator image and a new default runner image.
        _upgrade(real_helm, f"image.tag={tag}-next", f"runner.image.repository={v2_repository}",
                 f"runner.image.tag={v2_tag}")
        after = procs.wait_for(lambda: (p := _operator_pod(real_bed)) and p["metadata"]["name"] != before and p,
                               timeout=120, what="the upgraded operator's pod to run alone")
        assert after["spec"]["containers"][0]["image"] == f"{repository}:{tag}-next"

        for name in ("chart-a", "chart-b"):
            real_runs.kubectl("patch", "dr", name, "--type=merge", "-p",
                              json.dumps({"spec": {"events": {"go": {}}}}))
        fresh = real_runs.manifest("chart-new", "upgrade_flows:kept", {"marks": "chart-new"})
        del fresh["spec"]["template"]["spec"]["containers"][0]["image"]
        real_runs.apply(fresh)
        for name in ("chart-a", "chart-b"):
            status = real_runs.wait_phase(name, "Succeeded", "Failed", "Aborted", timeout=180)
            assert status["phase"] == "Succeeded", (name, status.get("message"))
            assert json.loads(status["result"]["inline"])["code"] == "v1", name  # the pinned code, not the new default
            assert status["pin"]["image"] == pins[name]
            assert real_runs.executions(name) == {"draft": 1, "publish": 1}, name
        # The new default does reach a run created after the upgrade.
        fresh_pin = real_runs.wait_phase("chart-new", "Waiting")["pin"]["image"]
        assert fresh_pin != pins["chart-a"]

        # Its pinned image gone from the node (every name of version 2 removed, with the name containerd's CRI
        # gives an image by its id, which is what the pin is for an imported image): its next attempt fails the
        # run, naming the digest and the way out, instead of running another image.
        for ref in (v2, MOVING, fresh_pin):
            with contextlib.suppress(RuntimeError):  # the moving tag exists only if test_pinning ran first
                node.ctr("images", "rm", ref)
        real_runs.kubectl("patch", "dr", "chart-new", "--type=merge", "-p",
                          json.dumps({"spec": {"events": {"go": {}}}}))
        failed = real_runs.wait_phase("chart-new", "Succeeded", "Failed", "Aborted", timeout=180)
        assert failed["phase"] == "Failed", (fresh_pin, node.ctr("images", "ls", "--quiet"))
        assert failed["message"].startswith(f"PinnedImageMissing: the run is pinned to {fresh_pin}"), failed["message"]
        assert "kubectl durablerun upgrade chart-new --image IMAGE" in failed["message"]
        assert real_runs.executions("chart-new") == {"draft": 1}
    finally:
        real_helm("rollback", RELEASE, revision, "--namespace", OPERATOR_NAMESPACE, "--wait", "--timeout=180s",
                  timeout=240)
