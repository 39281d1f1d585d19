"""A real node: the kubelet and containerd (with runc) running the images built here.

It is one module of over 400 lines because the node, its pod network and its
cgroups are made and undone together (:func:`clean_up` and :func:`end_cgroups`
undo what :class:`RealNode` and :class:`PodNetwork` make), and one file keeps
the two sides in step.

What the process node stands in for, done for real: images pulled from nowhere
(imported from the OCI archives ``hack/build-images.sh`` built), pod sandboxes,
cgroup memory limits (a real OOM kill), probes, ``kubectl logs``, restricted Pod
Security enforced on real containers, evictions and drains.

Network, kept on this machine: the pods live on a bridge of the test bed's own
(``PodNetwork``) in 198.18.0.0/15, the range set aside for test networks. The
bridge carries the only route a pod has (no default route, no masquerading, IP
forwarding untouched), so a pod can reach the bridge's address and nothing else.
The control plane, the kubelet and MinIO listen on that address; the API
server's service range starts there, so the ``kubernetes`` Service the kubelet
hands to pods points at the API server itself (there is no kube-proxy).

Needs root, cgroups and Debian's containerd, runc and containernetworking-plugins
(``hack/setup.sh`` installs them).
"""

from __future__ import annotations

import contextlib
import ipaddress
import json
import os
import random
import shutil
import signal
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from durablerun_testbed import binaries, procs
from durablerun_testbed.controlplane import ControlPlane

NODE_NAME = "realnode"
CNI_BIN_DIR = Path("/usr/lib/cni")
# The images the node needs before any pod starts (hack/build-images.sh).
IMAGES = ("pause", "runner", "operator", "examples")
TEST_NETWORKS = ipaddress.ip_network("198.18.0.0/15")
CGROUP_PREFIX = "durablerun-"
#: A pod bridge's alias (``ifalias``) names its bed: the bridge's own name has room for 8 characters of the id.
BRIDGE_ALIAS = "durablerun-testbed:"


class RealNodeUnavailable(RuntimeError):
    """The machine cannot run the real node; the message says what is missing."""


def check_machine() -> None:
    """Raise RealNodeUnavailable naming what this machine lacks for a real node."""
    problems = []
    if os.geteuid() != 0:
        problems.append("it needs root (containerd, runc, the pod bridge)")
    for tool in ("containerd", "containerd-shim-runc-v2", "runc", "ctr", "ip", "buildah"):
        if not shutil.which(tool):
            problems.append(f"{tool} is not installed (hack/setup.sh installs it)")
    for plugin in ("bridge", "host-local", "loopback"):
        if not (CNI_BIN_DIR / plugin).exists():
            problems.append(f"CNI plugin {CNI_BIN_DIR / plugin} is missing (containernetworking-plugins)")
    if not Path("/sys/fs/cgroup/memory").is_dir() and not Path("/sys/fs/cgroup/cgroup.controllers").exists():
        problems.append("no memory cgroup at /sys/fs/cgroup")
    if problems:
        raise RealNodeUnavailable("the real node cannot start here: " + "; ".join(problems))


def built_image(name: str) -> tuple[Path, str]:
    """(OCI archive, image reference) of an image hack/build-images.sh built from this checkout."""
    current = binaries.REPO_ROOT / ".images" / f"{name}.current"
    try:
        archive, ref = current.read_text().split()
    except FileNotFoundError:
        raise RealNodeUnavailable(f"image {name} is not built: run hack/build-images.sh") from None
    return Path(archive), ref


def build_workflow_image(directory: Path) -> tuple[Path, str]:
    """(OCI archive, image reference) of DIR's workflows in an image FROM the runner image.

    The same `hack/build-images.sh workflow DIR` users run; the name is the one the script derives from DIR.
    """
    built = subprocess.run([str(binaries.HACK_DIR / "build-images.sh"), "workflow", str(directory)],
                           capture_output=True, text=True)
    if built.returncode != 0:
        raise RuntimeError(f"hack/build-images.sh workflow {directory} failed:\n{built.stderr}")
    name = "workflow-" + directory.resolve().name.replace("_", "-").lower()
    return built_image(name)


