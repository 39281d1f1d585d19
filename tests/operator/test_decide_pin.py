"""A run pinned to its code (issue 27, item 1), as pure decisions and manifests: the digest its attempt ran is
recorded once, every later pod runs it, a child starts on it, a missing pinned image fails the run naming the
digest and the way out, and an upgrade request moves the pin once, with who and when.

The real node proves the same end to end with containerd's digests (tests/realnode/test_pinning.py).
"""

from __future__ import annotations

import json
from typing import Any

import pytest

from durablerun import api, relations
from durablerun_operator import builders, decide
from durablerun_operator.config import Settings
from tests.operator.run_bodies import at, body, plan_for, runner_pod, running

DIGEST = "localhost/wf@sha256:" + "a" * 64
NEWER = "localhost/wf@sha256:" + "b" * 64


def pod_that_ran(image_id: str, *, waiting: str | None = None) -> dict[str, Any]:
    pod = runner_pod()
    pod["spec"]["containers"][0]["image"] = "localhost/wf:v1"
    status = pod["status"]["containerStatuses"][0]
    status["imageID"] = image_id
    if waiting:
        status["state"] = {"waiting": {"reason": waiting, "message": f"failed to pull {image_id}"}}
    return pod


@pytest.mark.parametrize(("image_id", "digest"), [
    (DIGEST, DIGEST),
    ("docker-pullable://" + DIGEST, DIGEST),  # an older runtime's form
    ("sha256:" + "c" * 64, "sha256:" + "c" * 64),  # an image imported without a registry digest: the node's id
    ("", None),  # the test bed's process node runs no images
    ("localhost/wf:v1", None),  # a tag is not a digest
])
def test_the_digest_a_pod_ran_is_read_from_its_image_id(image_id: str, digest: str | None) -> None:
    assert api.image_digest(image_id) == digest


def test_the_first_attempt_pins_the_digest_it_ran_once() -> None:
    plan, status = plan_for(body(running()), [pod_that_ran(DIGEST)], seconds=120)
    assert status["pin"]["image"] == DIGEST
    assert status["pin"]["since"] == at(120)
    assert "by" not in status["pin"]
    assert [reason for _, reason, _ in plan.events] == ["Pinned"]
    # Pinned: nothing more to do for a healthy attempt.
    assert plan_for(body(running(pin=status["pin"])), [pod_that_ran(DIGEST)], seconds=120)[0].empty


def test_a_node_that_reports_no_digest_leaves_the_run_unpinned() -> None:
    plan, status = plan_for(body(running()), [pod_that_ran("")], seconds=120)
    assert "pin" not in status
    assert plan.empty


def run_with_pin(pin: str | None, template_image: str = "localhost/wf:v2") -> dict[str, Any]:
    run = body({"phase": "Pending", **({"pin": {"image": pin}} if pin else {})},
               spec={"template": {"spec": {"containers": [{"name": "runner", "image": template_image,
                                                           "imagePullPolicy": "Always"}]}}})
    return run


def test_every_later_pod_runs_the_pinned_digest_whatever_the_template_names() -> None:
    runner = builders.runner_pod(run_with_pin(DIGEST), 3, Settings())["spec"]["containers"][0]
    assert (runner["image"], runner["imagePullPolicy"]) == (DIGEST, "IfNotPresent")
    unpinned = builders.runner_pod(run_with_pin(None), 3, Settings())["spec"]["containers"][0]
    assert (unpinned["image"], unpinned["imagePullPolicy"]) == ("localhost/wf:v2", "Always")
    # The journal's deletion needs only the SDK: a gone pinned image must not keep a deleted run from going.
    purge = builders.purge_pod(run_with_pin(DIGEST), Settings())["spec"]["containers"][0]
    assert purge["image"] == "localhost/wf:v2"


