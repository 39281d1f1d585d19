"""The process node: a stand-in for the kubelet (and the scheduler) on a bare API server.

It is NOT a kubelet and makes no claim to be one. It does the part of a
kubelet's job the tests and the sandbox rely on, for real, through the real
API server:

- registers a Node, binds every unscheduled pod to it (the scheduler's job);
- runs each container's ``command`` + ``args`` as a local process, with the
  pod's env (``value``, ``valueFrom`` Secret/ConfigMap keys, field refs,
  ``envFrom``), ``workingDir`` and ``runAsUser``/``runAsGroup``;
- gives each container a private mount namespace in which its
  ``terminationMessagePath``, its ServiceAccount token (a real bound token from
  the TokenRequest API, at the in-cluster path), and its ``emptyDir``,
  ``hostPath``, ``secret`` and ``configMap`` volumes are mounted, and ``/`` is
  read-only when ``readOnlyRootFilesystem`` says so;
- reports what a kubelet reports: pod phase, conditions, container state
  (running / terminated with exit code, reason and the termination message);
- honours graceful deletion (SIGTERM, grace period, SIGKILL) and restart
  policies (restarting containers of Deployment pods);
- on request, through a small HTTP control API on loopback: SIGKILLs a
  container (exit 137), marks it OOMKilled, pauses/continues it (SIGSTOP and
  SIGCONT; while paused the node also ignores the pod, as a partitioned node
  would: a deletion reaches the process only once it is continued), or loses the node under a pod
  (the process dies unreported, the pod gets a DisruptionTarget condition and
  is force-deleted, as the taint manager and pod GC do for a lost node).

What it does not do: images (the command runs on this machine with the node's
base environment standing in for the image), probes (a running container is
ready), resource limits, networking (pods share the host's loopback), logs
through the API (each container logs to a file under the node's state dir).
It needs root: mount namespaces and ``setpriv``.
"""

from __future__ import annotations

import argparse
import base64
import contextlib
import datetime as dt
import json
import logging
import os
import shlex
import signal
import subprocess
import threading
import time
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlparse

from kubernetes import client, config, watch
from kubernetes.client.rest import ApiException

from durablerun_testbed import procs

log = logging.getLogger("processnode")

DEFAULT_TERMINATION_PATH = "/dev/termination-log"
TERMINATION_MESSAGE_LIMIT = 4096  # what the kubelet keeps of a termination message
TOKEN_TTL_SECONDS = 3600


def _now() -> str:
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

    @property
    def key(self) -> str:
        return f"{self.namespace}/{self.name}"


