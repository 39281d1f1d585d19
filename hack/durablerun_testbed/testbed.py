"""The whole test bed in one object: control plane, MinIO, and a node (the process node or the real node)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import urllib.request
import uuid
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from durablerun import api
from durablerun_testbed import binaries, procs
from durablerun_testbed.controlplane import ControlPlane
from durablerun_testbed.realnode import NODE_NAME, PodNetwork, RealNode, cgroup_processes
from durablerun_testbed.s3 import S3Server

VENV_BIN = Path(sys.executable).parent
#: What `kubectl apply -k deploy/` installs of the API: the CRDs and the runs' admission policy.
CRD_DIR = binaries.REPO_ROOT / "deploy" / "crd"
_KUBECONFIG_LOCK = threading.Lock()


class NodeClient:
    """Tells the process node to do to a pod's process what the real world does."""

    def __init__(self, url: str) -> None:
        self.url = url

    def _post(self, action: str, namespace: str, pod: str, container: str | None) -> dict[str, Any]:
        query = f"namespace={namespace}&pod={pod}" + (f"&container={container}" if container else "")
        request = urllib.request.Request(f"{self.url}/{action}?{query}", method="POST")
        with urllib.request.urlopen(request, timeout=10) as response:
            result: dict[str, Any] = json.load(response)
            return result

    def kill(self, namespace: str, pod: str, container: str | None = None) -> dict[str, Any]:
        """SIGKILL the container's process: a crash (exit 137)."""
        return self._post("kill", namespace, pod, container)

    def oom(self, namespace: str, pod: str, container: str | None = None) -> dict[str, Any]:
        """SIGKILL it and report reason OOMKilled, as the kernel's OOM killer would."""
        return self._post("oom", namespace, pod, container)

    def pause(self, namespace: str, pod: str, container: str | None = None) -> dict[str, Any]:
        """SIGSTOP: a hung or network-partitioned pod."""
        return self._post("pause", namespace, pod, container)

    def cont(self, namespace: str, pod: str, container: str | None = None) -> dict[str, Any]:
        """SIGCONT a paused process."""
        return self._post("continue", namespace, pod, container)

    def terminate(self, namespace: str, pod: str, container: str | None = None) -> dict[str, Any]:
        """SIGTERM the process (without deleting the pod)."""
        return self._post("term", namespace, pod, container)

    def lose(self, namespace: str, pod: str) -> dict[str, Any]:
        """The node dies under the pod: process killed unreported, pod force-deleted."""
        return self._post("lose", namespace, pod, None)

    def processes(self) -> list[dict[str, Any]]:
        with urllib.request.urlopen(f"{self.url}/processes", timeout=10) as response:
            result: list[dict[str, Any]] = json.load(response)
            return result


