"""A run pinned to its code (issue 27, item 1), as pure decisions and manifests: the digest its attempt ran is
recorded once, every later pod runs it, a child starts on it, a missing pinned image fails the run naming the
digest and the way out, and an upgrade request moves the pin once, with who and when.

The real node proves the same end to end with containerd's digests (tests/realnode/test_pinning.py).
"""

from __future__ import annotations

import json
from datetime import timedelta
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


def test_an_unpinned_pod_that_cannot_pull_its_image_warns_with_the_reason_in_status_and_conditions() -> None:
    plan, status = plan_for(body(running(attemptStartTime=at(0))), [pod_that_ran("", waiting="ImagePullBackOff")],
                            seconds=120)
    assert status["phase"] == "Running"
    assert [(kind, reason) for kind, reason, _ in plan.events] == [("Warning", "ImagePullBackOff")]
    # kubectl get -o wide's Reason column, and what kubectl wait and dashboards read.
    assert status["reason"] == "ImagePullBackOff"
    progressing = next(c for c in status["conditions"] if c["type"] == "Progressing")
    assert (progressing["status"], progressing["reason"]) == ("True", "ImagePullBackOff")
    assert "failed to pull" in progressing["message"]


def pulling(seconds: float, *, waiting: str | None = "ImagePullBackOff", reason: str | None = None,
            start_timeout: timedelta | None = None) -> tuple[decide.Plan, dict[str, Any]]:
    """The plan for a Running run whose attempt started at T0 and whose pod is ``waiting`` (None: running)."""
    pod = pod_that_ran("", waiting=waiting)
    pod["spec"]["containers"][0]["image"] = "registry.example/team/agent:nope"
    if waiting is None:
        pod["status"]["containerStatuses"][0]["state"] = {"running": {"startedAt": at(seconds - 1)}}
    extra = {"reason": reason} if reason else {}
    run = body(running(lease={}, attemptStartTime=at(0), **extra))
    return plan_for(run, [pod], seconds=seconds, start_timeout=start_timeout)


@pytest.mark.parametrize("reason", ["ErrImagePull", "ImagePullBackOff", "InvalidImageName"])
def test_a_pod_that_cannot_get_its_image_fails_the_run_at_the_start_timeout_naming_the_image(reason: str) -> None:
    plan, status = pulling(599, waiting=reason, reason=reason)
    assert status["phase"] == "Running", status["message"]
    plan, status = pulling(600, waiting=reason, reason=reason)
    assert status["phase"] == "Failed"
    assert status["reason"] == "ImagePullFailed"
    assert status["message"].startswith("ImagePullFailed: pod run-a2 could not get its image "
                                        "registry.example/team/agent:nope in 10m"), status["message"]
    assert "kubectl durablerun retry run" in status["message"]
    failed = next(c for c in status["conditions"] if c["type"] == "Failed")
    assert (failed["status"], failed["reason"]) == ("True", "ImagePullFailed")
    assert status["epoch"] == 3  # fenced: the pod, should it start late, cannot write
    assert plan.delete_pods == ["run-a2"]
    assert [(kind, why) for kind, why, _ in plan.events] == [("Warning", "Failed")]


def test_the_start_timeout_is_the_operators_setting() -> None:
    assert pulling(119, start_timeout=timedelta(minutes=2), reason="ImagePullBackOff")[1]["phase"] == "Running"
    assert pulling(120, start_timeout=timedelta(minutes=2), reason="ImagePullBackOff")[1]["phase"] == "Failed"
    assert Settings().start_timeout_seconds == 600  # the default docs/operator.md states
    assert decide.decide.__kwdefaults__["start_timeout"] == timedelta(seconds=Settings().start_timeout_seconds)


def test_a_pod_missing_a_secret_waits_for_it_past_the_start_timeout() -> None:
    # docs/bad-input.md: creating the Secret starts the same attempt, however late.
    _plan, status = pulling(650, waiting="CreateContainerConfigError")
    assert status["phase"] == "Running"
    assert status["reason"] == "CreateContainerConfigError"


