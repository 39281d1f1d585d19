"""A real Kueue manager (``cmd/kueue``, hack/build-binaries.sh kueue) against the test bed's API server.

Nothing of Kueue is stubbed; what differs from its release manifests is only where things listen, since the
bed has no kube-proxy and the manager runs as a process, not a pod:

- Its CRDs, webhook configurations and certificate Secret come from the Kueue module's own source
  (``config/components/{crd,webhook,internalcert}``, named as its release names them: ``kueue-`` prefix,
  namespace ``kueue-system``). Each webhook and the five conversion webhooks point at
  ``https://127.0.0.1:<port>`` instead of the ``kueue-webhook-service`` Service.
- Only the webhooks of Kueue's own API (``kueue.x-k8s.io``) are installed: those of its Job, Pod, Deployment...
  integrations would put every pod of every test behind the manager, and the bed runs none of them.
- Kueue's internal certificate management stays on (with it off, the manager reads its metrics certificate
  from a fixed /etc/kueue path). Its rotator keeps a Secret whose certificates are valid 90 days ahead; the bed
  seeds it with a CA of its own (named ``kueue-ca``, as the rotator's) and a serving certificate for both the
  Service's DNS name and 127.0.0.1, so the API server can call the webhooks by IP. The rotator then injects
  that CA into the webhook configurations and the CRDs' conversion webhooks, as it does in a cluster. The
  same files are in the manager's certificate directory, where a pod would have the Secret mounted.
- The on-demand visibility API (pending workloads and their positions) is served, as an aggregated API: the
  APIServices ``v1beta1``/``v1beta2.visibility.kueue.x-k8s.io`` from Kueue's ``config/components/visibility``
  point at its Service, which here is an ExternalName Service to ``localhost`` (the API server refuses loopback
  Endpoints; for an ExternalName Service it dials the name at the APIService's port). The server's
  certificate is seeded in its certificate directory, signed by the same ``kueue-ca`` and naming the Service,
  so the APIServices carry that CA instead of the release's ``insecureSkipTLSVerify``. That directory is
  ``visibility`` under the manager's working directory (the bed's): hack/build-binaries.sh sets Kueue's
  ``certDir``, a fixed ``/visibility`` on the host otherwise. The API server's aggregation layer (front-proxy
  certificates) is the bed's control plane's.
- Every port (webhooks, visibility, health, metrics) is on 127.0.0.1; leader election is off (one manager).
- The manager runs as its release's identity, not as the bed's admin: the ServiceAccount
  ``kueue-controller-manager`` bound to the manager's roles from ``config/components/rbac`` (RBAC), with a
  token from the TokenRequest API in its kubeconfig, as a pod would have it mounted. Nothing more is granted:
  Kueue reads no DurableRun (an external framework's objects are its controller's, this operator's), so
  ``tests/kueue/`` passing with it shows that least privilege suffices.
"""

from __future__ import annotations

import base64
import functools
import json
import os
import subprocess
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from durablerun import api
from durablerun_testbed import binaries, procs

NAMESPACE = "kueue-system"
SERVICE = "kueue-webhook-service"
SECRET = "kueue-webhook-server-cert"
GROUP = "kueue.x-k8s.io"
#: The CRDs whose conversion webhook Kueue serves (config/components/crd/kustomization.yaml's patches).
CONVERTED = ("localqueues", "clusterqueues", "cohorts", "workloads", "multikueueclusters")
SERVICE_ACCOUNT = "kueue-controller-manager"
#: The visibility API's Service, as Kueue's release names it (config/components/visibility, prefix ``kueue-``).
VISIBILITY_SERVICE = "kueue-visibility-server"
VISIBILITY_GROUP = f"visibility.{GROUP}"
#: The manager's own RBAC in Kueue's release (config/components/rbac/kustomization.yaml), and of the roles it
#: ships for users (job editors, queue viewers...) the two that read the visibility API's pending workloads.
MANAGER_RBAC = ("service_account", "role", "role_binding", "leader_election_role", "leader_election_role_binding",
                "manager_secrets_role", "manager_secrets_role_binding", "metrics_auth_role",
                "metrics_auth_role_binding", "pending_workloads_cq_viewer_role",
                "pending_workloads_lq_viewer_role")
