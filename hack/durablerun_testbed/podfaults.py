"""What the real world does to a real node's running container, done from the host: freeze it, cut it off.

- :func:`freeze` / :func:`thaw`: the cgroup v1 freezer of the container's cgroup (what `docker pause` and
  `runc pause` use): every thread of the container stops at once, its timers and sockets with it, as in a
  long GC pause or a VM stalled by its hypervisor. Unlike SIGSTOP, the runner cannot tell, and signals sent
  meanwhile (the kubelet's SIGTERM) wait until the thaw.
- :func:`cut_off` / :func:`reconnect`: the host's end of the pod's veth pair on the bed's bridge set down, so
  the pod can reach nothing (the API server, MinIO) while its node, its kubelet and every other pod carry on:
  a partition of one pod. Only a pod on the bridge has such an end; a host-network pod has none.

A container is named by its runtime id (the pod status's ``containerID``, with or without ``containerd://``).
"""

from __future__ import annotations

import os
import re
import subprocess
from pathlib import Path

from durablerun_testbed import procs
from durablerun_testbed.realnode import RealNode

FREEZER = Path("/sys/fs/cgroup/freezer")


def task_pid(node: RealNode, container_id: str) -> int:
    """The host pid of the container's first process (its task in containerd)."""
    cid = container_id.removeprefix("containerd://")
    for line in node.ctr("tasks", "list").splitlines()[1:]:
        fields = line.split()
        if fields and fields[0] == cid:
            return int(fields[1])
    raise LookupError(f"container {cid} has no running task on the node")


def _freezer_state(pid: int) -> Path:
    for line in Path(f"/proc/{pid}/cgroup").read_text().splitlines():
        _, controllers, path = line.split(":", 2)
        if "freezer" in controllers.split(","):
            return FREEZER / path.lstrip("/") / "freezer.state"
    raise LookupError(f"process {pid} is in no freezer cgroup (cgroup v1's freezer is needed)")


def freeze(node: RealNode, container_id: str) -> Path:
    """Freeze every process of the container; returns its cgroup's ``freezer.state`` for :func:`thaw`."""
    state = _freezer_state(task_pid(node, container_id))
    state.write_text("FROZEN")
    procs.wait_for(lambda: state.read_text().strip() == "FROZEN", timeout=30, interval=0.05,
                   what=f"{state} to read FROZEN")
    return state


def thaw(state: Path) -> None:
    """Let a frozen container run again (its cgroup may be gone by now: nothing to thaw then)."""
    if state.exists():
        state.write_text("THAWED")


def _host_veth(pid: int) -> str:
    """The host's end of the veth pair whose other end is eth0 in the process's network namespace."""
    inside = subprocess.run(["nsenter", "-t", str(pid), "-n", "ip", "-o", "link", "show", "eth0"],
                            capture_output=True, text=True, check=True).stdout
    peer = re.search(r"eth0@if(\d+)", inside)
    if peer is None:
        raise LookupError(f"process {pid}'s eth0 is not one end of a veth pair: {inside.strip()}")
    for line in subprocess.run(["ip", "-o", "link", "show"], capture_output=True, text=True,
                               check=True).stdout.splitlines():
        index, name = line.split(":", 2)[:2]
        if index.strip() == peer.group(1):
            return name.strip().split("@")[0]
    raise LookupError(f"no host interface has index {peer.group(1)} (process {pid}'s veth peer)")


def cut_off(node: RealNode, container_id: str) -> str:
    """Take the pod's side of the bridge down; returns the interface for :func:`reconnect`."""
    pid = task_pid(node, container_id)
    if os.readlink(f"/proc/{pid}/ns/net") == os.readlink("/proc/self/ns/net"):
        raise ValueError(f"container {container_id} shares the host's network: it cannot be cut off alone")
    veth = _host_veth(pid)
    subprocess.run(["ip", "link", "set", veth, "down"], check=True)
    return veth


def reconnect(veth: str) -> None:
    """Bring the pod's side of the bridge up again (a no-op once the pod's sandbox is gone)."""
    subprocess.run(["ip", "link", "set", veth, "up"], capture_output=True)