def test_a_pod_that_got_its_image_after_all_clears_the_reason() -> None:
    _plan, status = pulling(300, waiting=None, reason="ImagePullBackOff")
    assert status["phase"] == "Running"
    assert "reason" not in status
    progressing = next(c for c in status["conditions"] if c["type"] == "Progressing")
    assert progressing["reason"] == "Running"


def test_a_retried_run_leaves_the_reason_of_its_failure_behind() -> None:
    failed = {"phase": "Failed", "reason": "ImagePullFailed", "message": "ImagePullFailed: ...",
              "completionTime": at(600)}
    annotations = {api.ANNOTATION_RETRY: "r1"}
    _plan, status = plan_for(body(failed, annotations=annotations), seconds=700)
    assert status["phase"] == "Pending"
    assert "reason" not in status


def upgrade(image: str, by: str = "dana", **extra: Any) -> dict[str, str]:
    return {api.ANNOTATION_UPGRADE: json.dumps({"image": image, "by": by, **extra})}


WAITING = {"phase": "Waiting", "waitingFor": {"event": "go", "since": at(0)}, "pin": {"image": DIGEST}}


def asked(annotations: dict[str, str], status: dict[str, Any] = WAITING) -> dict[str, Any]:
    """The run once the operator took the request up: its check in flight (and the status that says so)."""
    plan, written = plan_for(body(status, annotations=annotations))
    assert plan.create_check_pod, plan
    assert written["upgradeCheck"]["state"] == "Checking"
    return body(written, annotations=annotations)


def check_pod(run: dict[str, Any], *, exit_code: int | None = None, message: str = "", image_id: str = NEWER,
              waiting: str | None = None) -> dict[str, Any]:
    """The check pod as its kubelet reports it: still running, ended with ``exit_code``, or unable to start."""
    pod = builders.check_pod(run, Settings())
    state: dict[str, Any] = {"running": {"startedAt": at(150)}}
    if exit_code is not None:
        state = {"terminated": {"exitCode": exit_code, "message": message, "finishedAt": at(190)}}
    if waiting:
        state = {"waiting": {"reason": waiting, "message": "pull access denied"}}
    pod["metadata"]["uid"] = "c1"
    pod["status"] = {"phase": "Running", "containerStatuses": [{"name": "runner", "state": state,
                                                                "imageID": image_id if exit_code is not None else ""}]}
    return pod


def test_an_upgrade_is_checked_by_the_operators_own_pod_before_anything_moves() -> None:
    annotations = upgrade("localhost/wf:v2")
    # A settled run wakes for the request (the reconciler leaves a run alone until quiet_until).
    assert decide.quiet_until(decide.RunView.from_body(body(WAITING, annotations=annotations))) is None
    plan, status = plan_for(body(WAITING, annotations=annotations))
    assert status["pin"] == {"image": DIGEST}  # nothing moves on the annotation's word
    assert status["upgradeCheck"] == {"request": annotations[api.ANNOTATION_UPGRADE], "image": "localhost/wf:v2",
                                      "by": "dana", "dryRun": False, "state": "Checking", "startTime": at(200)}
    assert plan.create_check_pod
    assert not plan.upgraded
    [(_, reason, message)] = plan.events
    assert reason == "UpgradeChecking"
    assert "dana" in message
    condition = next(c for c in status["conditions"] if c["type"] == "UpgradeReplays")
    assert (condition["status"], condition["reason"]) == ("Unknown", "Checking")
    assert status["phase"] == "Waiting"

    run = body(status, annotations=annotations)
    pod = builders.check_pod(run, Settings())
    runner = pod["spec"]["containers"][0]
    assert runner["image"] == "localhost/wf:v2"
    assert runner["command"] == ["durablerun", "replay", "m:f", "--kubernetes", "ns/run"]
    assert pod["metadata"]["name"] == builders.check_pod_name("run", annotations[api.ANNOTATION_UPGRADE])
    assert pod["metadata"]["labels"][api.LABEL_RUN] == "run"
    assert api.LABEL_EPOCH not in pod["metadata"]["labels"]
    assert "finalizers" not in pod["metadata"]
    assert pod["spec"]["serviceAccountName"] == api.RUNNER_ACCOUNT
    assert runner["securityContext"]["readOnlyRootFilesystem"]
    assert runner["securityContext"]["runAsNonRoot"]
    assert not any(e["name"] == api.Env.EPOCH for e in runner["env"])  # no attempt: it may write nothing
    secret = body(status, spec={"checkpoint": {"uri": "s3://bucket/runs", "credentialsSecret": "s3"}})
    assert any(e.get("valueFrom", {}).get("secretKeyRef", {}).get("name") == "s3"  # the run's own credentials
               for e in builders.check_pod(secret, Settings())["spec"]["containers"][0]["env"])
    # While it runs: nothing to do but wait for it (its pod's changes wake the run).
    assert plan_for(run, [check_pod(run)], seconds=210)[0].empty