def test_a_child_starts_on_its_parents_pinned_image() -> None:
    request = relations.ChildRequest(workflow="m:child")
    child = builders.child_run(run_with_pin(DIGEST), "w1", request)
    assert child["spec"]["template"]["spec"]["containers"][0]["image"] == DIGEST
    unpinned = builders.child_run(run_with_pin(None), "w1", request)
    assert unpinned["spec"]["template"]["spec"]["containers"][0]["image"] == "localhost/wf:v2"


@pytest.mark.parametrize("reason", ["ErrImagePull", "ImagePullBackOff", "ErrImageNeverPull"])
def test_a_pinned_image_gone_from_the_node_fails_the_run_naming_the_digest_and_the_way_out(reason: str) -> None:
    pod = pod_that_ran("", waiting=reason)
    pod["spec"]["containers"][0]["image"] = DIGEST
    plan, status = plan_for(body(running(pin={"image": DIGEST})), [pod], seconds=120)
    assert status["phase"] == "Failed"
    assert status["message"].startswith(f"PinnedImageMissing: the run is pinned to {DIGEST}")
    assert "kubectl durablerun upgrade run --image IMAGE" in status["message"]
    assert status["epoch"] == 3
    assert plan.delete_pods == ["run-a2"]


def test_an_unpinned_pod_that_cannot_pull_its_image_only_warns() -> None:
    plan, status = plan_for(body(running()), [pod_that_ran("", waiting="ImagePullBackOff")], seconds=120)
    assert status["phase"] == "Running"
    assert [(kind, reason) for kind, reason, _ in plan.events] == [("Warning", "ImagePullBackOff")]


def upgrade(image: str, by: str = "dana") -> dict[str, str]:
    return {api.ANNOTATION_UPGRADE: json.dumps({"image": image, "by": by})}


def test_an_upgrade_moves_the_pin_once_recording_who_when_and_from_what() -> None:
    pinned = {"phase": "Waiting", "waitingFor": {"event": "go", "since": at(0)}, "pin": {"image": DIGEST}}
    plan, status = plan_for(body(pinned, annotations=upgrade(NEWER)))
    assert status["pin"] == {"image": NEWER, "since": at(200), "by": "dana", "previous": DIGEST,
                             "request": json.dumps({"image": NEWER, "by": "dana"})}
    assert plan.upgraded
    assert [reason for _, reason, _ in plan.events] == ["Upgraded"]
    # A settled run wakes for the request (the reconciler leaves a run alone until quiet_until).
    assert decide.quiet_until(decide.RunView.from_body(body(pinned, annotations=upgrade(NEWER)))) is None
    assert status["phase"] == "Waiting"  # the next attempt runs the new code; nothing starts now
    acted = body({**pinned, "pin": status["pin"]}, annotations=upgrade(NEWER))
    assert plan_for(acted)[0].empty
    assert decide.quiet_until(decide.RunView.from_body(acted)) is not None


def test_an_upgrade_waits_for_the_first_pin() -> None:
    plan, status = plan_for(body({"phase": "Waiting", "waitingFor": {"event": "go", "since": at(0)}},
                                 annotations=upgrade(NEWER)))
    assert "pin" not in status
    assert plan.empty


@pytest.mark.parametrize(("value", "why"), [
    ("localhost/wf:v2", "not a JSON object"),
    (json.dumps({"image": "localhost/wf:v2"}), "is not named by its digest"),
])
def test_a_malformed_upgrade_request_is_refused_once_and_changes_nothing(value: str, why: str) -> None:
    pinned = {"phase": "Waiting", "waitingFor": {"event": "go", "since": at(0)}, "pin": {"image": DIGEST}}
    plan, status = plan_for(body(pinned, annotations={api.ANNOTATION_UPGRADE: value}))
    assert status["pin"] == {"image": DIGEST, "request": value}
    assert not plan.upgraded
    [(kind, reason, message)] = plan.events
    assert (kind, reason) == ("Warning", "UpgradeRefused")
    assert why in message
    assert plan_for(body({**pinned, "pin": status["pin"]}, annotations={api.ANNOTATION_UPGRADE: value}))[0].empty
