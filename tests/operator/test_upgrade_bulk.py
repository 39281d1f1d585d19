"""Pinning and the bulk `kubectl durablerun upgrade -l SELECTOR` on the process node (issue 27, items 1 and 3).

The process node runs no images, but a container whose image is named by its digest reports that digest (as a
kubelet reports what it ran), so runs whose template names a digest are pinned to it here. Two of three waiting
runs are selected by a label and moved to another digest, each checked by the replayer in a pod of its own and
reported on its own line; the third is left alone. (Divergence, and the next attempt running the new code, are
the real node's test, tests/realnode/test_pinning.py: here every image runs the same code.)
"""

from __future__ import annotations

from typing import Any

import pytest

from durablerun import api
from durablerun._private.tools.kubeapi import KIND_REF
from durablerun_testbed import procs
from tests.helpers.kubectl_plugin import Plugin
from tests.helpers.runs import Operator, RunEnv

pytestmark = pytest.mark.testbed

V1 = "localhost/durable-run/agents@sha256:" + "1" * 64
V2 = "localhost/durable-run/agents@sha256:" + "2" * 64
RUNS = {"wave-a": {"wave": "1"}, "wave-b": {"wave": "1"}, "alone": {}}


def moved(runs: RunEnv, name: str) -> dict[str, Any] | None:
    pin: dict[str, Any] = runs.get(name)["status"]["pin"]
    return pin if pin.get("previous") else None


def test_upgrade_by_label_moves_each_selected_run_and_reports_it(
        operator: Operator, runs: RunEnv, plugin: Plugin) -> None:
    for name, labels in RUNS.items():
        manifest = runs.manifest(name, "optest_flows:approval")
        manifest["spec"]["template"]["spec"]["containers"][0]["image"] = V1
        manifest["metadata"]["labels"] = labels
        runs.apply(manifest)
    pinned = {name: runs.wait_phase(name, "Waiting", timeout=180)["status"].get("pin") for name in RUNS}
    assert {name: (pin or {}).get("image") for name, pin in pinned.items()} == dict.fromkeys(RUNS, V1), pinned

    bulk = plugin.dr("upgrade", "-l", "wave=1", "--image", V2, timeout=300)
    assert bulk.returncode == 0, bulk.stdout + bulk.stderr
    assert bulk.stdout.splitlines() == [
        f"{KIND_REF}/{name} upgraded: {V2} ({V2}) replays the journal cleanly; the next attempt runs it instead "
        f"of {V1}" for name in ("wave-a", "wave-b")], bulk.stdout
    for name in ("wave-a", "wave-b"):
        pin = procs.wait_for(lambda n=name: moved(runs, n), timeout=60, what=f"the operator to move the pin of {name}")
        assert (pin["image"], pin["previous"]) == (V2, V1)
        assert pin["by"]
    assert runs.get("alone")["status"]["pin"] == pinned["alone"]  # not selected: not checked, not moved
    assert api.ANNOTATION_UPGRADE in runs.get("wave-a")["metadata"]["annotations"]
    assert api.ANNOTATION_UPGRADE not in (runs.get("alone")["metadata"].get("annotations") or {})
    assert runs.executions("draft") == 3, runs.ledger()  # the checks executed nothing