def image_archives() -> dict[str, tuple[Path, str]]:
    """name -> (OCI archive, image reference) for the images the node imports."""
    return {name: built_image(name) for name in IMAGES}


@dataclass
class PodNetwork:
    """A /24 of 198.18.0.0/15 on a bridge of the test bed's own: the pods' only network."""

    subnet: ipaddress.IPv4Network
    bridge: str

    @classmethod
    def create(cls, testbed_id: str) -> PodNetwork:
        taken = subprocess.run(["ip", "-4", "route", "show"], capture_output=True, text=True, check=True).stdout
        subnets: list[ipaddress.IPv4Network] = list(TEST_NETWORKS.subnets(new_prefix=24))  # type: ignore[arg-type]
        random.shuffle(subnets)
        for subnet in subnets:
            if str(subnet) not in taken:
                network = cls(subnet, "drbr" + testbed_id.replace("-", "")[-8:])
                network._up()
                Path(f"/sys/class/net/{network.bridge}/ifalias").write_text(BRIDGE_ALIAS + testbed_id)
                return network
        raise RealNodeUnavailable("every /24 of 198.18.0.0/15 is in use")

    @property
    def gateway(self) -> str:
        """The bridge's own address: where the pods reach the control plane and MinIO."""
        return str(self.subnet.network_address + 1)

    @property
    def service_cidr(self) -> str:
        """The API server's service range: its first address is the gateway (the API server)."""
        return str(ipaddress.ip_network(f"{self.subnet.network_address}/25"))

    def _up(self) -> None:
        self.delete()
        subprocess.run(["ip", "link", "add", self.bridge, "type", "bridge"], check=True)
        subprocess.run(["ip", "addr", "add", f"{self.gateway}/{self.subnet.prefixlen}", "dev", self.bridge],
                       check=True)
        subprocess.run(["ip", "link", "set", self.bridge, "up"], check=True)

    def cni_config(self, state: Path) -> dict[str, Any]:
        pods = list(self.subnet.hosts())
        return {
            "cniVersion": "1.0.0",
            "name": "durablerun-testbed",
            "plugins": [{
                "type": "bridge",
                "bridge": self.bridge,
                # No gateway, default route or masquerading: the subnet is all a pod can reach.
                "isGateway": False,
                "ipMasq": False,
                "hairpinMode": True,
                "ipam": {
                    "type": "host-local",
                    "ranges": [[{"subnet": str(self.subnet), "rangeStart": str(pods[127]),
                                 "rangeEnd": str(pods[-1])}]],
                    "dataDir": str(state),
                },
            }],
        }

    def delete(self) -> None:
        subprocess.run(["ip", "link", "del", self.bridge], capture_output=True)