class ConfigError(Exception):
    """The pod cannot start yet (missing Secret, ConfigMap or ServiceAccount)."""


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
        self.base_env = base_env
        self.api_host, self.api_port = api_host, api_port
        self.ca_file = ca_file
        self.default_workdir = default_workdir
        # What stands in for the image: these host paths stay visible in every
        # container even under a volume mounted over a parent (an emptyDir at /tmp
        # must not hide a venv or a checkout that happens to live under /tmp).
        self.image_paths = image_paths or []
        self.core = client.CoreV1Api()
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
                            "message": "process node is running", "lastHeartbeatTime": _now(),
                            "lastTransitionTime": _now()}],
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
            runtime = self.pods.pop(uid, None)
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
            mounts_by_volume = self._prepare_volumes(pod_dict, runtime)
            envs = {c["name"]: self._container_env(pod_dict, c) for c in pod_dict["spec"]["containers"]}
        except ConfigError as error:
            for container in runtime.containers.values():
                container.waiting_reason, container.waiting_message = "CreateContainerConfigError", str(error)
            self._write_status(pod, runtime)
            return
        runtime.started = True
        runtime.start_time = _now()
        for container_dict in pod_dict["spec"]["containers"]:
            container = runtime.containers[container_dict["name"]]
            container.waiting_reason = container.waiting_message = None
            self._launch(pod_dict, runtime, container, container_dict, envs[container.name], mounts_by_volume)
        self._write_status(pod, runtime)

    # --- volumes, env, token ---------------------------------------------------------

    def _prepare_volumes(self, pod: dict[str, Any], runtime: PodRuntime) -> dict[str, Path]:
        namespace = pod["metadata"]["namespace"]
        sources: dict[str, Path] = {}
        for volume in pod["spec"].get("volumes") or []:
            name = volume["name"]
            target = runtime.dir / "volumes" / name
            if "emptyDir" in volume:
                target.mkdir(parents=True, exist_ok=True)
                target.chmod(0o1777)
                sources[name] = target
            elif "hostPath" in volume:
                path = Path(volume["hostPath"]["path"])
                if volume["hostPath"].get("type") in ("DirectoryOrCreate", None, ""):
                    path.mkdir(parents=True, exist_ok=True)
                sources[name] = path
            elif "secret" in volume or "configMap" in volume:
                _write_files(target, self._volume_data(namespace, volume))
                sources[name] = target
            elif "projected" in volume:
                _write_files(target, self._projected_data(pod, volume["projected"]))
                runtime.projected_at = time.monotonic()
                sources[name] = target
        return sources

    def _projected_data(self, pod: dict[str, Any], projected: dict[str, Any]) -> dict[str, bytes]:
        """Files of a projected volume: what ServiceAccount admission adds to every pod."""
        files: dict[str, bytes] = {}
        for source in projected.get("sources") or []:
            if "serviceAccountToken" in source:
                token = source["serviceAccountToken"]
                files[token["path"]] = self._token(pod, token).encode()
            elif "configMap" in source or "secret" in source:
                files.update(self._volume_data(pod["metadata"]["namespace"], source))
            elif "downwardAPI" in source:
                for item in source["downwardAPI"].get("items") or []:
                    if "fieldRef" in item:
                        files[item["path"]] = _field_ref(pod, item["fieldRef"]["fieldPath"]).encode()
        return files

    def _token(self, pod: dict[str, Any], token: dict[str, Any]) -> str:
        """A real bound ServiceAccount token from the TokenRequest API."""
        account = pod["spec"].get("serviceAccountName") or "default"
        request = client.AuthenticationV1TokenRequest(spec=client.V1TokenRequestSpec(
            audiences=[token["audience"]] if token.get("audience") else [],
            expiration_seconds=token.get("expirationSeconds") or TOKEN_TTL_SECONDS,
            bound_object_ref=client.V1BoundObjectReference(
                api_version="v1", kind="Pod", name=pod["metadata"]["name"], uid=pod["metadata"]["uid"]),
        ))
        try:
            reply = self.core.create_namespaced_service_account_token(
                account, pod["metadata"]["namespace"], request)
        except ApiException as error:
            if error.status == 404:
                raise ConfigError(f'serviceaccount "{account}" not found') from None
            raise
        assert reply.status is not None
        return str(reply.status.token)

    def _volume_data(self, namespace: str, volume: dict[str, Any]) -> dict[str, bytes]:
        if "secret" in volume:
            ref = volume["secret"]
            secret = self._read("secret", namespace, ref["secretName"], ref.get("optional"))
            raw = {k: base64.b64decode(v) for k, v in ((secret.data if secret else None) or {}).items()}
        else:
            ref = volume["configMap"]
            cm = self._read("configmap", namespace, ref["name"], ref.get("optional"))
            raw = {k: v.encode() for k, v in ((cm.data if cm else None) or {}).items()}
        items = ref.get("items")
        if items:
            return {item["path"]: raw[item["key"]] for item in items if item["key"] in raw}
        return raw

    def _read(self, kind: str, namespace: str, name: str, optional: bool | None) -> Any:
        try:
            if kind == "secret":
                return self.core.read_namespaced_secret(name, namespace)
            return self.core.read_namespaced_config_map(name, namespace)
        except ApiException as error:
            if error.status == 404:
                if optional:
                    return None
                raise ConfigError(f'{kind} "{name}" not found') from None
            raise

    def _container_env(self, pod: dict[str, Any], container: dict[str, Any]) -> dict[str, str]:
        namespace = pod["metadata"]["namespace"]
        env = dict(self.base_env)
        env.update({
            "HOSTNAME": pod["metadata"]["name"],
            "KUBERNETES_SERVICE_HOST": self.api_host,
            "KUBERNETES_SERVICE_PORT": str(self.api_port),
            "KUBERNETES_SERVICE_PORT_HTTPS": str(self.api_port),
        })
        for source in container.get("envFrom") or []:
            prefix = source.get("prefix", "")
            if "secretRef" in source:
                ref = source["secretRef"]
                secret = self._read("secret", namespace, ref["name"], ref.get("optional"))
                for k, v in ((secret.data if secret else None) or {}).items():
                    env[prefix + k] = base64.b64decode(v).decode()
            elif "configMapRef" in source:
                ref = source["configMapRef"]
                cm = self._read("configmap", namespace, ref["name"], ref.get("optional"))
                env.update({prefix + k: v for k, v in ((cm.data if cm else None) or {}).items()})
        for var in container.get("env") or []:
            if "valueFrom" not in var:
                env[var["name"]] = _expand(var.get("value", ""), env)
                continue
            value = self._env_value_from(pod, var["valueFrom"])
            if value is not None:
                env[var["name"]] = value
        return env

    def _env_value_from(self, pod: dict[str, Any], source: dict[str, Any]) -> str | None:
        namespace = pod["metadata"]["namespace"]
        if "secretKeyRef" in source:
            ref = source["secretKeyRef"]
            secret = self._read("secret", namespace, ref["name"], ref.get("optional"))
            data = (secret.data if secret else None) or {}
            if ref["key"] not in data:
                if ref.get("optional"):
                    return None
                raise ConfigError(f'couldn\'t find key {ref["key"]} in Secret {namespace}/{ref["name"]}')
            return base64.b64decode(data[ref["key"]]).decode()
        if "configMapKeyRef" in source:
            ref = source["configMapKeyRef"]
            cm = self._read("configmap", namespace, ref["name"], ref.get("optional"))
            data = (cm.data if cm else None) or {}
            if ref["key"] not in data:
                if ref.get("optional"):
                    return None
                raise ConfigError(f'couldn\'t find key {ref["key"]} in ConfigMap {namespace}/{ref["name"]}')
            return str(data[ref["key"]])
        if "fieldRef" in source:
            return _field_ref(pod, source["fieldRef"]["fieldPath"])
        return None

    def _refresh_projected(self, pod: Any, runtime: PodRuntime) -> None:
        # The kubelet refreshes projected tokens at 80% of their lifetime.
        if runtime.projected_at and time.monotonic() - runtime.projected_at > 0.8 * TOKEN_TTL_SECONDS:
            self._prepare_volumes(self.core.api_client.sanitize_for_serialization(pod), runtime)

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
        argv = [_expand(a, env) for a in (spec.get("command") or []) + (spec.get("args") or [])]
        if not argv:
            container.exit_code, container.reason = 128, "ContainerCannotRun"
            container.message = "the process node has no image entrypoint: set the container's command"
            container.finished_at = _now()
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
        script = _namespace_script(mounts, security, spec.get("workingDir") or str(self.default_workdir),
                                   self.image_paths)
        container.log_path.parent.mkdir(parents=True, exist_ok=True)
        with container.log_path.open("ab") as logfile:
            container.popen = subprocess.Popen(
                ["unshare", "--mount", "--propagation", "private", "--", "/bin/sh", "-c", script, "sh", *argv],
                stdout=logfile, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                env=env, start_new_session=True,
            )
        container.started_at = _now()
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
            container.finished_at = _now()
            if container.oom_marked:
                container.reason = "OOMKilled"
            else:
                container.reason = "Completed" if container.exit_code == 0 else "Error"
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
                volumes = self._prepare_volumes(fresh, runtime)
                env = self._container_env(fresh, container.spec)
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
            body["status"] = self._status(body, runtime)
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

    def _status(self, pod: dict[str, Any], runtime: PodRuntime) -> dict[str, Any]:
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
            now = _now()

            def condition(kind: str, status: str) -> dict[str, Any]:
                return {"type": kind, "status": status, "lastTransitionTime": now, "lastProbeTime": None}

            statuses = []
            for c in containers:
                entry: dict[str, Any] = {
                    "name": c.name, "state": c.state(), "ready": c.running,
                    "restartCount": c.restart_count, "image": c.spec.get("image") or "",
                    "imageID": "", "started": c.running,
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
        elif action == "term":
            _kill_group(target.popen, signal.SIGTERM)
        elif action == "lose":
            self._lose(runtime)
        else:
            raise ValueError(f"unknown action {action!r}: use kill, oom, pause, continue, term or lose")
        return {"pod": runtime.key, "container": target.name, "pid": pid, "action": action}

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
                           "lastTransitionTime": _now()})
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


