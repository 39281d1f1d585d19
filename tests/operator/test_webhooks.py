"""The webhook ingress on the test bed: real HTTP over loopback, the chart's RBAC and admission policy.

The ingress (tests/operator/ingress_bed.py) runs as the chart renders it would (its ServiceAccount, Role, keys
Secret and ValidatingAdmissionPolicy applied from `helm template`), with a real token of that ServiceAccount;
the operator hands runners the ingress's URL, and a workflow's ``ctx.webhook_url`` is POSTed to.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import time
import uuid
from collections import Counter
from collections.abc import Callable
from typing import Any

import pytest

from durablerun import api, webhooks
from durablerun_operator.ingress import auth
from durablerun_testbed import procs
from durablerun_testbed.testbed import TestBed
from tests.helpers.clis import Kubectl
from tests.helpers.runs import RunEnv, StartOperator
from tests.operator.ingress_bed import RUN_SECRET, Ingress, keys_of


def _url_of(runs: RunEnv) -> str:
    return procs.wait_for(lambda: next((line.split(" ", 1)[1] for line in runs.ledger() if line.startswith("url ")),
                                       None), timeout=90, what="the workflow's webhook URL in the ledger")


def test_a_capability_url_wakes_its_waiting_run_once(
        runs: RunEnv, ingress: Ingress, start_operator: StartOperator, testbed: TestBed) -> None:
    start_operator(DURABLERUN_WEBHOOK_URL=ingress.url)
    runs.apply(runs.manifest("hooked", "optest_hooks:hooked"))
    runs.wait_phase("hooked", "Waiting", timeout=90)
    url = _url_of(runs)
    assert url.startswith(ingress.url + "/v1/hooks/")
    path = url[len(ingress.url):]
    token = path.rsplit("/", 1)[1]
    claims = webhooks.read_claims(token)
    assert (claims.namespace, claims.run, claims.event) == (runs.namespace, "hooked", "done")

    # Refused alike, whatever is wrong: tampered, expired, for another run, unknown key.
    current, keys = keys_of(testbed, runs.namespace)
    expired = webhooks.sign(webhooks.Claims(**{**claims.__dict__, "expires": int(time.time()) - 1}), keys[current])
    body, signature = token.split(".")
    other = webhooks.sign(webhooks.Claims(**{**claims.__dict__, "run": "payroll"}), b"x" * 32).split(".")[0]
    for bad in (expired, other + "." + signature, body + "." + signature[:-2] + "AA", "garbage"):
        assert ingress.post(f"/v1/hooks/{bad}", b'{"ok": true}') == (401, {"error": "unauthorized"})
    assert runs.get("hooked")["spec"].get("events", {}) == {}

    # Bad bodies from an authenticated caller name what is wrong and change nothing.
    status, answer = ingress.post(path, b"<xml/>")
    assert status == 415
    assert "not JSON" in answer["error"]
    status, answer = ingress.post(path, b"x" * (256 * 1024 + 1))
    assert status == 413
    assert "262144 bytes" in answer["error"]

    assert ingress.post(path, b'{"approved": true, "by": "ci"}')[0] == 202
    done = runs.wait_phase("hooked", "Succeeded", timeout=90)
    assert done["spec"]["events"] == {"done": {"approved": True, "by": "ci"}}
    # A second delivery changes nothing; another value is refused (events are write-once).
    assert ingress.post(path, b'{"approved": true, "by": "ci"}')[0] == 200
    status, answer = ingress.post(path, b'{"approved": false}')
    assert status == 409
    assert "write-once" in answer["error"]
    assert runs.get("hooked")["spec"]["events"] == {"done": {"approved": True, "by": "ci"}}
    assert any(e["reason"] == "EventReceived" and "capability URL" in e["message"] for e in runs.events("hooked"))
    outcomes = ingress.outcomes()
    assert {k: outcomes[k] for k in ("delivered", "duplicate", "conflict", "unauthorized", "too_large")} == {
        "delivered": 1.0, "duplicate": 1.0, "conflict": 1.0, "unauthorized": 4.0, "too_large": 1.0}


def _sign(secret: bytes, message: bytes) -> str:
    return hmac.new(secret, message, hashlib.sha256).hexdigest()


SIGNERS: dict[str, Callable[[bytes, bytes, int], dict[str, str]]] = {
    "github": lambda secret, body, t: {"X-Hub-Signature-256": "sha256=" + _sign(secret, body)},
    "stripe": lambda secret, body, t: {"Stripe-Signature": f"t={t},v1={_sign(secret, f'{t}.'.encode() + body)}"},
    "hmac": lambda secret, body, t: {auth.HMAC_TIMESTAMP: str(t),
                                     auth.HMAC_SIGNATURE: "sha256=" + _sign(secret, f"{t}.".encode() + body)},
}


@pytest.mark.parametrize("scheme", ["github", "stripe", "hmac"])
def test_a_signed_source_sends_an_event(runs: RunEnv, ingress: Ingress, testbed: TestBed, scheme: str) -> None:
    secret = b"whsec-" + uuid.uuid4().hex.encode()
    source = f"{scheme}.ci"
    testbed.kubectl("create", "secret", "generic", "durablerun-webhook-sources", "-n", runs.namespace,
                    f"--from-literal={source}={secret.decode()}")
    run = runs.manifest("target", "optest_flows:approval")
    run["spec"]["suspend"] = True  # no pod needed: events may arrive before the run waits
    runs.apply(run)
    body = b'{"workflow_run": {"conclusion": "success", "id": 7}}'
    path = f"/v1/namespaces/{runs.namespace}/runs/target/events/review?source={source}&path=workflow_run"
    now = int(time.time())

    wrong = SIGNERS[scheme](b"not-the-secret", body, now)
    assert ingress.post(path, body, wrong) == (401, {"error": "unauthorized"})
    assert ingress.post(path.replace("runs/target", "runs/missing"), body, wrong) == (401, {"error": "unauthorized"})
    if scheme != "github":  # GitHub signs no timestamp; its replays change nothing (write-once)
        old = SIGNERS[scheme](secret, body, now - 600)
        assert ingress.post(path, body, old) == (401, {"error": "unauthorized"})
    status, answer = ingress.post(path.replace("source=", "source=slack"), body, wrong)
    assert status == 400
    assert "<scheme>.<name>" in answer["error"]

    assert ingress.post(path, body, SIGNERS[scheme](secret, body, now))[0] == 202
    assert runs.get("target")["spec"]["events"] == {"review": {"conclusion": "success", "id": 7}}
    status, _ = ingress.post(path.replace("runs/target", "runs/missing"), body, SIGNERS[scheme](secret, body, now))
    assert status == 410
    assert any(e["reason"] == "EventReceived" and source in e["message"] and secret.decode() not in e["message"]
               for e in runs.events("target"))


def test_a_runs_own_source_wins_over_the_namespaces(runs: RunEnv, ingress: Ingress, testbed: TestBed) -> None:
    """spec.webhook names a scheme and a Secret entry: a POST to that run is checked against it, not against the
    namespace's sources Secret; a Secret the chart does not name stays unreadable; a bad scheme never applies."""
    run_secret, namespace_secret = b"run-" + uuid.uuid4().hex.encode(), b"ns-" + uuid.uuid4().hex.encode()
    testbed.kubectl("create", "secret", "generic", RUN_SECRET, "-n", runs.namespace,
                    f"--from-literal=ocr={run_secret.decode()}")
    testbed.kubectl("create", "secret", "generic", api.WEBHOOK_SOURCES_SECRET, "-n", runs.namespace,
                    f"--from-literal=github.ci={namespace_secret.decode()}")
    testbed.kubectl("create", "secret", "generic", "elsewhere", "-n", runs.namespace,
                    f"--from-literal=secret={run_secret.decode()}")
    for name, source in (("scanned", {"scheme": "hmac", "secret": RUN_SECRET, "key": "ocr"}),
                         ("unlisted", {"scheme": "hmac", "secret": "elsewhere"})):
        run = runs.manifest(name, "optest_flows:approval")
        run["spec"].update(suspend=True, webhook=source)  # no pod needed: events may arrive before the run waits
        runs.apply(run)
    body, now = b'{"pages": 12}', int(time.time())
    path = f"/v1/namespaces/{runs.namespace}/runs/scanned/events/review"

    # The namespace's source does not open a run that names its own, even with a valid signature of it.
    assert ingress.post(path + "?source=github.ci", body, SIGNERS["github"](namespace_secret, body, now)) == (
        401, {"error": "unauthorized"})
    assert ingress.post(path, body, SIGNERS["hmac"](b"wrong", body, now)) == (401, {"error": "unauthorized"})
    assert ingress.post(path, body, SIGNERS["hmac"](run_secret, body, now - 600)) == (401, {"error": "unauthorized"})
    # A Secret outside webhooks.sourceSecrets: RBAC keeps it from the ingress, so nothing opens that run.
    other = path.replace("runs/scanned", "runs/unlisted")
    assert ingress.post(other, body, SIGNERS["hmac"](run_secret, body, now)) == (401, {"error": "unauthorized"})
    assert not Kubectl(ingress.kubeconfig).can_i("get", "secrets/elsewhere", runs.namespace)
    assert runs.get("scanned")["spec"].get("events", {}) == {}

    assert ingress.post(path, body, SIGNERS["hmac"](run_secret, body, now))[0] == 202  # no ?source= needed
    assert runs.get("scanned")["spec"]["events"] == {"review": {"pages": 12}}
    assert runs.get("unlisted")["spec"].get("events", {}) == {}
    assert any(e["reason"] == "EventReceived" and "run's webhook source (hmac" in e["message"]
               and run_secret.decode() not in e["message"] for e in runs.events("scanned"))

    # What the ingress cannot honour, the API server refuses at apply time, naming the field.
    bad = runs.manifest("slack", "optest_flows:approval")
    bad["spec"]["webhook"] = {"scheme": "slack", "secret": RUN_SECRET}
    refused = testbed.kubectl("apply", "-f", "-", input=json.dumps(bad), check=False)
    assert refused.returncode != 0
    assert "spec.webhook.scheme" in refused.stderr
    assert '"github", "stripe", "hmac"' in refused.stderr


