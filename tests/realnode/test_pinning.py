"""Runs pinned to their code on the real node (issue 27, items 1 and 3), with containerd's real digests.

Three runs start on one moving tag and wait; the tag is then moved to other code (version 2, its own image).
The run left alone finishes on the digest it was pinned to; `kubectl durablerun upgrade` refuses version 2 for
the run whose journal it cannot replay, changing nothing, and moves the run whose journal it replays, which then
finishes on version 2. No step is executed twice. The two are upgraded together, by the bulk form
(`upgrade -l SELECTOR`), which reports each run it selects and leaves the one it does not select alone. The
check is the operator's: the same request written by hand, by digest, is refused as well.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

from durablerun import api
from durablerun._private.tools.kubeapi import KIND_REF
from durablerun_testbed import procs
from durablerun_testbed.realnode import build_workflow_image
from durablerun_testbed.testbed import TestBed
from tests.helpers.kubectl_plugin import Plugin
from tests.realnode.helpers import MOVING, V2, RealRuns


def test_a_moved_tag_does_not_reach_a_pinned_run_and_upgrade_moves_only_code_that_replays(
    real_bed: TestBed, real_runs: RealRuns, tmp_path: Path,
) -> None:
    node = real_bed.real_node
    assert node is not None
    archive, v2 = build_workflow_image(V2)
    node.import_image(archive)
    node.ctr("images", "tag", "--force", real_runs.image, MOVING)
    real_runs.image = MOVING
    for name, workflow in (("left", "upgrade_flows:kept"), ("moved", "upgrade_flows:kept"),
                           ("diverged", "upgrade_flows:renamed")):
        # A 30 s lease: nothing here waits on an expiry, and at load 20 three runners resuming at once missed
        # four renewals of the helpers' 10 s lease, and "left" was aborted for it.
        manifest = real_runs.manifest(name, workflow, {"marks": name}, policy={"leaseDuration": "30s"})
        if name != "left":
            manifest["metadata"]["labels"] = {"wave": "1"}
        real_runs.apply(manifest)
    try:  # three pods start at once: generous on a loaded 2-core machine
        waiting = {name: real_runs.wait_phase(name, "Waiting", timeout=240) for name in ("left", "moved", "diverged")}
    except procs.Timeout as timeout:
        seen = {name: (real_runs.status(name).get("phase"), real_runs.status(name).get("message"))
                for name in ("left", "moved", "diverged")}
        raise AssertionError(f"{timeout}: {seen}") from None
    pins = {name: (status.get("pin") or {}).get("image") for name, status in waiting.items()}
    assert len(set(pins.values())) == 1, pins  # one image, one digest
    pinned = pins["left"]
    assert api.image_digest(pinned) == pinned, pinned
    wide = real_runs.kubectl("get", "dr", "left", "-o", "wide")
    assert wide.splitlines()[0].split()[-1] == "IMAGE"
    assert wide.splitlines()[1].split()[-1] == pinned

    node.ctr("images", "tag", "--force", v2, MOVING)  # a deploy: the tag now names version 2
    home = tmp_path / "home"
    home.mkdir()
    plugin = Plugin(real_bed, real_runs.namespace, home)

    missing = plugin.dr("upgrade", "diverged", "--image", "localhost/durable-run/no-such-image:1", timeout=300)
    assert missing.returncode == 1, missing.stdout + missing.stderr
    assert missing.stderr.startswith("kubectl durablerun: diverged: localhost/durable-run/no-such-image:1 refused; "
                                     "nothing changed."), missing.stderr
    assert re.search(r"no-such-image:1 cannot start: (ErrImagePull|ImagePullBackOff)", missing.stderr), missing.stderr

    # The bulk form: each selected run checked and moved on its own, one line each; exit 1 as one was refused.
    bulk = plugin.dr("upgrade", "-l", "wave=1", "--image", v2, timeout=600)
    assert bulk.returncode == 1, bulk.stdout + bulk.stderr
    lines = dict(line.split(" ", 1) for line in bulk.stdout.splitlines() if line.startswith(f"{KIND_REF}/"))
    assert set(lines) == {f"{KIND_REF}/diverged", f"{KIND_REF}/moved"}, bulk.stdout  # not "left"
    refused = lines[f"{KIND_REF}/diverged"]
    assert refused.startswith(f"refused: diverged: {v2} refused; nothing changed."), refused
    assert "draft" in bulk.stdout, bulk.stdout  # the divergence itself: what the journal holds
    assert "outline" in bulk.stdout, bulk.stdout  # and what the new code asks for
    assert lines[f"{KIND_REF}/moved"].startswith(f"upgraded: {v2} ("), bulk.stdout
    assert real_runs.status("diverged")["pin"]["image"] == pinned
    assert "previous" not in real_runs.status("diverged")["pin"]
    replays = next(c for c in real_runs.status("diverged")["conditions"] if c["type"] == "UpgradeReplays")
    assert replays["status"] == "False", replays
    assert "outline" in replays["message"], replays

    pin = procs.wait_for(lambda: (p := real_runs.status("moved")["pin"]).get("previous") and p, timeout=60,
                         what="the operator to move the pin of run 'moved'")
    assert real_runs.status("moved")["phase"] == "Waiting"  # it runs the new code from its next attempt
    assert pin["previous"] == pinned
    assert pin["image"] != pinned
    assert pin["by"]
    assert any(e["reason"] == "Upgraded" for e in real_runs.events("moved"))

    # The check is the operator's, not the plugin's: an annotation written by hand, naming version 2 by its digest,
    # is checked all the same, refused, and the run keeps its pin.
    forged = json.dumps({"image": pin["image"], "by": "mallory"})
    real_runs.kubectl("annotate", "dr", "diverged", f"{api.ANNOTATION_UPGRADE}={forged}", "--overwrite")
    check = procs.wait_for(lambda: (c := real_runs.status("diverged").get("upgradeCheck") or {}).get("request")
                           == forged and c.get("state") != "Checking" and c, timeout=180,
                           what="the operator's verdict on the hand-written upgrade of run 'diverged'")
    assert check["state"] == "Refused", check
    assert "outline" in check["message"], check
    assert real_runs.status("diverged")["pin"]["image"] == pinned
    # The operator posts a transition's Events after its status: wait for it.
    def refusals() -> list[str]:
        return [e["message"] for e in real_runs.events("diverged") if e["reason"] == "UpgradeRefused"]

    try:
        procs.wait_for(lambda: any("mallory asked" in m and "outline" in m for m in refusals()), timeout=30,
                       what="the UpgradeRefused Event naming mallory and the divergent step")
    except procs.Timeout:
        raise AssertionError(f"no UpgradeRefused Event names mallory and the divergence: {refusals()}") from None

    for name in ("left", "moved", "diverged"):
        real_runs.kubectl("patch", "dr", name, "--type=merge", "-p", json.dumps({"spec": {"events": {"go": {}}}}))
    codes = {}
    for name in ("left", "moved", "diverged"):
        status = real_runs.wait_phase(name, "Succeeded", "Failed", "Aborted", timeout=180)
        assert status["phase"] == "Succeeded", (name, status.get("message"))
        codes[name] = json.loads(status["result"]["inline"])["code"]
        assert real_runs.executions(name) == {"draft": 1, "publish": 1}, name
    assert codes == {"left": "v1", "moved": "v2", "diverged": "v1"}
    second = real_runs.pod(real_runs.status("left")["pod"])
    assert second["spec"]["containers"][0]["image"] == pinned