# --- helpers ------------------------------------------------------------------------


def _kill_group(popen: subprocess.Popen[bytes], sig: signal.Signals) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(popen.pid, sig)


def _expand(text: str, env: dict[str, str]) -> str:
    """Kubernetes' $(VAR) expansion in command, args and env values; $$ escapes."""
    out, i = [], 0
    while i < len(text):
        if text.startswith("$$", i):
            out.append("$")
            i += 2
        elif text.startswith("$(", i) and ")" in text[i:]:
            end = text.index(")", i)
            name = text[i + 2:end]
            out.append(env.get(name, text[i:end + 1]))
            i = end + 1
        else:
            out.append(text[i])
            i += 1
    return "".join(out)


def _field_ref(pod: dict[str, Any], path: str) -> str:
    meta, spec = pod["metadata"], pod["spec"]
    simple = {
        "metadata.name": meta.get("name"), "metadata.namespace": meta.get("namespace"),
        "metadata.uid": meta.get("uid"), "spec.nodeName": spec.get("nodeName"),
        "spec.serviceAccountName": spec.get("serviceAccountName"),
        "status.podIP": "127.0.0.1", "status.hostIP": "127.0.0.1", "status.podIPs": "127.0.0.1",
    }
    if path in simple:
        return str(simple[path] or "")
    for prefix, source in (("metadata.labels", meta.get("labels")), ("metadata.annotations", meta.get("annotations"))):
        if path.startswith(prefix + "['") and path.endswith("']"):
            return str((source or {}).get(path[len(prefix) + 2:-2], ""))
    raise ConfigError(f"unsupported fieldRef {path}")