def test_the_ingress_account_may_only_add_events(runs: RunEnv, ingress: Ingress) -> None:
    run = runs.manifest("guarded", "optest_flows:approval")
    run["spec"]["suspend"] = True
    runs.apply(run)
    as_ingress = Kubectl(ingress.kubeconfig)

    def patch(body: dict[str, Any]) -> str:
        result = as_ingress("patch", "dr", "guarded", "-n", runs.namespace, "--type", "merge", "-p", json.dumps(body),
                            check=False)
        return result.stderr if result.returncode else "allowed"

    assert "may only add events" in patch({"spec": {"suspend": False}})
    assert "may only add events" in patch({"spec": {"workflow": "evil:flow"}})
    assert "labels, annotations or finalizers" in patch({"metadata": {"annotations": {api.ANNOTATION_ABORT: "x"}}})
    assert patch({"spec": {"events": {"review": {"approved": True}}}}) == "allowed"
    assert not as_ingress.can_i("delete", "durableruns", runs.namespace)
    assert not as_ingress.can_i("list", "secrets", runs.namespace)
    assert as_ingress.can_i("get", "secrets/durablerun-webhook-sources", runs.namespace)


@pytest.mark.parametrize("ingress", [["--rate", "2", "--burst", "10", "--failure-rate", "1", "--failure-burst", "20"]],
                         indirect=True)
