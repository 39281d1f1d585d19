"""What the process node knows of each pod and container, and the pod status a kubelet would report from it."""

from __future__ import annotations

import datetime as dt
import subprocess
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from durablerun import api


def now() -> str:
    return dt.datetime.now(dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


@dataclass
class Container:
    name: str
    spec: dict[str, Any]
    log_path: Path
    termination_path: Path
    popen: subprocess.Popen[bytes] | None = None
    started_at: str | None = None
    finished_at: str | None = None
    exit_code: int | None = None
    reason: str | None = None
    message: str | None = None
    waiting_reason: str | None = None
    waiting_message: str | None = None
    restart_count: int = 0
    last_terminated: dict[str, Any] | None = None
    oom_marked: bool = False
    lost: bool = False
    #: Its exit has been written to the pod's status (a kubelet reports an exit before it deletes the pod).
    reported: bool = False

    @property
    def running(self) -> bool:
        return self.popen is not None and self.exit_code is None

    def state(self) -> dict[str, Any]:
        if self.running:
            return {"running": {"startedAt": self.started_at}}
        if self.exit_code is not None:
            return {"terminated": self.terminated()}
        return {"waiting": {"reason": self.waiting_reason or "ContainerCreating",
                            **({"message": self.waiting_message} if self.waiting_message else {})}}

    def terminated(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "exitCode": self.exit_code, "reason": self.reason,
            "startedAt": self.started_at, "finishedAt": self.finished_at,
            "containerID": f"process://{self.popen.pid if self.popen else 0}",
        }
        if self.message:
            out["message"] = self.message
        return out


@dataclass
class PodRuntime:
    uid: str
    namespace: str
    name: str
    dir: Path
    containers: dict[str, Container] = field(default_factory=dict)
    started: bool = False
    start_time: str | None = None
    deleting: bool = False
    kill_deadline: float | None = None
    lock: threading.RLock = field(default_factory=threading.RLock)
    projected_at: float = 0.0
    #: Paused: the process is SIGSTOPped and the node acts as if cut off from it
    #: (no status, no deletion handling) until it is continued.
    partitioned: bool = False
    #: Deleted from the API server (force-deleted) while partitioned: the node learns of it when continued.
    gone: bool = False
    #: The pod's terminationGracePeriodSeconds: SIGTERM to SIGKILL when the node stops a gone pod.
    grace_seconds: float = 30.0

    @property
    def key(self) -> str:
        return f"{self.namespace}/{self.name}"


def image_id(image: str) -> str:
    """The imageID a container status reports: an image named by its digest (``name@sha256:...``) is that digest,
    whatever the node runs (it runs no images); a tag names no digest here, so it reports none, as before. So a
    run is pinned (and upgraded) on this node only when its template (or the upgrade) names a digest."""
    return image if api.image_digest(image) == image else ""


def pod_status(pod: dict[str, Any], runtime: PodRuntime) -> dict[str, Any]:
    with runtime.lock:
        containers = list(runtime.containers.values())
        old = pod.get("status") or {}
        kept = [c for c in old.get("conditions") or []
                if c["type"] not in ("PodScheduled", "Initialized", "ContainersReady", "Ready")]
        all_done = bool(containers) and all(c.exit_code is not None for c in containers)
        restart = pod["spec"].get("restartPolicy", "Always")
        if not runtime.started:
            phase = "Pending"
        elif all_done and (restart == "Never" or runtime.deleting):
            phase = "Succeeded" if all(c.exit_code == 0 for c in containers) else "Failed"
        elif all_done and restart == "OnFailure" and all(c.exit_code == 0 for c in containers):
            phase = "Succeeded"
        else:
            phase = "Running"
        ready = "True" if containers and all(c.running for c in containers) else "False"
        moment = now()

        def condition(kind: str, status: str) -> dict[str, Any]:
            return {"type": kind, "status": status, "lastTransitionTime": moment, "lastProbeTime": None}

        statuses = []
        for c in containers:
            entry: dict[str, Any] = {
                "name": c.name, "state": c.state(), "ready": c.running,
                "restartCount": c.restart_count, "image": c.spec.get("image") or "",
                "imageID": image_id(c.spec.get("image") or ""), "started": c.running,
            }
            if c.running:
                entry["containerID"] = f"process://{c.popen.pid if c.popen else 0}"
            if c.last_terminated:
                entry["lastState"] = {"terminated": c.last_terminated}
            statuses.append(entry)
        status: dict[str, Any] = {
            "phase": phase,
            "conditions": [*kept, condition("PodScheduled", "True"),
                           condition("Initialized", "True"),
                           condition("ContainersReady", ready), condition("Ready", ready)],
            "hostIP": "127.0.0.1", "hostIPs": [{"ip": "127.0.0.1"}],
            "containerStatuses": statuses,
            "qosClass": old.get("qosClass") or "BestEffort",
        }
        if runtime.started:
            status.update(podIP="127.0.0.1", podIPs=[{"ip": "127.0.0.1"}], startTime=runtime.start_time)
        return status
