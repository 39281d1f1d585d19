"""The process node itself: binds pods, runs their containers as processes, reports their status, injects faults.

It is one module of over 400 lines because it is one class,
:class:`ProcessNode`, whose steps (bind, start, watch, report, inject a fault)
all act on one table of its pods and their processes.
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import subprocess
import threading
import time
from pathlib import Path
from typing import Any

from kubernetes import client, watch
from kubernetes.client.rest import ApiException

from durablerun_testbed.processnode.mounts import namespace_script
from durablerun_testbed.processnode.podconfig import TOKEN_TTL_SECONDS, ConfigError, PodConfig, expand
from durablerun_testbed.processnode.runtime import Container, PodRuntime, now, pod_status

log = logging.getLogger("processnode")

DEFAULT_TERMINATION_PATH = "/dev/termination-log"
TERMINATION_MESSAGE_LIMIT = 4096  # what the kubelet keeps of a termination message


class ProcessNode:
    def __init__(
        self,
        *,
        node_name: str,
        state_dir: Path,
        base_env: dict[str, str],
        api_host: str,
        api_port: int,
        ca_file: Path,
        default_workdir: Path,
        image_paths: list[Path] | None = None,
    ) -> None:
        self.node_name = node_name
        self.state_dir = state_dir
        self.ca_file = ca_file
        self.default_workdir = default_workdir
        # What stands in for the image: these host paths stay visible in every
        # container even under a volume mounted over a parent (an emptyDir at /tmp
        # must not hide a venv or a checkout that happens to live under /tmp).
        self.image_paths = image_paths or []
        self.core = client.CoreV1Api()
        self.config = PodConfig(self.core, base_env=base_env, api_host=api_host, api_port=api_port)
        self.pods: dict[str, PodRuntime] = {}  # by uid
        self.lock = threading.Lock()
        self.stopping = threading.Event()

    # --- node ---------------------------------------------------------------------

    def register(self) -> None:
        body = {
            "apiVersion": "v1", "kind": "Node",
            "metadata": {"name": self.node_name, "labels": {
                "kubernetes.io/hostname": self.node_name, "kubernetes.io/os": "linux",
                "durablerun.dev/process-node": "true"}},
        }
        with contextlib.suppress(ApiException):
            self.core.create_node(body)
        status = {"status": {
            "conditions": [{"type": "Ready", "status": "True", "reason": "ProcessNodeReady",
                            "message": "process node is running", "lastHeartbeatTime": now(),
                            "lastTransitionTime": now()}],
            "addresses": [{"type": "InternalIP", "address": "127.0.0.1"},
                          {"type": "Hostname", "address": self.node_name}],
            "capacity": {"cpu": "64", "memory": "256Gi", "pods": "1000"},
            "allocatable": {"cpu": "64", "memory": "256Gi", "pods": "1000"},
            "nodeInfo": {"kubeletVersion": "process-node", "operatingSystem": "linux",
                         "architecture": "amd64", "containerRuntimeVersion": "process://",
                         "kernelVersion": os.uname().release, "osImage": "process node",
                         "kubeProxyVersion": "", "machineID": "", "systemUUID": "", "bootID": ""},
        }}
        self.core.patch_node_status(self.node_name, status)

    # --- main loops ---------------------------------------------------------------

    def run_forever(self) -> None:
        self.register()
        threading.Thread(target=self._resync_loop, name="resync", daemon=True).start()
        while not self.stopping.is_set():
            try:
                self._watch_once()
            except Exception:
                log.exception("pod watch failed; restarting it")
                self.stopping.wait(1)

    def _watch_once(self) -> None:
        listing = self.core.list_pod_for_all_namespaces()
        for pod in listing.items:
            self._reconcile_safely(pod)
        stream = watch.Watch().stream(
            self.core.list_pod_for_all_namespaces,
            resource_version=listing.metadata.resource_version,
            timeout_seconds=300,
        )
        for event in stream:
            if self.stopping.is_set():
                return
            if event["type"] == "DELETED":
                self._forget(event["object"].metadata.uid)
            else:
                self._reconcile_safely(event["object"])

    def _resync_loop(self) -> None:
        # Level-based safety net: retries pods waiting on config, enforces
        # grace-period deadlines and refreshes ServiceAccount tokens.
        while not self.stopping.wait(2.0):
            try:
                for pod in self.core.list_pod_for_all_namespaces().items:
                    self._reconcile_safely(pod)
            except Exception:
                log.exception("resync failed")

    def _reconcile_safely(self, pod: Any) -> None:
        try:
            self.reconcile(pod)
        except ApiException as error:
            if error.status not in (404, 409):
                log.warning("reconcile %s/%s: %s", pod.metadata.namespace, pod.metadata.name, error)
        except Exception:
            log.exception("reconcile %s/%s", pod.metadata.namespace, pod.metadata.name)

    def _forget(self, uid: str) -> None:
        with self.lock:
            runtime = self.pods.get(uid)
            if runtime and (runtime.partitioned or runtime.gone):
                # A partitioned kubelet does not hear of the deletion: its container lives on until the node is
                # back (continued), and the node keeps its exit for /processes, as the pod that held it is gone.
                # A DELETED event that arrives after the node is back finds the pod already being stopped.
                runtime.gone = True
                return
            self.pods.pop(uid, None)
        if runtime:
            for container in runtime.containers.values():
                if container.running and container.popen:
                    _kill_group(container.popen, signal.SIGKILL)

    # --- reconcile one pod ------------------------------------------------------------

    def reconcile(self, pod: Any) -> None:
        meta, spec = pod.metadata, pod.spec
        if not spec.node_name:
            if meta.deletion_timestamp is None and spec.scheduler_name in (None, "default-scheduler"):
                self._bind(pod)
            return
        if spec.node_name != self.node_name:
            return
        runtime = self._runtime(pod)
        with runtime.lock:
            if runtime.partitioned:
                return
            for container in runtime.containers.values():
                if container.exit_code is not None and not container.reported:
                    self._report_exit(runtime, container)
            if meta.deletion_timestamp is not None:
                self._handle_deletion(pod, runtime)
                return
            if pod.status.phase in ("Succeeded", "Failed") and not runtime.started:
                return  # finished before this node (re)started: nothing to do
            if not runtime.started:
                self._start_pod(pod, runtime)
            else:
                self._refresh_projected(pod, runtime)

    def _runtime(self, pod: Any) -> PodRuntime:
        with self.lock:
            runtime = self.pods.get(pod.metadata.uid)
            if runtime is None:
                runtime = PodRuntime(
                    uid=pod.metadata.uid, namespace=pod.metadata.namespace, name=pod.metadata.name,
                    dir=self.state_dir / "pods" / f"{pod.metadata.namespace}_{pod.metadata.name}_{pod.metadata.uid}",
                )
                self.pods[runtime.uid] = runtime
            return runtime

    def _bind(self, pod: Any) -> None:
        body = client.V1Binding(
            metadata=client.V1ObjectMeta(name=pod.metadata.name, uid=pod.metadata.uid),
            target=client.V1ObjectReference(api_version="v1", kind="Node", name=self.node_name),
        )
        # _preload_content=False: the client cannot deserialize a Binding reply.
        self.core.create_namespaced_binding(pod.metadata.namespace, body, _preload_content=False)

    def _start_pod(self, pod: Any, runtime: PodRuntime) -> None:
        runtime.dir.mkdir(parents=True, exist_ok=True)
        specs = [c.to_dict() for c in pod.spec.containers]
        for spec in specs:
            runtime.containers.setdefault(spec["name"], Container(
                name=spec["name"], spec=spec,
                log_path=runtime.dir / f"{spec['name']}.log",
                termination_path=runtime.dir / f"{spec['name']}.termination-log",
            ))
        try:
            pod_dict = self.core.api_client.sanitize_for_serialization(pod)
            mounts_by_volume = self._volumes(pod_dict, runtime)
            envs = {c["name"]: self.config.container_env(pod_dict, c) for c in pod_dict["spec"]["containers"]}
        except ConfigError as error:
            for container in runtime.containers.values():
                container.waiting_reason, container.waiting_message = "CreateContainerConfigError", str(error)
            self._write_status(pod, runtime)
            return
        runtime.started = True
        runtime.start_time = now()
        grace = pod.spec.termination_grace_period_seconds
        runtime.grace_seconds = 30.0 if grace is None else float(grace)
        for container_dict in pod_dict["spec"]["containers"]:
            container = runtime.containers[container_dict["name"]]
            container.waiting_reason = container.waiting_message = None
            self._launch(pod_dict, runtime, container, container_dict, envs[container.name], mounts_by_volume)
        self._write_status(pod, runtime)

    def _volumes(self, pod: dict[str, Any], runtime: PodRuntime) -> dict[str, Path]:
        volumes = self.config.volumes(pod, runtime.dir)
        if any("projected" in volume for volume in pod["spec"].get("volumes") or []):
            runtime.projected_at = time.monotonic()
        return volumes

    def _refresh_projected(self, pod: Any, runtime: PodRuntime) -> None:
        # The kubelet refreshes projected tokens at 80% of their lifetime.
        if runtime.projected_at and time.monotonic() - runtime.projected_at > 0.8 * TOKEN_TTL_SECONDS:
            self._volumes(self.core.api_client.sanitize_for_serialization(pod), runtime)

    # --- processes --------------------------------------------------------------------

    def _launch(
        self,
        pod: dict[str, Any],
        runtime: PodRuntime,
        container: Container,
        spec: dict[str, Any],
        env: dict[str, str],
        volumes: dict[str, Path],
    ) -> None:
        argv = [expand(a, env) for a in (spec.get("command") or []) + (spec.get("args") or [])]
        if not argv:
            container.exit_code, container.reason = 128, "ContainerCannotRun"
            container.message = "the process node has no image entrypoint: set the container's command"
            container.finished_at = now()
            return
        container.termination_path.write_bytes(b"")
        container.termination_path.chmod(0o666)
        mounts: list[tuple[Path, str, bool]] = [
            (container.termination_path, spec.get("terminationMessagePath") or DEFAULT_TERMINATION_PATH, False)
        ]
        for mount in spec.get("volumeMounts") or []:
            source = volumes.get(mount["name"])
            if source is not None:
                if mount.get("subPath"):
                    source = source / mount["subPath"]
                mounts.append((source, mount["mountPath"], bool(mount.get("readOnly"))))
        # Parents before children (/tmp before /tmp/ledger), as container runtimes order mounts.
        mounts.sort(key=lambda m: len(Path(m[1]).parts))
        security = {**(pod["spec"].get("securityContext") or {}), **(spec.get("securityContext") or {})}
        script = namespace_script(mounts, security, spec.get("workingDir") or str(self.default_workdir),
                                   self.image_paths)
        container.log_path.parent.mkdir(parents=True, exist_ok=True)
        with container.log_path.open("ab") as logfile:
            container.popen = subprocess.Popen(
                ["unshare", "--mount", "--propagation", "private", "--", "/bin/sh", "-c", script, "sh", *argv],
                stdout=logfile, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                env=env, start_new_session=True,
            )
        container.started_at = now()
        container.exit_code = container.reason = container.message = None
        container.oom_marked = container.lost = container.reported = False
        threading.Thread(
            target=self._wait, args=(pod, runtime, container), name=f"wait-{runtime.key}", daemon=True
        ).start()

    def _wait(self, pod: dict[str, Any], runtime: PodRuntime, container: Container) -> None:
        assert container.popen is not None
        code = container.popen.wait()
        with runtime.lock:
            if container.lost:
                return  # a lost node reports nothing
            container.exit_code = 128 - code if code < 0 else code
            container.finished_at = now()
            container.reason = ending_reason(code, container.oom_marked)
            message = container.termination_path.read_bytes()[:TERMINATION_MESSAGE_LIMIT]
            if not message.strip() and container.exit_code != 0 and \
                    container.spec.get("terminationMessagePolicy") == "FallbackToLogsOnError":
                message = _tail(container.log_path, 80)[-TERMINATION_MESSAGE_LIMIT:]
            container.message = message.decode(errors="replace") or None
            log.info("%s/%s exited %s (%s)", runtime.key, container.name, container.exit_code, container.reason)
            restart = pod["spec"].get("restartPolicy", "Always")
            if not runtime.deleting and (
                restart == "Always" or (restart == "OnFailure" and container.exit_code != 0)
            ):
                self._schedule_restart(pod, runtime, container)
        self._report_exit(runtime, container)
        if runtime.deleting and container.reported:
            self._finish_deletion(runtime)

    def _report_exit(self, runtime: PodRuntime, container: Container) -> None:
        """Write the exit to the pod's status; after an API error the resync tries again, as the kubelet's
        status manager does (a pod whose exit is never reported looks alive forever)."""
        try:
            self._write_status_by_name(runtime)
        except Exception as error:
            log.warning("%s/%s: could not report the exit (%s); retrying", runtime.key, container.name, error)
            return
        container.reported = True

    def _schedule_restart(self, pod: dict[str, Any], runtime: PodRuntime, container: Container) -> None:
        container.last_terminated = container.terminated()
        container.restart_count += 1
        delay = min(10.0, 0.5 * 2 ** min(container.restart_count, 5))

        def restart() -> None:
            with runtime.lock:
                if runtime.deleting or self.stopping.is_set():
                    return
                fresh = self.core.api_client.sanitize_for_serialization(
                    self.core.read_namespaced_pod(runtime.name, runtime.namespace))
                volumes = self._volumes(fresh, runtime)
                env = self.config.container_env(fresh, container.spec)
                self._launch(fresh, runtime, container, container.spec, env, volumes)
            self._write_status_by_name(runtime)

        threading.Timer(delay, restart).start()

    # --- deletion ---------------------------------------------------------------------

    def _handle_deletion(self, pod: Any, runtime: PodRuntime) -> None:
        running = [c for c in runtime.containers.values() if c.running and c.popen]
        if not runtime.deleting:
            runtime.deleting = True
            grace = pod.metadata.deletion_grace_period_seconds
            grace = 30 if grace is None else grace
            runtime.kill_deadline = time.monotonic() + grace
            for container in running:
                assert container.popen
                _kill_group(container.popen, signal.SIGTERM if grace > 0 else signal.SIGKILL)
                _kill_group(container.popen, signal.SIGCONT)  # a paused process must see it
        elif running and runtime.kill_deadline and time.monotonic() > runtime.kill_deadline:
            for container in running:
                assert container.popen
                _kill_group(container.popen, signal.SIGKILL)
        # An exit not reported yet is reported first: the thread waiting on it then finishes the deletion.
        if not running and all(c.reported or c.popen is None for c in runtime.containers.values()):
            self._finish_deletion(runtime)

    def _finish_deletion(self, runtime: PodRuntime) -> None:
        # What the kubelet's status manager does once every container stopped.
        with contextlib.suppress(ApiException):
            self.core.delete_namespaced_pod(
                runtime.name, runtime.namespace, grace_period_seconds=0,
                body=client.V1DeleteOptions(grace_period_seconds=0, preconditions={"uid": runtime.uid}))

    # --- status -----------------------------------------------------------------------

    def _write_status_by_name(self, runtime: PodRuntime) -> None:
        try:
            pod = self.core.read_namespaced_pod(runtime.name, runtime.namespace)
        except ApiException as error:
            if error.status == 404:
                return
            raise
        if pod.metadata.uid == runtime.uid:
            self._write_status(pod, runtime)

    def _write_status(self, pod: Any, runtime: PodRuntime) -> None:
        for _ in range(10):
            body = self.core.api_client.sanitize_for_serialization(pod)
            body["status"] = pod_status(body, runtime)
            try:
                self.core.replace_namespaced_pod_status(runtime.name, runtime.namespace, body)
                return
            except ApiException as error:
                if error.status == 404:
                    return
                if error.status != 409:
                    raise
            try:
                pod = self.core.read_namespaced_pod(runtime.name, runtime.namespace)
            except ApiException as error:
                if error.status == 404:
                    return  # deleted meanwhile
                raise

    # --- control actions ------------------------------------------------------------

    def _find(self, namespace: str, pod: str, container: str | None) -> tuple[PodRuntime, Container]:
        with self.lock:
            matches = [r for r in self.pods.values() if r.namespace == namespace and r.name == pod]
        for runtime in matches:
            for c in runtime.containers.values():
                if (container is None or c.name == container) and c.running:
                    return runtime, c
        raise LookupError(f"no running container in pod {namespace}/{pod}")

    def act(self, action: str, namespace: str, pod: str, container: str | None) -> dict[str, Any]:
        runtime, target = self._find(namespace, pod, container)
        assert target.popen is not None
        pid = target.popen.pid
        if action == "kill":
            _kill_group(target.popen, signal.SIGKILL)
        elif action == "oom":
            target.oom_marked = True
            _kill_group(target.popen, signal.SIGKILL)
        elif action == "pause":
            runtime.partitioned = True
            _kill_group(target.popen, signal.SIGSTOP)
        elif action == "continue":
            runtime.partitioned = False
            _kill_group(target.popen, signal.SIGCONT)
            if runtime.gone or not self._still_exists(runtime):
                self._stop_gone(runtime)
        elif action == "term":
            _kill_group(target.popen, signal.SIGTERM)
        elif action == "lose":
            self._lose(runtime)
        else:
            raise ValueError(f"unknown action {action!r}: use kill, oom, pause, continue, term or lose")
        return {"pod": runtime.key, "container": target.name, "pid": pid, "action": action}

    def _still_exists(self, runtime: PodRuntime) -> bool:
        """Whether the API server still holds this pod: a kubelet back from a partition relists rather than
        trust that its watch already told it of every deletion."""
        try:
            pod = self.core.read_namespaced_pod(runtime.name, runtime.namespace)
        except ApiException as error:
            if error.status == 404:
                return False
            raise
        return bool(pod.metadata.uid == runtime.uid)

    def _stop_gone(self, runtime: PodRuntime) -> None:
        """Back from a partition, the node finds the pod deleted: SIGTERM its containers, SIGKILL after the
        pod's grace period, as a kubelet stops a pod removed from the API server while it was cut off."""
        with runtime.lock:
            runtime.gone = runtime.deleting = True
            running = [c.popen for c in runtime.containers.values() if c.running and c.popen]
        for popen in running:
            _kill_group(popen, signal.SIGTERM)

        def kill() -> None:
            for popen in running:
                if popen.poll() is None:
                    _kill_group(popen, signal.SIGKILL)

        timer = threading.Timer(runtime.grace_seconds, kill)
        timer.daemon = True
        timer.start()

    def _lose(self, runtime: PodRuntime) -> None:
        with runtime.lock:
            runtime.deleting = True
            for c in runtime.containers.values():
                if c.running and c.popen:
                    c.lost = True
                    _kill_group(c.popen, signal.SIGKILL)
        pod = self.core.read_namespaced_pod(runtime.name, runtime.namespace)
        body = self.core.api_client.sanitize_for_serialization(pod)
        conditions = [c for c in body["status"].get("conditions") or [] if c["type"] != "DisruptionTarget"]
        conditions.append({"type": "DisruptionTarget", "status": "True", "reason": "DeletionByTaintManager",
                           "message": f"Taint manager: deleting due to NoExecute taint (node {self.node_name} lost)",
                           "lastTransitionTime": now()})
        body["status"]["conditions"] = conditions
        with contextlib.suppress(ApiException):
            self.core.replace_namespaced_pod_status(runtime.name, runtime.namespace, body)
        self._finish_deletion(runtime)

    def processes(self) -> list[dict[str, Any]]:
        with self.lock:
            runtimes = list(self.pods.values())
        out = []
        for runtime in runtimes:
            for c in runtime.containers.values():
                out.append({"pod": runtime.key, "uid": runtime.uid, "container": c.name,
                            "pid": c.popen.pid if c.popen else None, "running": c.running,
                            "exitCode": c.exit_code, "log": str(c.log_path)})
        return out

    def shutdown(self) -> None:
        self.stopping.set()
        with self.lock:
            runtimes = list(self.pods.values())
        for runtime in runtimes:
            for c in runtime.containers.values():
                if c.running and c.popen:
                    _kill_group(c.popen, signal.SIGKILL)


def ending_reason(returncode: int, oom_marked: bool) -> str:
    """A container's terminated reason from its process's return code. OOMKilled only when the OOM kill
    was what ended it: a container that exited on its own just before the kill landed (the kill then
    signals a zombie) ended as it says, as a real kernel, which kills only a live process, would report."""
    if oom_marked and returncode == -signal.SIGKILL:
        return "OOMKilled"
    return "Completed" if returncode == 0 else "Error"


def _kill_group(popen: subprocess.Popen[bytes], sig: signal.Signals) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(popen.pid, sig)


def _tail(path: Path, lines: int) -> bytes:
    try:
        return b"\n".join(path.read_bytes().splitlines()[-lines:])
    except FileNotFoundError:
        return b""