@dataclass
class RealNode:
    workdir: Path
    testbed_id: str
    network: PodNetwork
    containerd: procs.ManagedProcess | None = None
    kubelet: procs.ManagedProcess | None = None
    images: dict[str, str] = field(default_factory=dict)
    name: str = NODE_NAME

    @property
    def socket(self) -> Path:
        return self.workdir / "containerd" / "containerd.sock"

    def start(self, controlplane: ControlPlane) -> RealNode:
        check_machine()
        archives = image_archives()
        self.workdir.mkdir(parents=True, exist_ok=True)
        self._start_containerd(archives["pause"][1])
        started = time.monotonic()
        for name, (archive, ref) in archives.items():
            self.import_image(archive)
            self.images[name] = ref
        self.import_seconds = time.monotonic() - started
        create_cgroups(self.testbed_id)
        self._start_kubelet(controlplane)
        return self

    def ctr(self, *args: str, timeout: float = 300) -> str:
        """containerd's own CLI, in the namespace the CRI (and so the kubelet) uses."""
        result = subprocess.run(["ctr", "--address", str(self.socket), "--namespace", "k8s.io", *args],
                                capture_output=True, text=True, timeout=timeout)
        if result.returncode != 0:
            raise RuntimeError(f"ctr {' '.join(args)}: {result.stderr.strip()}")
        return result.stdout

    def import_image(self, archive: Path) -> None:
        self.ctr("images", "import", str(archive))

    def _start_containerd(self, pause_image: str) -> None:
        base = self.workdir / "containerd"
        cni_conf = base / "net.d"
        cni_conf.mkdir(parents=True, exist_ok=True)
        (cni_conf / "10-durablerun.conflist").write_text(json.dumps(self.network.cni_config(base / "ipam")))
        cri = 'plugins."io.containerd.grpc.v1.cri"'
        config = "\n".join([
            "version = 2",
            f'root = "{base / "root"}"',
            f'state = "{base / "state"}"',
            "[grpc]",
            f'  address = "{self.socket}"',
            "[ttrpc]",
            f'  address = "{self.socket}.ttrpc"',
            '[plugins."io.containerd.internal.v1.opt"]',
            f'  path = "{base / "opt"}"',
            f"[{cri}]",
            f'  sandbox_image = "{pause_image}"',
            '  stream_server_address = "127.0.0.1"',
            '  stream_server_port = "0"',
            # Machines that withhold CAP_SYS_RESOURCE (this kind does) refuse a
            # lower oom_score_adj than containerd's own, as rootless ones do.
            "  restrict_oom_score_adj = true",
            # Pod network namespaces under the state directory, so a stop unmounts them with the rest.
            "  netns_mounts_under_state_dir = true",
            f"[{cri}.containerd]",
            '  snapshotter = "overlayfs"',
            '  default_runtime_name = "runc"',
            f"[{cri}.containerd.runtimes.runc]",
            '  runtime_type = "io.containerd.runc.v2"',
            f"[{cri}.containerd.runtimes.runc.options]",
            "  SystemdCgroup = false",
            f"[{cri}.cni]",
            f'  bin_dir = "{CNI_BIN_DIR}"',
            f'  conf_dir = "{cni_conf}"',
            "",
        ])
        (base / "config.toml").write_text(config)
        self.containerd = procs.ManagedProcess(
            "containerd", ["containerd", "--config", str(base / "config.toml")],
            log_path=self.workdir / "logs" / "containerd.log", testbed_id=self.testbed_id,
        )

        procs.wait_for(self._containerd_ready, timeout=30, what="containerd's CRI plugin")

    def _containerd_ready(self) -> bool:
        assert self.containerd
        self.containerd.check_alive()
        if not self.socket.exists():
            return False
        return any(line.split()[:2] == ["io.containerd.grpc.v1", "cri"] and line.split()[-1] == "ok"
                   for line in self.ctr("plugins", "ls").splitlines())

    def _start_kubelet(self, controlplane: ControlPlane) -> None:
        base = self.workdir / "kubelet"
        base.mkdir(parents=True, exist_ok=True)
        resolv = base / "resolv.conf"
        resolv.write_text("")  # pods have no DNS server to reach: the bed gives them none
        self.healthz_port = procs.free_port()
        config = {
            "apiVersion": "kubelet.config.k8s.io/v1beta1",
            "kind": "KubeletConfiguration",
            "address": self.network.gateway,
            "port": 10250,
            "readOnlyPort": 0,
            "healthzBindAddress": "127.0.0.1",
            "healthzPort": self.healthz_port,
            "containerRuntimeEndpoint": f"unix://{self.socket}",
            # cgroup v1 here; the cgroupfs driver (no systemd in the machine).
            "cgroupDriver": "cgroupfs",
            # The pods' cgroups (`kubepods/...`) under one of the bed's own, not the machine's root: another
            # bed's kubelet would otherwise take this bed's pods for orphans and kill them, and stopping the bed
            # can end exactly its own containers.
            "cgroupRoot": "/" + cgroup_parent(self.testbed_id),
            "failCgroupV1": False,
            "failSwapOn": False,
            # Only the API server (holding a certificate from the bed's own CA) may call the kubelet.
            "authentication": {"anonymous": {"enabled": False}, "webhook": {"enabled": False},
                               "x509": {"clientCAFile": str(controlplane.kubelet_client_ca)}},
            "authorization": {"mode": "AlwaysAllow"},
            "resolvConf": str(resolv),
            "podLogsDir": str(self.workdir / "pods"),
            # Built images cannot be pulled again: never collect them; evict only when truly short.
            "imageGCHighThresholdPercent": 100,
            "imageGCLowThresholdPercent": 99,
            "evictionHard": {"memory.available": "100Mi", "nodefs.available": "1%", "imagefs.available": "1%",
                             "nodefs.inodesFree": "1%"},
            "serializeImagePulls": False,
            "nodeStatusUpdateFrequency": "5s",
            "syncFrequency": "10s",
            "maxPods": 50,
        }
        (base / "config.yaml").write_text(yaml.safe_dump(config))
        self.kubelet_argv = [
            str(binaries.find("kubelet")),
            "--config", str(base / "config.yaml"),
            "--kubeconfig", str(controlplane.node_kubeconfig(self.name)),
            "--root-dir", str(base / "root"),
            "--cert-dir", str(base / "pki"),
            "--hostname-override", self.name,
            "--node-ip", self.network.gateway,
            "--v=1",
        ]
        self.start_kubelet()

    def start_kubelet(self) -> None:
        """Start the kubelet (again, after :meth:`stop_kubelet`): it finds its pods' containers still running."""
        self.kubelet = procs.ManagedProcess("kubelet", self.kubelet_argv,
                                            log_path=self.workdir / "logs" / "kubelet.log", testbed_id=self.testbed_id)

    def stop_kubelet(self) -> None:
        """Stop the kubelet as an operator or a crash would; its containers keep running without it."""
        assert self.kubelet
        self.kubelet.stop()

    def restart_containerd(self) -> None:
        """Stop containerd and start it again on the same state: the shims keep the containers running, and
        the new containerd reconnects to them (an upgrade or a crash of the runtime)."""
        assert self.containerd
        previous = self.containerd
        previous.stop()
        self.containerd = procs.ManagedProcess("containerd", list(previous.popen.args),  # type: ignore[arg-type]
                                               log_path=previous.log_path, testbed_id=self.testbed_id)
        procs.wait_for(self._containerd_ready, timeout=60, what="containerd's CRI plugin after a restart")

    def ready(self, kubectl: Any) -> bool:
        """The Node is registered and Ready (``kubectl`` runs the real kubectl against the bed)."""
        self.check_alive()
        result = kubectl("get", "node", self.name, "-o",
                         "jsonpath={.status.conditions[?(@.type=='Ready')].status}", check=False)
        return bool(result.returncode == 0 and result.stdout.strip() == "True")

    def check_alive(self) -> None:
        for part in (self.containerd, self.kubelet):
            if part is not None:
                part.check_alive()

    def kill_container(self, container_id: str) -> None:
        """SIGKILL a container's process (its task), as a crash or the kernel would."""
        self.ctr("tasks", "kill", "--signal", "SIGKILL", container_id.removeprefix("containerd://"))

    def drain(self, kubectl: Callable[..., object]) -> None:
        """Delete every pod while the kubelet runs, so that it stops their containers and tears their
        sandboxes' networks down; ``kubectl(*args)`` runs kubectl against the node's control plane."""
        kubectl("delete", "pods", "--all", "--all-namespaces", "--grace-period=1", "--wait=false")
        with contextlib.suppress(procs.Timeout):
            procs.wait_for(lambda: not self.ctr("tasks", "list", "--quiet").split(), timeout=60,
                           what="every container on the real node to stop", interval=0.5)

    def stop(self) -> None:
        """Stop the kubelet, every container and containerd; leave no process, cgroup, mount or link behind."""
        if self.kubelet:
            self.kubelet.stop()
        if self.containerd and self.containerd.alive():
            with contextlib.suppress(Exception):
                for task in self.ctr("tasks", "list", "--quiet").split():
                    with contextlib.suppress(Exception):
                        self.ctr("tasks", "kill", "--signal", "SIGKILL", task, timeout=10)
        if self.containerd:
            self.containerd.stop()
        # The shims (and through them the containers) carry the bed's marker.
        for pid, _ in procs.processes_with_marker(self.testbed_id):
            with contextlib.suppress(ProcessLookupError):
                if _is_shim(pid):
                    os.kill(pid, 9)
        clean_up(self.workdir, self.network, self.testbed_id)