def test_a_forgers_flood_does_not_throttle_the_runs_real_senders(
        runs: RunEnv, ingress: Ingress, start_operator: StartOperator, testbed: TestBed) -> None:
    """Rate limits count failures against the address they come from and deliveries against the run only once
    they are authentic: a flood of forged tokens and wrong signatures naming a run, from one address, spends
    that address's allowance, not the run's, and the run's real capability URL and GitHub delivery (here from
    the same address, as through one proxy) still go through."""
    secret = b"whsec-" + uuid.uuid4().hex.encode()
    testbed.kubectl("create", "secret", "generic", api.WEBHOOK_SOURCES_SECRET, "-n", runs.namespace,
                    f"--from-literal=github.ci={secret.decode()}")
    start_operator(DURABLERUN_WEBHOOK_URL=ingress.url)
    runs.apply(runs.manifest("hooked", "optest_hooks:hooked"))
    runs.wait_phase("hooked", "Waiting", timeout=90)
    path = _url_of(runs)[len(ingress.url):]
    claims = webhooks.read_claims(path.rsplit("/", 1)[1])

    forged, wrong = Counter[int](), Counter[int]()
    signed_path = f"/v1/namespaces/{runs.namespace}/runs/hooked/events/review?source=github.ci"
    body = b'{"conclusion": "success"}'
    started = time.monotonic()
    for i in range(150):  # the run's every bucket, as today's main counted it, many times over
        token = webhooks.sign(webhooks.Claims(**{**claims.__dict__, "event": f"e{i}"}), uuid.uuid4().bytes * 2)
        forged[ingress.post(f"/v1/hooks/{token}", b"{}")[0]] += 1
        wrong[ingress.post(signed_path, body, SIGNERS["github"](b"guessed", body, 0))[0]] += 1
    elapsed = time.monotonic() - started
    assert set(forged) | set(wrong) == {401, 429}, (forged, wrong)
    # The address's allowance: 20 at once and one a second (both routes share it).
    assert forged[401] + wrong[401] <= 20 + elapsed + 1, (forged, wrong, elapsed)
    assert runs.get("hooked")["spec"].get("events", {}) == {}

    assert ingress.post(signed_path, body, SIGNERS["github"](secret, body, 0))[0] == 202
    assert ingress.post(path, b'{"approved": true}')[0] == 202
    done = runs.wait_phase("hooked", "Succeeded", timeout=90)
    assert done["spec"]["events"] == {"review": {"conclusion": "success"}, "done": {"approved": True}}

    # Authentic deliveries have their own limit per run and source: 10 at once here, then 2 a second.
    answers = Counter(ingress.post(signed_path, body, SIGNERS["github"](secret, body, 0))[0] for _ in range(30))
    assert answers[200] >= 9, answers  # the first was a duplicate: nothing changed
    assert answers[429] >= 10, answers