def test_a_clean_replay_moves_the_pin_once_naming_who_asked_and_the_verdict() -> None:
    run = asked(upgrade("localhost/wf:v2"))
    plan, status = plan_for(run, [check_pod(run, exit_code=0, message="run ns/run replays cleanly: 4 journal records")],
                            seconds=250)
    value = run["metadata"]["annotations"][api.ANNOTATION_UPGRADE]
    assert status["pin"] == {"image": NEWER, "since": at(250), "by": "dana", "previous": DIGEST, "request": value}
    assert status["upgradeCheck"]["state"] == "Replays"
    assert status["upgradeCheck"]["digest"] == NEWER
    assert plan.upgraded
    assert plan.delete_pods == [builders.check_pod_name("run", value)]
    [(_, reason, message)] = plan.events
    assert reason == "Upgraded"
    assert message.startswith(f"dana moved the run from {DIGEST} to {NEWER}: localhost/wf:v2 ({NEWER}) replayed")
    assert "replays cleanly: 4 journal records" in message
    assert status["phase"] == "Waiting"  # the next attempt runs the new code; nothing starts now
    done = body(status, annotations=run["metadata"]["annotations"])
    assert plan_for(done, seconds=260)[0].empty  # acted on once
    assert decide.quiet_until(decide.RunView.from_body(done)) is not None


def test_a_divergent_image_is_refused_naming_the_first_divergent_step_and_the_pin_stays() -> None:
    # Written by hand, naming a digest: the operator checks it all the same.
    run = asked(upgrade(NEWER, by="mallory"))
    divergence = ("run ns/run diverges at journal position 1: the journal holds step 'draft', the code asks for "
                  "step 'outline' (journal layout v3 records no argument fingerprints). Guard the change with "
                  "ctx.patched (docs/sdk.md)")
    plan, status = plan_for(run, [check_pod(run, exit_code=1, message=f"loading...\n{divergence}\n")], seconds=250)
    assert status["pin"] == {"image": DIGEST}
    assert status["upgradeCheck"]["state"] == "Refused"
    assert status["upgradeCheck"]["message"] == f"{NEWER} does not replay the journal: {divergence}"
    assert not plan.upgraded
    [(kind, reason, message)] = plan.events
    assert (kind, reason) == ("Warning", "UpgradeRefused")
    assert "step 'outline'" in message
    assert message.endswith(f"the run stays on {DIGEST}")
    condition = next(c for c in status["conditions"] if c["type"] == "UpgradeReplays")
    assert (condition["status"], condition["reason"]) == ("False", "Refused")
    assert "step 'outline'" in condition["message"]
    assert plan_for(body(status, annotations=run["metadata"]["annotations"]), seconds=260)[0].empty


def test_a_dry_run_reports_a_clean_replay_and_moves_nothing() -> None:
    run = asked(upgrade("localhost/wf:v2", dryRun=True))
    plan, status = plan_for(run, [check_pod(run, exit_code=0, message="replays cleanly")], seconds=250)
    assert status["pin"]["image"] == DIGEST
    assert status["upgradeCheck"]["state"] == "Replays"
    assert not plan.upgraded
    assert [reason for _, reason, _ in plan.events] == ["UpgradeChecked"]


@pytest.mark.parametrize(("pod", "why"), [
    ({"waiting": "ErrImagePull"}, "localhost/wf:v2 cannot start: ErrImagePull"),
    ({"exit_code": 0, "image_id": ""}, "the node reported no digest"),
    ({"exit_code": 137}, "the replayer exited 137"),
])
def test_a_check_that_cannot_vouch_for_the_image_refuses_it(pod: dict[str, Any], why: str) -> None:
    run = asked(upgrade("localhost/wf:v2"))
    plan, status = plan_for(run, [check_pod(run, **pod)], seconds=250)
    assert status["pin"]["image"] == DIGEST
    assert status["upgradeCheck"]["state"] == "Refused"
    assert why in status["upgradeCheck"]["message"]
    assert [reason for _, reason, _ in plan.events] == ["UpgradeRefused"]