def clean_up(workdir: Path, network: PodNetwork, testbed_id: str) -> None:
    """What a stopped node leaves in the kernel: container processes in its cgroups (a container whose shim
    died with containerd lives on, orphaned), the cgroups, mounts under its directory (pod network namespaces
    included), the bridge."""
    end_cgroups(testbed_id)
    unmount_under(workdir)
    network.delete()


def remains(workdir: Path, network: PodNetwork, testbed_id: str) -> list[str]:
    """What of a stopped node is still there (empty when nothing is): processes, cgroups, mounts, the bridge."""
    found = [f"process {pid} in the node's cgroups: {cmd}" for pid, cmd in cgroup_processes(testbed_id)]
    found += [f"cgroup {path}" for path in cgroups(testbed_id)]
    found += [f"mount {point}" for point in mounts_under(workdir)]
    if subprocess.run(["ip", "link", "show", network.bridge], capture_output=True).returncode == 0:
        found.append(f"bridge {network.bridge}")
    return found


def cgroup_parent(testbed_id: str) -> str:
    """The bed's own cgroup, in every hierarchy: its kubelet's cgroupRoot, holding `kubepods` and every pod."""
    return CGROUP_PREFIX + testbed_id


def _hierarchies() -> list[Path]:
    """Where every cgroup hierarchy is mounted: each v1 controller's, named ones, and cgroup2 (hybrid or not)."""
    points = []
    for line in Path("/proc/self/mountinfo").read_text().splitlines():
        fields = line.split()
        if fields[fields.index("-") + 1] in ("cgroup", "cgroup2"):
            points.append(Path(fields[4]))
    return points