def test_a_runner_signs_urls_for_its_own_run_only(
        runs: RunEnv, ingress: Ingress, start_operator: StartOperator, testbed: TestBed) -> None:
    """A runner pod holds no namespace key: it gets a key derived for its run from the ingress, with a
    ServiceAccount token bound to the pod. A workflow that signs a URL for another run with it, or asks for the
    other run's key, is refused with the answer any bad token gets; URLs signed with the namespace's key, as
    runners before this change signed them, still work."""
    start_operator(DURABLERUN_WEBHOOK_URL=ingress.url)
    victim = runs.manifest("victim", "optest_flows:approval")
    victim["spec"]["suspend"] = True  # no pod needed: events may arrive before the run waits
    runs.apply(victim)
    uid = runs.get("victim")["metadata"]["uid"]
    runs.apply(runs.manifest("forger", "optest_hooks:forger", input={"victim": "victim", "uid": uid}))
    pod = procs.wait_for(lambda: next(iter(runs.pods("forger")), None), timeout=60, what="the forger's pod")
    runs.wait_phase("forger", "Waiting", timeout=90)
    found = {line.split(" ", 1)[0]: line.split(" ", 1)[1] for line in runs.ledger()}
    assert found["namespace"] == "keys absent"
    assert found["victim"].startswith("key refused")
    assert "HTTP 401" in found["victim"]
    forged = found["forged"][len(ingress.url):]
    assert webhooks.read_claims(forged.rsplit("/", 1)[1]).run == "victim"
    assert ingress.post(forged, b'{"approved": true}') == (401, {"error": "unauthorized"})
    assert ingress.post("/v1/hooks/garbage", b'{"approved": true}') == (401, {"error": "unauthorized"})
    assert runs.get("victim")["spec"].get("events", {}) == {}

    # Nothing of the namespace's keys in the runner's pod: no Secret volume, no variable.
    assert api.WEBHOOK_KEYS_SECRET not in json.dumps(pod["spec"])
    current, keys = keys_of(testbed, runs.namespace)
    assert all(base64.b64encode(k).decode() not in json.dumps(pod) and k.decode() not in json.dumps(pod)
               for k in keys.values())

    # The forger's own URL works: its run's key signs for its run.
    assert ingress.post(found["url"][len(ingress.url):], b'{"approved": true}')[0] == 202
    runs.wait_phase("forger", "Succeeded", timeout=90)

    # A URL from before the upgrade, signed with the namespace's key itself, still opens its run.
    claims = webhooks.Claims(namespace=runs.namespace, run="victim", uid=uid, event="legacy",
                             expires=int(time.time()) + 600, key_id=current)
    assert ingress.post(f"/v1/hooks/{webhooks.sign(claims, keys[current])}", b"1")[0] == 202
    assert runs.get("victim")["spec"]["events"] == {"legacy": 1}
