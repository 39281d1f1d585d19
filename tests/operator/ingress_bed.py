"""The webhook ingress on the test bed, as the chart renders it: its ServiceAccount, Role, keys Secret and
ValidatingAdmissionPolicy applied from `helm template`, the process running with a real token of that account.
The fixture is tests/operator/conftest.py's ``ingress``."""

from __future__ import annotations

import base64
import json
import sys
import urllib.error
import urllib.request
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from durablerun import webhooks
from durablerun_testbed import procs
from durablerun_testbed.testbed import TestBed
from tests.helpers.clis import Helm, dump, service_account_kubectl
from tests.helpers.session import SESSION_ID

RUN_SECRET = "run-hooks"  # the Secret a run names in spec.webhook: the chart's webhooks.sourceSecrets
# The runs' store credentials (tests.helpers.runs): the chart's webhooks.streams.storeSecrets.
STORE_SECRET = "s3-credentials"


@dataclass
class Ingress:
    url: str
    metrics_url: str
    account: str
    namespace: str
    kubeconfig: Path
    pid: int

    def post(self, path: str, body: bytes, headers: dict[str, str] | None = None) -> tuple[int, dict[str, Any]]:
        request = urllib.request.Request(self.url + path, data=body, method="POST",
                                         headers={"Content-Type": "application/json", **(headers or {})})
        try:
            with urllib.request.urlopen(request, timeout=30) as reply:
                return reply.status, json.loads(reply.read())
        except urllib.error.HTTPError as error:
            return error.code, json.loads(error.read())

    def metrics(self) -> str:
        with urllib.request.urlopen(self.metrics_url, timeout=10) as reply:
            return str(reply.read().decode())

    def open_streams(self) -> float:
        """The ingress's Server-Sent Events connections open now, as its /metrics says."""
        line = next(line for line in self.metrics().splitlines() if line.startswith("durablerun_stream_connections "))
        return float(line.rsplit(" ", 1)[1])

    def outcomes(self) -> dict[str, float]:
        text = self.metrics()
        found: dict[str, float] = {}
        for line in text.splitlines():
            if line.startswith("durablerun_webhook_requests_total{"):
                outcome = line.split('outcome="')[1].split('"')[0]
                found[outcome] = float(line.rsplit(" ", 1)[1])
        return found


def run_ingress(testbed: TestBed, testbed_root: Path, namespace: str, tmp_path: Path,
                limits: list[str]) -> Iterator[Ingress]:
    """The chart's webhook objects applied to the test bed, and the ingress running as its ServiceAccount
    with the flags ``limits``."""
    port, metrics_port = procs.free_port(), procs.free_port()
    url = f"http://127.0.0.1:{port}"
    release = "wh-" + uuid.uuid4().hex[:6]
    helm = Helm(tmp_path / "helm")
    (tmp_path / "helm").mkdir()
    rendered = helm.template(release, namespace, {"webhooks": {"enabled": True, "url": url,
                                                               "namespaces": [namespace],
                                                               "sourceSecrets": [RUN_SECRET],
                                                               "streams": {"storeSecrets": [STORE_SECRET]}}},
                             "--show-only", "templates/webhooks.yaml")
    wanted = [o for o in rendered if o["kind"] in ("ServiceAccount", "Role", "RoleBinding", "Secret",
                                                    "ClusterRole", "ClusterRoleBinding",
                                                    "ValidatingAdmissionPolicy", "ValidatingAdmissionPolicyBinding")]
    testbed.kubectl("apply", "-f", "-", input=dump(wanted))
    account = next(o for o in wanted if o["kind"] == "ServiceAccount")["metadata"]["name"]
    as_ingress = service_account_kubectl(testbed, account, namespace, tmp_path)
    process = procs.ManagedProcess(
        "webhooks", [sys.executable, "-m", "durablerun_operator.ingress", "--namespace", namespace,
                     "--address", "127.0.0.1", "--port", str(port), "--metrics-port", str(metrics_port),
                     *limits],
        log_path=testbed_root / "logs" / f"webhooks-{release}.log",
        env={**testbed.env(), "KUBECONFIG": str(as_ingress.kubeconfig)}, testbed_id=SESSION_ID)
    server = Ingress(url, f"http://127.0.0.1:{metrics_port}/metrics", account, namespace, as_ingress.kubeconfig,
                     process.pid)

    def healthy() -> bool:
        process.check_alive()
        try:
            with urllib.request.urlopen(url + "/healthz", timeout=2) as reply:
                return bool(reply.status == 200)
        except OSError:
            return False

    procs.wait_for(healthy, timeout=30, what="the webhook ingress's /healthz")
    yield server
    process.stop()
    for policy in ("validatingadmissionpolicybinding", "validatingadmissionpolicy", "clusterrolebinding",
                   "clusterrole"):
        testbed.kubectl("delete", policy, f"{release}-durable-run-webhooks", "--ignore-not-found", check=False)


def keys_of(testbed: TestBed, namespace: str) -> tuple[str, dict[str, bytes]]:
    secret = json.loads(testbed.kubectl("get", "secret", "durablerun-webhook-keys", "-n", namespace,
                                        "-o", "json").stdout)
    return webhooks.load_keys({k: base64.b64decode(v) for k, v in secret["data"].items()})