STAGING = "/run/durablerun-processnode"


def _namespace_script(
    mounts: list[tuple[Path, str, bool]], security: dict[str, Any], workdir: str, image_paths: list[Path]
) -> str:
    """The shell run inside the container's mount namespace before exec'ing its command.

    Every source is first bound into a private staging tmpfs, so a mount over
    /tmp cannot hide a source that lives under /tmp; then each is bound to its
    target, parents before children; then the image's paths that a volume now
    covers are bound back, read-only.
    """
    covered = [p for p in image_paths if any(_under(p, Path(target)) for _, target, _ in mounts)]
    lines = ["set -e", f"mkdir -p {STAGING}", f"mount -t tmpfs -o mode=0755 durablerun-staging {STAGING}"]
    sources = [source for source, _, _ in mounts] + covered
    for index, source in enumerate(sources):
        stage = f"{STAGING}/{index}"
        lines.append(f"{'touch' if source.is_file() else 'mkdir'} {stage}")
        lines.append(f"mount --bind {shlex.quote(str(source))} {stage}")
    targets = [(target, read_only) for _, target, read_only in mounts] + [(str(p), True) for p in covered]
    for index, (target, read_only) in enumerate(targets):
        # The mount point must exist: an empty placeholder is made once where it is missing.
        make = "touch" if sources[index].is_file() else "mkdir -p"
        quoted = shlex.quote(target)
        lines.append(f"[ -e {quoted} ] || {{ mkdir -p {shlex.quote(str(Path(target).parent))}; {make} {quoted}; }}")
        lines.append(f"mount --bind {STAGING}/{index} {quoted}")
        if read_only:
            lines.append(f"mount -o remount,bind,ro {quoted}")
    if security.get("readOnlyRootFilesystem"):
        lines.append("mount -o remount,bind,ro /")
    lines.append(f"cd {shlex.quote(workdir)}")
    user, group = security.get("runAsUser"), security.get("runAsGroup")
    if user is not None:
        group = group if group is not None else user
        lines.append(f'exec setpriv --reuid={int(user)} --regid={int(group)} --clear-groups -- "$@"')
    else:
        lines.append('exec "$@"')
    return "\n".join(lines)