#: How a DurableRun is named to Kueue as an external framework: Kind.version.group.
EXTERNAL_FRAMEWORK = f"{api.KIND}.{api.VERSION}.{api.GROUP}"

Kubectl = Callable[..., subprocess.CompletedProcess[str]]


def module_dir() -> Path:
    """Where the Go module cache holds Kueue's source at the pinned version (downloading it if missing)."""
    version = binaries.versions()["KUEUE_VERSION"]
    env = dict(os.environ, GOFLAGS="-mod=mod", GOTOOLCHAIN="local")
    result = subprocess.run(["go", "mod", "download", "-json", f"sigs.k8s.io/kueue@{version}"],
                            capture_output=True, text=True, check=True, env=env)
    return Path(json.loads(result.stdout)["Dir"])


@dataclass
class Kueue:
    workdir: Path
    testbed_id: str
    kubeconfig: Path
    process: procs.ManagedProcess | None = None
    webhook_port: int = 0
    health_port: int = 0
    metrics_port: int = 0
    visibility_port: int = 0
    #: The manager's own credentials (its ServiceAccount's token), once ``start`` made them.
    manager_kubeconfig: Path | None = None

    @property
    def webhook_url(self) -> str:
        return f"https://127.0.0.1:{self.webhook_port}"

    def start(self, kubectl: Kubectl) -> Kueue:
        """Install Kueue's CRDs, webhooks and Secret with ``kubectl`` (the bed's), start the manager, wait
        until it is ready (certificates in place, webhooks served)."""
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.webhook_port, self.health_port, self.metrics_port, self.visibility_port = (
            procs.free_port() for _ in range(4))
        source = module_dir() / "config" / "components"
        kubectl("create", "namespace", NAMESPACE, check=False)
        documents = [*self._crds(source), self._secret(), *self._webhooks(source), *self._rbac(source),
                     *self._visibility(source)]
        kubectl("apply", "--server-side", "--force-conflicts", "-f", "-",
                input=yaml.safe_dump_all(documents), timeout=120)
        established = 'jsonpath={.status.conditions[?(@.type=="Established")].status}'

        def is_established(crd: str) -> bool:
            return kubectl("get", "crd", crd, "-o", established, check=False).stdout == "True"

        for crd in (doc["metadata"]["name"] for doc in documents if doc["kind"] == "CustomResourceDefinition"):
            procs.wait_for(functools.partial(is_established, crd), timeout=120,
                           what=f"Kueue's CRD {crd} to be established")
        self.manager_kubeconfig = self._manager_kubeconfig(kubectl)
        self.launch()
        return self

    def _rbac(self, source: Path) -> Iterator[dict[str, Any]]:
        """The manager's release RBAC, named as Kueue's kustomization names it (prefix ``kueue-``, namespace
        ``kueue-system``)."""
        for name in MANAGER_RBAC:
            for doc in yaml.safe_load_all((source / "rbac" / f"{name}.yaml").read_text()):
                if not doc:
                    continue
                doc["metadata"]["name"] = "kueue-" + doc["metadata"]["name"]
                if "namespace" in doc["metadata"]:
                    doc["metadata"]["namespace"] = NAMESPACE
                if "roleRef" in doc:
                    doc["roleRef"]["name"] = "kueue-" + doc["roleRef"]["name"]
                for subject in doc.get("subjects") or []:
                    subject.update(name="kueue-" + subject["name"], namespace=NAMESPACE)
                yield doc

    def _manager_kubeconfig(self, kubectl: Kubectl) -> Path:
        """The bed's kubeconfig with the manager's ServiceAccount token instead of the admin's credentials."""
        token = kubectl("create", "token", SERVICE_ACCOUNT, "-n", NAMESPACE, "--duration=48h").stdout.strip()
        config = yaml.safe_load(self.kubeconfig.read_text())
        config["users"] = [{"name": SERVICE_ACCOUNT, "user": {"token": token}}]
        for context in config["contexts"]:
            context["context"]["user"] = SERVICE_ACCOUNT
        path = self.workdir / "kueue-kubeconfig.yaml"
        path.touch(mode=0o600)
        path.write_text(yaml.safe_dump(config))
        return path

    def launch(self) -> None:
        """Start the manager (again, after ``stop``: same ports and configuration) and wait until it is ready."""
        config_path = self.workdir / "kueue-config.yaml"
        config_path.write_text(yaml.safe_dump(self.configuration()))
        self.process = procs.ManagedProcess(
            "kueue", [str(binaries.find("kueue")), f"--config={config_path}",
                      f"--kubeconfig={self.manager_kubeconfig or self.kubeconfig}"],
            log_path=self.workdir / "kueue.log", cwd=self.workdir, testbed_id=self.testbed_id)
        try:
            procs.wait_for(self._ready, timeout=120, interval=0.5,
                           what=f"the Kueue manager to be ready (log {self.workdir}/kueue.log)")
        except BaseException:
            self.process.stop()
            raise

    def configuration(self) -> dict[str, Any]:
        return {
            "apiVersion": "config.kueue.x-k8s.io/v1beta2",
            "kind": "Configuration",
            "namespace": NAMESPACE,
            "health": {"healthProbeBindAddress": f"127.0.0.1:{self.health_port}"},
            "metrics": {"bindAddress": f"127.0.0.1:{self.metrics_port}"},
            "webhook": {"host": "127.0.0.1", "port": self.webhook_port, "certDir": str(self.workdir / "certs")},
            "leaderElection": {"leaderElect": False},
            "internalCertManagement": {"enable": True, "webhookServiceName": SERVICE, "webhookSecretName": SECRET},
            "visibilityServer": {"bindAddress": "127.0.0.1", "bindPort": self.visibility_port},
            "integrations": {"frameworks": ["batch/job"], "externalFrameworks": [EXTERNAL_FRAMEWORK]},
        }

    def _crds(self, source: Path) -> Iterator[dict[str, Any]]:
        for path in sorted((source / "crd" / "bases").glob("*.yaml")):
            crd: dict[str, Any] = yaml.safe_load(path.read_text())
            if crd["spec"]["names"]["plural"] in CONVERTED:
                crd["spec"]["conversion"] = {"strategy": "Webhook", "webhook": {
                    "clientConfig": {"url": f"{self.webhook_url}/convert"}, "conversionReviewVersions": ["v1"]}}
            yield crd

    def _webhooks(self, source: Path) -> Iterator[dict[str, Any]]:
        for configuration in yaml.safe_load_all((source / "webhook" / "manifests.yaml").read_text()):
            configuration["metadata"]["name"] = "kueue-" + configuration["metadata"]["name"]
            hooks = [hook for hook in configuration["webhooks"]
                     if all(GROUP in rule["apiGroups"] for rule in hook["rules"])]
            for hook in hooks:
                hook["clientConfig"] = {"url": self.webhook_url + hook["clientConfig"]["service"]["path"]}
            configuration["webhooks"] = hooks
            yield configuration

    def _visibility(self, source: Path) -> Iterator[dict[str, Any]]:
        """Kueue's visibility component: its APIServices (with the bed's CA, at the server's port), its Service
        (ExternalName ``localhost``), and the binding that lets the manager read the API server's
        requestheader CA (kube-system's extension-apiserver-authentication), named as its release names them."""
        ca = base64.b64encode((self.workdir / "seed" / "ca.crt").read_bytes()).decode()
        for version in ("v1beta1", "v1beta2"):
            apiservice: dict[str, Any] = yaml.safe_load(
                (source / "visibility" / f"apiservice_{version}.yaml").read_text())
            spec = apiservice["spec"]
            del spec["insecureSkipTLSVerify"]
            spec.update(caBundle=ca, service={"name": VISIBILITY_SERVICE, "namespace": NAMESPACE,
                                              "port": self.visibility_port})
            yield apiservice
        service: dict[str, Any] = yaml.safe_load((source / "visibility" / "service.yaml").read_text())
        service["metadata"]["name"] = VISIBILITY_SERVICE
        service["spec"] = {"type": "ExternalName", "externalName": "localhost"}
        yield service
        binding: dict[str, Any] = yaml.safe_load((source / "visibility" / "role_binding.yaml").read_text())
        binding["metadata"]["name"] = "kueue-" + binding["metadata"]["name"]  # stays in kube-system
        binding["subjects"] = [{"kind": "ServiceAccount", "name": SERVICE_ACCOUNT, "namespace": NAMESPACE}]
        yield binding

    def visibility_ready(self, kubectl: Kubectl) -> bool:
        """Whether the API server reaches the visibility API (its APIService is Available)."""
        available = 'jsonpath={.status.conditions[?(@.type=="Available")].status}'
        answer = kubectl("get", "apiservice", f"v1beta2.{VISIBILITY_GROUP}", "-o", available, check=False)
        return answer.stdout == "True"

    def _secret(self) -> dict[str, Any]:
        """The rotator's Secret, seeded with certificates that also name 127.0.0.1 (see the module docstring),
        and the visibility server's certificate, signed by the same CA."""
        certs = self.workdir / "seed"
        certs.mkdir(parents=True, exist_ok=True)
        ca_key, ca = certs / "ca.key", certs / "ca.crt"
        # PKCS#1 keys (-traditional): the rotator parses nothing else. A year: it replaces anything that expires
        # within 90 days.
        _openssl("genrsa", "-traditional", "-out", str(ca_key), "2048")
        _openssl("req", "-x509", "-new", "-key", str(ca_key), "-out", str(ca), "-days", "365",
                 "-subj", "/O=kueue/CN=kueue-ca", "-addext", "subjectAltName=DNS:kueue-ca",
                 "-addext", "basicConstraints=critical,CA:TRUE",
                 "-addext", "keyUsage=critical,digitalSignature,keyEncipherment,keyCertSign")
        _issue(certs, "tls", f"{SERVICE}.{NAMESPACE}.svc", ca)
        # Where the visibility server looks first (apiserver.crt/.key in its certificate directory) before it
        # would make a self-signed pair for "localhost" alone.
        _issue(self.workdir / "visibility", "apiserver", f"{VISIBILITY_SERVICE}.{NAMESPACE}.svc", ca)
        mounted = self.workdir / "certs"
        mounted.mkdir(parents=True, exist_ok=True)
        data = {name: (certs / name).read_text() for name in ("ca.crt", "ca.key", "tls.crt", "tls.key")}
        for name, text in data.items():
            (mounted / name).write_text(text)
            (mounted / name).chmod(0o600)
        return {"apiVersion": "v1", "kind": "Secret", "type": "Opaque",
                "metadata": {"name": SECRET, "namespace": NAMESPACE}, "stringData": data}

    def _ready(self) -> bool:
        assert self.process
        self.process.check_alive()
        with urllib.request.urlopen(f"http://127.0.0.1:{self.health_port}/readyz", timeout=2) as response:
            return bool(response.status == 200)

    def check_alive(self) -> None:
        if self.process is not None:
            self.process.check_alive()

    def stop(self) -> None:
        if self.process is not None:
            self.process.stop()


def _openssl(*args: str) -> None:
    subprocess.run(["openssl", *args], check=True, capture_output=True)


def _issue(directory: Path, stem: str, dns_name: str, ca: Path) -> None:
    """``directory/stem.crt`` and ``.key``: a serving certificate for ``dns_name`` and 127.0.0.1, signed by
    ``ca`` (its key beside it, ``ca.key``)."""
    directory.mkdir(parents=True, exist_ok=True)
    key, csr, cert, ext = (directory / f"{stem}.{suffix}" for suffix in ("key", "csr", "crt", "ext"))
    _openssl("genrsa", "-traditional", "-out", str(key), "2048")
    key.chmod(0o600)
    _openssl("req", "-new", "-key", str(key), "-out", str(csr), "-subj", f"/CN={dns_name}")
    ext.write_text(f"subjectAltName=DNS:{dns_name},IP:127.0.0.1\n"
                   "extendedKeyUsage=serverAuth\nkeyUsage=critical,digitalSignature,keyEncipherment\n")
    _openssl("x509", "-req", "-in", str(csr), "-CA", str(ca), "-CAkey", str(ca.with_name("ca.key")),
             "-CAcreateserial", "-out", str(cert), "-days", "365", "-extfile", str(ext))