def test_a_check_that_never_ends_is_refused_after_its_timeout() -> None:
    run = asked(upgrade("localhost/wf:v2"))
    assert plan_for(run, [check_pod(run)], seconds=700)[0].empty
    _plan, status = plan_for(run, [check_pod(run)], seconds=200 + 601)
    assert status["upgradeCheck"]["state"] == "Refused"
    assert "did not finish in 10m" in status["upgradeCheck"]["message"]


def test_a_check_pod_the_api_server_refuses_refuses_the_upgrade_at_once_and_one_that_may_pass_is_made_again() -> None:
    run = asked(upgrade("localhost/wf:v2"))
    name = builders.check_pod_name("run", upgrade("localhost/wf:v2")[api.ANNOTATION_UPGRADE])
    # Quota or throttling: made again, until the check's timeout.
    plan, status = plan_for(run, [], seconds=210, create_failure=decide.CreateFailure(name, "exceeded quota", False))
    assert plan.create_check_pod
    assert status["upgradeCheck"]["state"] == "Checking"
    # Forbidden or invalid: refused now, with the API server's reason (an attempt's failure is not the check's).
    refusal = 'pods "x" is forbidden: violates PodSecurity "restricted:latest"'
    plan, status = plan_for(run, [], seconds=210, create_failure=decide.CreateFailure("run-a9", refusal, True))
    assert plan.create_check_pod
    plan, status = plan_for(run, [], seconds=210, create_failure=decide.CreateFailure(name, refusal, True))
    assert not plan.create_check_pod
    assert status["upgradeCheck"]["state"] == "Refused"
    assert f"check pod {name} cannot be created: {refusal}" in status["upgradeCheck"]["message"]
    assert status["pin"]["image"] == DIGEST


def test_no_attempt_starts_while_a_check_runs_and_a_running_run_is_refused() -> None:
    pending = {"phase": "Pending", "epoch": 3, "attempt": 2, "pin": {"image": DIGEST}}
    run = asked(upgrade("localhost/wf:v2"), pending)
    plan, status = plan_for(run, [check_pod(run)], seconds=210)
    assert plan.create_pod_epoch is None, plan
    assert "waiting for the check of localhost/wf:v2" in status["message"]
    plan, status = plan_for(body(running(pin={"image": DIGEST}), annotations=upgrade("localhost/wf:v2")),
                            [pod_that_ran(DIGEST)], seconds=120)
    assert status["upgradeCheck"]["state"] == "Refused"
    assert "is Running" in status["upgradeCheck"]["message"]
    assert not plan.create_check_pod


def test_an_upgrade_waits_for_the_first_pin() -> None:
    plan, status = plan_for(body({"phase": "Waiting", "waitingFor": {"event": "go", "since": at(0)}},
                                 annotations=upgrade(NEWER)))
    assert "pin" not in status
    assert plan.empty


@pytest.mark.parametrize(("value", "why"), [
    ("localhost/wf:v2", "not a JSON object"),
    (json.dumps({"image": "localhost/wf v2"}), "is not an image reference"),
    (json.dumps({"image": NEWER, "dryRun": "yes"}), "dryRun 'yes' is not true or false"),
])
def test_a_malformed_upgrade_request_is_refused_once_and_changes_nothing(value: str, why: str) -> None:
    plan, status = plan_for(body(WAITING, annotations={api.ANNOTATION_UPGRADE: value}))
    assert status["pin"] == {"image": DIGEST}
    assert status["upgradeCheck"]["state"] == "Refused"
    assert not plan.upgraded
    assert not plan.create_check_pod
    [(kind, reason, message)] = plan.events
    assert (kind, reason) == ("Warning", "UpgradeRefused")
    assert why in message
    assert plan_for(body(status, annotations={api.ANNOTATION_UPGRADE: value}))[0].empty
