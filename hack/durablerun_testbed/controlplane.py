"""A real Kubernetes control plane on loopback: etcd, kube-apiserver, kube-controller-manager.

Started the way controller-runtime's envtest starts it, plus the
controller-manager so that Deployments, garbage collection of owned objects,
namespace deletion and ServiceAccounts behave as in a cluster. There is no
scheduler and no kubelet: the process node (``processnode``) plays both. For
the real node (``realnode``) the control plane listens on the node's pod
network instead of loopback, runs kube-scheduler, and gives the kubelet an
identity and the API server a client certificate the kubelet trusts. The API server has the
aggregation layer configured (front-proxy certificates), so an APIService can
add an API served elsewhere: Kueue's visibility API (``kueue``).
"""

from __future__ import annotations

import base64
import secrets
import ssl
import subprocess
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

import yaml

from durablerun_testbed import binaries, procs

ADMIN_USER = "admin"
#: The name in the API server's front-proxy client certificate (kubeadm's): aggregated APIs trust the user named
#: in request headers only from a client with this name.
FRONT_PROXY_CLIENT = "front-proxy-client"


@dataclass
class ControlPlane:
    workdir: Path
    testbed_id: str
    etcd: procs.ManagedProcess | None = None
    apiserver: procs.ManagedProcess | None = None
    controller_manager: procs.ManagedProcess | None = None
    port: int = 0
    admin_token: str = ""
    #: Where kube-apiserver listens. A real node's pods reach it here, so it is
    #: the first address of the service range too: the ``kubernetes`` Service's
    #: ClusterIP, which the kubelet hands to pods, is then the server itself
    #: (there is no kube-proxy).
    address: str = "127.0.0.1"
    service_cidr: str = "10.0.0.0/24"
    #: Node names that get a kubelet identity (user system:node:NAME).
    nodes: tuple[str, ...] = ()
    node_tokens: dict[str, str] = field(default_factory=dict)
    scheduler: procs.ManagedProcess | None = None

    @property
    def url(self) -> str:
        return f"https://{self.address}:{self.port}"

    @property
    def kubeconfig(self) -> Path:
        return self.workdir / "kubeconfig"

    @property
    def ca_file(self) -> Path:
        return self.workdir / "certs" / "apiserver.crt"

    def start(self, *, controller_manager: bool = True, scheduler: bool = False) -> ControlPlane:
        self.workdir.mkdir(parents=True, exist_ok=True)
        logs = self.workdir / "logs"
        self._start_etcd(logs)
        self._start_apiserver(logs)
        self._write_kubeconfig()
        if controller_manager:
            self._start_controller_manager(logs)
        if scheduler:
            self._start_scheduler(logs)
        return self

    def _start_etcd(self, logs: Path) -> None:
        client, peer = procs.free_port(), procs.free_port()
        self.etcd_url = f"http://127.0.0.1:{client}"
        self.etcd = procs.ManagedProcess(
            "etcd",
            [
                str(binaries.find("etcd")),
                "--data-dir", str(self.workdir / "etcd"),
                "--listen-client-urls", self.etcd_url,
                "--advertise-client-urls", self.etcd_url,
                "--listen-peer-urls", f"http://127.0.0.1:{peer}",
                "--initial-advertise-peer-urls", f"http://127.0.0.1:{peer}",
                "--initial-cluster", f"default=http://127.0.0.1:{peer}",
                "--unsafe-no-fsync",
                "--log-level", "warn",
            ],
            log_path=logs / "etcd.log",
            testbed_id=self.testbed_id,
        )
        procs.wait_for(
            lambda: self._etcd_healthy(), timeout=30, what=f"etcd at {self.etcd_url}"
        )

    def _etcd_healthy(self) -> bool:
        assert self.etcd
        self.etcd.check_alive()
        with urllib.request.urlopen(f"{self.etcd_url}/health", timeout=2) as response:
            return b'"health":"true"' in response.read()

    def _start_apiserver(self, logs: Path) -> None:
        certs = self.workdir / "certs"
        certs.mkdir(parents=True, exist_ok=True)
        sa_key = self.workdir / "sa.key"
        if not sa_key.exists():
            subprocess.run(
                ["openssl", "genrsa", "-out", str(sa_key), "2048"],
                check=True, capture_output=True,
            )
        self.admin_token = secrets.token_hex(16)
        lines = [f'{self.admin_token},{ADMIN_USER},admin-uid,"system:masters"']
        for node in self.nodes:
            self.node_tokens[node] = secrets.token_hex(16)
            lines.append(f'{self.node_tokens[node]},system:node:{node},node-{node},"system:nodes"')
        tokens = self.workdir / "tokens.csv"
        tokens.write_text("\n".join(lines) + "\n")
        tokens.chmod(0o600)
        self.port = self.port or procs.free_port()
        kubelet_flags: list[str] = []
        if self.nodes:
            kubelet_flags = [
                "--kubelet-client-certificate", str(self._kubelet_client_cert(certs)),
                "--kubelet-client-key", str(certs / "kubelet-client.key"),
                "--kubelet-preferred-address-types", "InternalIP",
            ]
        self.apiserver = procs.ManagedProcess(
            "kube-apiserver",
            [
                str(binaries.find("kube-apiserver")),
                "--etcd-servers", self.etcd_url,
                "--cert-dir", str(certs),
                "--secure-port", str(self.port),
                "--bind-address", self.address,
                "--advertise-address", self.address,
                "--service-cluster-ip-range", self.service_cidr,
                "--service-account-issuer", self.url,
                "--service-account-key-file", str(sa_key),
                "--service-account-signing-key-file", str(sa_key),
                # Node: a kubelet may read only what its own pods need.
                "--authorization-mode", "Node,RBAC" if self.nodes else "RBAC",
                "--token-auth-file", str(tokens),
                "--allow-privileged=true",
                *kubelet_flags,
                *self._aggregation_flags(certs),
                "--v=1",
            ],
            log_path=logs / "kube-apiserver.log",
            testbed_id=self.testbed_id,
        )
        procs.wait_for(self._apiserver_ready, timeout=60, what=f"kube-apiserver at {self.url}")

    def _aggregation_flags(self, certs: Path) -> list[str]:
        """The aggregation layer, as kubeadm configures it: a front-proxy CA of the bed's own and, signed by it,
        the client certificate the API server presents when it proxies a request to an aggregated API (Kueue's
        visibility API), with the user in headers that API trusts only from that certificate's name."""
        def openssl(*args: str) -> None:
            subprocess.run(["openssl", *args], check=True, capture_output=True)

        ca_key, ca, key, csr, cert = (certs / name for name in (
            "front-proxy-ca.key", "front-proxy-ca.crt", "front-proxy-client.key", "front-proxy-client.csr",
            "front-proxy-client.crt"))
        if not cert.exists():
            openssl("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", str(ca_key), "-out", str(ca),
                    "-days", "30", "-subj", "/CN=durablerun-testbed-front-proxy-ca")
            openssl("req", "-newkey", "rsa:2048", "-nodes", "-keyout", str(key), "-out", str(csr),
                    "-subj", f"/CN={FRONT_PROXY_CLIENT}")
            openssl("x509", "-req", "-in", str(csr), "-CA", str(ca), "-CAkey", str(ca_key), "-CAcreateserial",
                    "-out", str(cert), "-days", "30")
        return [
            "--requestheader-client-ca-file", str(ca),
            "--requestheader-allowed-names", FRONT_PROXY_CLIENT,
            "--requestheader-username-headers", "X-Remote-User",
            "--requestheader-group-headers", "X-Remote-Group",
            "--requestheader-extra-headers-prefix", "X-Remote-Extra-",
            "--proxy-client-cert-file", str(cert),
            "--proxy-client-key-file", str(key),
        ]

    @property
    def kubelet_client_ca(self) -> Path:
        """The CA a kubelet trusts for the API server's calls (logs, exec)."""
        return self.workdir / "certs" / "kubelet-client-ca.crt"

    def _kubelet_client_cert(self, certs: Path) -> Path:
        """A CA of the test bed's own and, signed by it, the API server's client certificate for kubelets."""
        def openssl(*args: str) -> None:
            subprocess.run(["openssl", *args], check=True, capture_output=True)

        ca_key, ca, key, csr, cert = (certs / name for name in (
            "kubelet-client-ca.key", "kubelet-client-ca.crt", "kubelet-client.key", "kubelet-client.csr",
            "kubelet-client.crt"))
        openssl("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", str(ca_key), "-out", str(ca),
                "-days", "30", "-subj", "/CN=durablerun-testbed-kubelet-client-ca")
        openssl("req", "-newkey", "rsa:2048", "-nodes", "-keyout", str(key), "-out", str(csr),
                "-subj", "/O=system:masters/CN=kube-apiserver-kubelet-client")
        openssl("x509", "-req", "-in", str(csr), "-CA", str(ca), "-CAkey", str(ca_key), "-CAcreateserial",
                "-out", str(cert), "-days", "30")
        return cert

    def node_kubeconfig(self, node: str) -> Path:
        """A kubeconfig for the kubelet of ``node``."""
        path = self.workdir / f"kubelet-{node}.kubeconfig"
        path.write_text(yaml.safe_dump(self.kubeconfig_dict(f"system:node:{node}", self.node_tokens[node])))
        path.chmod(0o600)
        return path

    def _start_scheduler(self, logs: Path) -> None:
        self.scheduler = procs.ManagedProcess(
            "kube-scheduler",
            [
                str(binaries.find("kube-scheduler")),
                "--kubeconfig", str(self.kubeconfig),
                "--leader-elect=false",
                "--secure-port", "0",
                "--v=1",
            ],
            log_path=logs / "kube-scheduler.log",
            testbed_id=self.testbed_id,
        )

    def restart_apiserver(self) -> None:
        """Stop kube-apiserver and start it again on the same port, certificates, keys and tokens."""
        assert self.apiserver
        previous = self.apiserver
        previous.stop()
        self.apiserver = procs.ManagedProcess(
            "kube-apiserver", list(previous.popen.args), log_path=previous.log_path,  # type: ignore[arg-type]
            testbed_id=self.testbed_id,
        )
        procs.wait_for(self._apiserver_ready, timeout=60, what=f"kube-apiserver at {self.url} to come back")

    def restart_etcd(self) -> None:
        """Stop etcd and start it again on the same ports and data: the API server reconnects to it."""
        assert self.etcd
        previous = self.etcd
        previous.stop()
        self.etcd = procs.ManagedProcess("etcd", list(previous.popen.args),  # type: ignore[arg-type]
                                         log_path=previous.log_path, testbed_id=self.testbed_id)
        procs.wait_for(self._etcd_healthy, timeout=60, what=f"etcd at {self.etcd_url} to come back")

    def restart_controller_manager(self, *extra: str) -> None:
        """Start kube-controller-manager again with ``extra`` flags (none: as the bed first started it)."""
        assert self.controller_manager
        self.controller_manager.stop()
        self._start_controller_manager(self.workdir / "logs", *extra)

    def _apiserver_ready(self) -> bool:
        assert self.apiserver
        self.apiserver.check_alive()
        context = ssl.create_default_context(cafile=str(self.ca_file))
        request = urllib.request.Request(
            f"{self.url}/readyz", headers={"Authorization": f"Bearer {self.admin_token}"}
        )
        try:
            with urllib.request.urlopen(request, timeout=2, context=context) as response:
                return bool(response.status == 200)
        except urllib.error.HTTPError:
            return False

    def _write_kubeconfig(self) -> None:
        self.kubeconfig.write_text(yaml.safe_dump(self.kubeconfig_dict(ADMIN_USER, self.admin_token)))
        self.kubeconfig.chmod(0o600)

    def kubeconfig_dict(self, user: str, token: str) -> dict[str, object]:
        """A kubeconfig for ``user`` authenticating with a bearer ``token``."""
        ca = base64.b64encode(self.ca_file.read_bytes()).decode()
        return {
            "apiVersion": "v1",
            "kind": "Config",
            "clusters": [{"name": "testbed", "cluster": {"server": self.url, "certificate-authority-data": ca}}],
            "users": [{"name": user, "user": {"token": token}}],
            "contexts": [{"name": "testbed", "context": {"cluster": "testbed", "user": user}}],
            "current-context": "testbed",
        }

    def _start_controller_manager(self, logs: Path, *extra: str) -> None:
        self.controller_manager = procs.ManagedProcess(
            "kube-controller-manager",
            [
                str(binaries.find("kube-controller-manager")),
                "--kubeconfig", str(self.kubeconfig),
                "--leader-elect=false",
                # The process node keeps no node heartbeats (node loss is
                # simulated by the node itself); a kubelet does, and its Node
                # is tainted not-ready until the node lifecycle controller
                # sees it Ready.
                "--controllers", "*,-cloud-node-lifecycle" if self.nodes else "*,-nodelifecycle,-cloud-node-lifecycle",
                "--secure-port", "0",
                "--service-account-private-key-file", str(self.workdir / "sa.key"),
                "--root-ca-file", str(self.ca_file),
                "--use-service-account-credentials=false",
                "--concurrent-gc-syncs", "5",
                "--v=1",
                *extra,
            ],
            log_path=logs / "kube-controller-manager.log",
            testbed_id=self.testbed_id,
        )

    def check_alive(self) -> None:
        for part in (self.etcd, self.apiserver, self.controller_manager, self.scheduler):
            if part is not None:
                part.check_alive()

    def stop(self) -> None:
        for part in (self.scheduler, self.controller_manager, self.apiserver, self.etcd):
            if part is not None:
                part.stop()