def _under(path: Path, parent: Path) -> bool:
    return path != parent and path.is_relative_to(parent)


def _write_files(directory: Path, files: dict[str, bytes]) -> None:
    """Write a volume's files atomically, so a running process never reads half a token."""
    directory.mkdir(parents=True, exist_ok=True)
    for name, content in files.items():
        target = directory / name
        target.parent.mkdir(parents=True, exist_ok=True)
        tmp = target.with_name(f".{target.name}.tmp")
        tmp.write_bytes(content)
        tmp.chmod(0o644)
        tmp.replace(target)


def _tail(path: Path, lines: int) -> bytes:
    try:
        return b"\n".join(path.read_bytes().splitlines()[-lines:])
    except FileNotFoundError:
        return b""


# --- control API -----------------------------------------------------------------------


def _control_server(node: ProcessNode, port: int) -> ThreadingHTTPServer:
    class Handler(BaseHTTPRequestHandler):
        def _reply(self, code: int, payload: Any) -> None:
            data = json.dumps(payload).encode()
            self.send_response(code)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def do_GET(self) -> None:
            if self.path.startswith("/processes"):
                self._reply(200, node.processes())
            elif self.path.startswith("/healthz"):
                self._reply(200, {"ok": True})
            else:
                self._reply(404, {"error": "unknown path"})

        def do_POST(self) -> None:
            url = urlparse(self.path)
            query = {k: v[0] for k, v in parse_qs(url.query).items()}
            try:
                result = node.act(url.path.strip("/"), query["namespace"], query["pod"], query.get("container"))
            except (LookupError, ValueError) as error:
                self._reply(404, {"error": str(error)})
                return
            self._reply(200, result)

        def log_message(self, format: str, *args: Any) -> None:
            log.debug(format, *args)

    server = ThreadingHTTPServer(("127.0.0.1", port), Handler)
    threading.Thread(target=server.serve_forever, name="control", daemon=True).start()
    return server


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="durablerun_testbed node", description=__doc__.splitlines()[0])
    parser.add_argument("--kubeconfig", required=True)
    parser.add_argument("--name", default="process-node")
    parser.add_argument("--state-dir", required=True, type=Path)
    parser.add_argument("--control-port", type=int, required=True)
    parser.add_argument("--workdir", type=Path, default=Path.cwd(),
                        help="working directory of containers that set no workingDir")
    parser.add_argument("--image-path", action="append", type=Path, default=[],
                        help="a host path that stands in for the image: kept visible in every container")
    parser.add_argument("--base-env", default="{}",
                        help="JSON object: the environment every container starts from (stands in for the image)")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    if os.geteuid() != 0:
        parser.error("the process node needs root: it mounts volumes in per-container mount namespaces")
    base_env = json.loads(args.base_env)
    if procs.MARKER_ENV in os.environ:  # so a leak check finds pods' processes too
        base_env[procs.MARKER_ENV] = os.environ[procs.MARKER_ENV]
    config.load_kube_config(config_file=args.kubeconfig)
    configuration = client.Configuration.get_default_copy()
    url = urlparse(configuration.host)
    if not configuration.ssl_ca_cert:
        parser.error("the kubeconfig must name the API server's CA")
    ca_file = Path(configuration.ssl_ca_cert)
    node = ProcessNode(
        node_name=args.name, state_dir=args.state_dir, base_env=base_env,
        api_host=url.hostname or "127.0.0.1", api_port=url.port or 443, ca_file=ca_file,
        default_workdir=args.workdir, image_paths=args.image_path,
    )
    server = _control_server(node, args.control_port)

    def stop(signum: int, frame: Any) -> None:
        node.shutdown()
        server.shutdown()
        raise SystemExit(0)

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    node.run_forever()
    return 0