def create_cgroups(testbed_id: str) -> None:
    """The bed's cgroup in every hierarchy (the kubelet refuses a cgroupRoot that does not exist)."""
    for hierarchy in _hierarchies():
        path = hierarchy / cgroup_parent(testbed_id)
        path.mkdir(exist_ok=True)
        # A new cpuset has no CPUs or memory nodes; tasks need its parent's.
        for name in ("cpuset.cpus", "cpuset.mems"):
            if (path / name).exists() and not (path / name).read_text().strip():
                (path / name).write_text((hierarchy / name).read_text())
        # cgroup v2: the pods' cgroups get the controllers the machine's root hands down.
        if (path / "cgroup.subtree_control").exists():
            for controller in (hierarchy / "cgroup.subtree_control").read_text().split():
                (path / "cgroup.subtree_control").write_text("+" + controller)


def _cgroups(pattern: str) -> list[Path]:
    """Every cgroup directory at or below /sys/fs/cgroup/<hierarchy>/<pattern> (a glob), in every hierarchy."""
    found = []
    for hierarchy in _hierarchies():
        for top in hierarchy.glob(pattern):
            found.append(top)
            with contextlib.suppress(FileNotFoundError):
                found += [path for path in top.rglob("*") if path.is_dir()]
    return found


def cgroups(testbed_id: str, *, id_prefix: bool = False) -> list[Path]:
    """The bed's cgroups in every hierarchy; ``id_prefix``: those of every bed whose id starts with
    ``testbed_id`` (a test session's beds)."""
    return _cgroups(cgroup_parent(testbed_id) + ("*" if id_prefix else ""))