@dataclass
class TestBed:
    root: Path
    id: str = field(default_factory=lambda: uuid.uuid4().hex[:12])
    controlplane: ControlPlane | None = None
    s3: S3Server | None = None
    node_process: procs.ManagedProcess | None = None
    node: NodeClient | None = None
    real_node: RealNode | None = None
    network: PodNetwork | None = None
    owns_s3: bool = True

    __test__ = False  # not a pytest test class

    @property
    def kubeconfig(self) -> Path:
        assert self.controlplane
        return self.controlplane.kubeconfig

    def start(
        self,
        *,
        s3: S3Server | bool = True,
        node: bool = True,
        base_env: dict[str, str] | None = None,
        real_node: bool = False,
    ) -> TestBed:
        """Start the parts; ``s3`` may be a running server to share instead of a new one.

        ``real_node``: a kubelet and containerd (``realnode``) instead of the
        process node, with kube-scheduler, and the control plane and MinIO on
        the node's pod network so its pods reach them.
        """
        self.root.mkdir(parents=True, exist_ok=True)
        try:
            if real_node:
                self.network = PodNetwork.create(self.id)
                self.controlplane = ControlPlane(
                    self.root / "controlplane", self.id, address=self.network.gateway, port=443,
                    service_cidr=self.network.service_cidr, nodes=(NODE_NAME,),
                ).start(scheduler=True)
            else:
                self.controlplane = ControlPlane(self.root / "controlplane", self.id).start()
            if isinstance(s3, S3Server):
                self.s3, self.owns_s3 = s3, False
            elif s3:
                address = self.network.gateway if self.network else "127.0.0.1"
                self.s3 = S3Server(self.root / "s3", self.id, address=address).start()
            if real_node:
                assert self.network
                real = self.real_node = RealNode(self.root / "node", self.id, self.network)
                real.start(self.controlplane)
                procs.wait_for(lambda: real.ready(self.kubectl), timeout=120, what="the real node to be Ready")
            elif node:
                self.start_node(base_env)
        except BaseException:
            self.stop()
            raise
        return self

    def start_node(self, base_env: dict[str, str] | None = None) -> None:
        port = procs.free_port()
        env = base_env if base_env is not None else default_pod_env()
        self.node_process = procs.ManagedProcess(
            "process-node",
            [sys.executable, "-m", "durablerun_testbed", "node",
             "--kubeconfig", str(self.kubeconfig), "--state-dir", str(self.root / "node"),
             "--control-port", str(port), "--workdir", str(binaries.REPO_ROOT),
             "--image-path", str(binaries.REPO_ROOT), "--image-path", sys.prefix,
             "--base-env", json.dumps(env)],
            log_path=self.root / "logs" / "process-node.log",
            testbed_id=self.id,
        )
        self.node = NodeClient(f"http://127.0.0.1:{port}")
        node_client = self.node

        def healthy() -> bool:
            assert self.node_process
            self.node_process.check_alive()
            node_client.processes()
            return True

        procs.wait_for(healthy, timeout=30, what="the process node's control API")

    def kubectl(
        self, *args: str, input: str | None = None, check: bool = True, timeout: float = 60
    ) -> subprocess.CompletedProcess[str]:
        """Run the real kubectl against the test bed; raise with its stderr when it fails."""
        argv = [str(binaries.kubectl()), "--kubeconfig", str(self.kubeconfig), *args]
        result = subprocess.run(argv, input=input, capture_output=True, text=True, timeout=timeout)
        if check and result.returncode != 0:
            raise subprocess.CalledProcessError(result.returncode, argv, result.stdout, result.stderr)
        return result

    def install_crds(self, timeout: float = 120) -> None:
        """Apply deploy/crd/ (the DurableRun, ModelQuota and DurableRunSchedule CRDs, the runs' admission policy)
        and wait until the API server serves each kind."""
        self.kubectl("apply", "--server-side", "-f", str(CRD_DIR))
        for crd in (api.CRD_NAME, api.QUOTA_CRD_NAME, api.SCHEDULE_CRD_NAME):
            self.wait_established(crd, timeout=timeout)

    def wait_established(self, crd: str = api.CRD_NAME, timeout: float = 120) -> None:
        """Wait until the API server serves ``crd``. Not `kubectl wait --for=condition=Established`: kubectl
        1.33 fails at once, instead of waiting, on a CRD created so recently that it has no conditions yet."""
        established = 'jsonpath={.status.conditions[?(@.type=="Established")].status}'
        procs.wait_for(lambda: self.kubectl("get", "crd", crd, "-o", established, check=False).stdout == "True",
                       timeout=timeout, what=f"the CRD {crd} to be established")

    def api_client(self) -> Any:
        from kubernetes import client, config

        configuration = client.Configuration()
        # The client writes the kubeconfig's CA to a temp file it names (and caches) before it fills it, so a
        # second thread loading at the same moment can read an empty CA: "no certificate or crl found".
        with _KUBECONFIG_LOCK:
            config.load_kube_config(config_file=str(self.kubeconfig), client_configuration=configuration)
        return client.ApiClient(configuration)

    def env(self) -> dict[str, str]:
        """Environment for a process that talks to the test bed (kubectl, the operator)."""
        env = dict(os.environ, KUBECONFIG=str(self.kubeconfig))
        if self.s3:
            env.update(AWS_ACCESS_KEY_ID=self.s3.access_key, AWS_SECRET_ACCESS_KEY=self.s3.secret_key,
                       AWS_DEFAULT_REGION=self.s3.region, AWS_ENDPOINT_URL_S3=self.s3.endpoint_url)
        return env

    def check_alive(self) -> None:
        for part in (self.controlplane, self.s3, self.node_process, self.real_node):
            if part is not None:
                part.check_alive()

    def stop(self) -> None:
        if self.node_process:
            self.node_process.stop()
        if self.real_node:
            self._drain_real_node()
            self.real_node.stop()
        elif self.network:
            self.network.delete()
        if self.s3 and self.owns_s3:
            self.s3.stop()
        if self.controlplane:
            self.controlplane.stop()

    def _drain_real_node(self) -> None:
        """Delete every pod while the kubelet runs, so that it stops their containers and tears their
        sandboxes' networks down (nothing recreates them: the controller-manager stops first)."""
        node, controlplane = self.real_node, self.controlplane
        assert node
        if not (controlplane and controlplane.apiserver and controlplane.apiserver.alive()):
            return
        if controlplane.controller_manager:
            controlplane.controller_manager.stop()
        if node.kubelet and node.kubelet.alive():
            node.drain(lambda *args: self.kubectl(*args, check=False, timeout=30))

    def leftovers(self) -> list[tuple[int, str]]:
        """Processes started by this test bed that are still alive: its own, and its pods' containers on a
        real node (which carry no marker, but live in the bed's cgroups)."""
        return procs.processes_with_marker(self.id) + cgroup_processes(self.id)

    def logs(self) -> Sequence[Path]:
        return sorted(self.root.rglob("*.log"))


def default_pod_env() -> dict[str, str]:
    """What the process node's "image" provides: this venv and the repo's examples."""
    return {
        "PATH": f"{VENV_BIN}:/usr/local/bin:/usr/bin:/bin",
        "LANG": "C.UTF-8",
        "PYTHONUNBUFFERED": "1",
        "PYTHONDONTWRITEBYTECODE": "1",
        "PYTHONPATH": str(binaries.REPO_ROOT / "examples"),
        "HOME": "/tmp",
    }