def cgroup_processes(testbed_id: str, *, id_prefix: bool = False) -> list[tuple[int, str]]:
    """(pid, command line) of every live process in the bed's cgroups: its pods' containers. ``id_prefix``:
    in the cgroups of every bed whose id starts with ``testbed_id`` (a test session's beds)."""
    pids: set[int] = set()
    for path in cgroups(testbed_id, id_prefix=id_prefix):
        with contextlib.suppress(FileNotFoundError, ProcessLookupError):
            pids.update(int(pid) for pid in (path / "cgroup.procs").read_text().split())
    found = []
    for pid in sorted(pids):
        try:
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except (FileNotFoundError, ProcessLookupError):
            continue
        if procs.pid_alive(pid):
            found.append((pid, cmdline.strip()))
    return found


def end_cgroups(testbed_id: str, timeout: float = 30, *, id_prefix: bool = False) -> None:
    """SIGKILL every process left in the bed's cgroups, wait until they are gone, then remove the cgroups,
    deepest first, in every hierarchy. Only this bed's (``id_prefix``: every bed's whose id starts with
    ``testbed_id``): other beds' and the machine's own are untouched."""
    name = cgroup_parent(testbed_id) + ("*" if id_prefix else "")
    for path in _cgroups(name):
        # A frozen task (cgroup v1 freezer) does not die of SIGKILL until thawed.
        with contextlib.suppress(FileNotFoundError, OSError):
            if (path / "freezer.state").exists():
                (path / "freezer.state").write_text("THAWED")

    def ended() -> bool:
        left = cgroup_processes(testbed_id, id_prefix=id_prefix)
        for pid, _ in left:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        return not left

    procs.wait_for(ended, timeout=timeout, interval=0.1, what=f"every process in the cgroups {name} to exit")

    def removed() -> bool:
        for path in sorted(_cgroups(name), key=lambda path: len(path.parts), reverse=True):
            with contextlib.suppress(FileNotFoundError):
                path.rmdir()
        return not _cgroups(name)

    procs.wait_for(removed, timeout=timeout, interval=0.1, what=f"the cgroups {name} to be removed")


def _is_shim(pid: int) -> bool:
    try:
        return b"containerd-shim" in Path(f"/proc/{pid}/cmdline").read_bytes()
    except FileNotFoundError:
        return False


def bridges(testbed_id: str, *, id_prefix: bool = False) -> list[str]:
    """The pod bridges of the bed (``id_prefix``: of every bed whose id starts with ``testbed_id``), by alias."""
    found = []
    for link in Path("/sys/class/net").iterdir():
        with contextlib.suppress(OSError):
            alias = (link / "ifalias").read_text().strip()
            if alias == BRIDGE_ALIAS + testbed_id or (id_prefix and alias.startswith(BRIDGE_ALIAS + testbed_id)):
                found.append(link.name)
    return sorted(found)


def mounts_under(directory: Path) -> list[str]:
    prefix = str(directory.resolve()) + "/"
    mounts = []
    for line in Path("/proc/self/mountinfo").read_text().splitlines():
        point = line.split()[4].replace("\\040", " ")
        if point.startswith(prefix):
            mounts.append(point)
    return sorted(set(mounts), key=len, reverse=True)


def unmount_under(directory: Path) -> None:
    """Lazily unmount what containerd and the kubelet mounted under ``directory``, deepest first."""
    for point in mounts_under(directory):
        subprocess.run(["umount", "-l", point], capture_output=True)
