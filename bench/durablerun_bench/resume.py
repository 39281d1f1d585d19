"""Resume on the test bed: SIGKILL a runner pod's process, time until the new attempt runs its first new step.

A DurableRun runs ``dr_flows:steps`` on MinIO through the real operator, the
real API server and the process node, and again on the real node (a kubelet
and containerd running ``dr_flows`` in a workflow image FROM the runner image;
the SIGKILL goes to the container's task through containerd). Its steps mark when they start in a
file on a hostPath volume. Once ``kill_after`` steps are journaled the process
node SIGKILLs the runner (exit 137, like a crash); the harness watches the
DurableRun and its pods and reads the marks, and splits crash → first new step
into:

* detection: SIGKILL → the operator has recorded the crash (status.restarts + 1)
* pod creation: → the next attempt's pod exists (the crash backoff is set to 0s
  here: ``policy.backoff.initial`` is 10s by default, a policy choice, not overhead)
* process start: → the node has started the runner process (the process node's
  fork and exec; the kubelet's sandbox, network and container start)
* runner start: → the runner holds the lease (interpreter, imports, API calls)
* load: → the workflow function is entered (store, manifest, snapshot, journal tail)
* replay: → the first step that was not journaled starts executing
"""

from __future__ import annotations

import json
import statistics
import sys
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from durablerun import api
from durablerun_bench import dr_flows
from durablerun_operator import kueue
from durablerun_testbed import procs
from durablerun_testbed.testbed import TestBed

BENCH_DIR = Path(__file__).resolve().parent.parent


class Watcher:
    """Records (arrival time, event type, object) for DurableRuns and pods of one namespace (and its Kueue
    Workloads, with ``kinds`` naming ``workload``)."""

    def __init__(self, bed: TestBed, namespace: str,
                 reduce: Callable[[str, dict[str, Any]], dict[str, Any]] | None = None,
                 kinds: tuple[str, ...] = ("dr", "pod")) -> None:
        self.bed, self.namespace = bed, namespace
        self.reduce = reduce or (lambda _kind, obj: obj)
        self.events: list[tuple[float, str, str, dict[str, Any]]] = []
        self.lock = threading.Lock()
        self._stop = threading.Event()
        self._threads = [threading.Thread(target=self._loop, args=(kind,), daemon=True) for kind in kinds]

    def start(self) -> Watcher:
        for thread in self._threads:
            thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()

    def _loop(self, kind: str) -> None:
        from kubernetes import client, watch
        from kubernetes.client.exceptions import ApiException

        api_client = self.bed.api_client()
        # Each reconnect resumes from the last resourceVersion seen: relisting every 30 s would cost the API
        # server a LIST of every object (100,000 waiting runs in the scale section) and pollute its figures.
        version: str | None = None
        while not self._stop.is_set():
            try:
                if kind == "dr":
                    fn: Any = client.CustomObjectsApi(api_client).list_namespaced_custom_object
                    args: tuple[Any, ...] = (api.GROUP, api.VERSION, self.namespace, api.PLURAL)
                elif kind == "workload":
                    fn = client.CustomObjectsApi(api_client).list_namespaced_custom_object
                    args = (kueue.GROUP, kueue.VERSION, self.namespace, kueue.WORKLOADS)
                else:
                    fn, args = client.CoreV1Api(api_client).list_namespaced_pod, (self.namespace,)
                w = watch.Watch()
                resume = {"resource_version": version} if version else {}
                for event in w.stream(fn, *args, timeout_seconds=30, allow_watch_bookmarks=True, **resume):
                    now = time.time()
                    obj = event["object"]
                    if not isinstance(obj, dict):
                        obj = api_client.sanitize_for_serialization(obj)
                    version = obj.get("metadata", {}).get("resourceVersion") or version
                    if event["type"] == "BOOKMARK":
                        continue
                    with self.lock:
                        self.events.append((now, kind, event["type"], self.reduce(kind, obj)))
                    if self._stop.is_set():
                        w.stop()
                        break
            except ApiException as error:
                if error.status == 410:
                    version = None  # too old: list again
                time.sleep(0.1)
            except Exception:  # a watch can drop; it restarts where it was
                time.sleep(0.1)

    def snapshot(self) -> list[tuple[float, str, str, dict[str, Any]]]:
        """The events seen so far, copied: the watch threads go on appending while a caller reads them."""
        with self.lock:
            return list(self.events)

    def first(self, kind: str, after: float, predicate: Any) -> float | None:
        for when, k, _type, obj in self.snapshot():
            if k == kind and when >= after and predicate(obj):
                return when
        return None


def _marks(path: Path) -> list[tuple[str, int, float]]:
    if not path.exists():
        return []
    out = []
    for line in path.read_text().splitlines():
        parts = line.split()
        if len(parts) == 3:
            out.append((parts[0], int(parts[1]), float(parts[2])))
    return out


@contextmanager
def operator(bed: TestBed, namespace: str, root: Path, run_id: str,
             env: dict[str, str] | None = None) -> Iterator[procs.ManagedProcess]:
    """The operator for ``namespace``, with ``env`` added to its environment."""
    metrics_port, health_port = procs.free_port(), procs.free_port()
    process = procs.ManagedProcess(
        "operator", [sys.executable, "-m", "durablerun_operator", "--namespace", namespace],
        log_path=root / f"operator-{namespace}.log",
        env={**bed.env(), api.OperatorEnv.METRICS_PORT: str(metrics_port),
             api.OperatorEnv.HEALTH_PORT: str(health_port), api.OperatorEnv.LOG_LEVEL: "WARNING", **(env or {})},
        testbed_id=run_id,
    )

    def healthy() -> bool:
        import urllib.request

        process.check_alive()
        with urllib.request.urlopen(f"http://127.0.0.1:{health_port}/healthz", timeout=2) as reply:
            return bool(reply.status == 200)

    try:
        procs.wait_for(healthy, timeout=60, what="the operator's /healthz")
        yield process
    finally:
        process.stop()


def prepare_namespace(bed: TestBed, namespace: str, bucket: str | None = None) -> None:
    bed.kubectl("create", "namespace", namespace)
    procs.wait_for(lambda: bed.kubectl("get", "serviceaccount", "default", "-n", namespace,
                                       check=False).returncode == 0, timeout=30, what="the default ServiceAccount")
    if bucket is not None:
        assert bed.s3
        bed.s3.create_bucket(bucket)
        bed.kubectl("create", "secret", "generic", "s3-credentials", "-n", namespace,
                    f"--from-literal=AWS_ACCESS_KEY_ID={bed.s3.access_key}",
                    f"--from-literal=AWS_SECRET_ACCESS_KEY={bed.s3.secret_key}")


def manifest(bed: TestBed, namespace: str, name: str, bucket: str, marks_dir: Path,
             input: dict[str, Any], image: str | None = None) -> dict[str, Any]:
    assert bed.s3
    runner: dict[str, Any] = {"image": image} if image else {}
    return {
        "apiVersion": api.API_VERSION, "kind": "DurableRun",
        "metadata": {"name": name, "namespace": namespace},
        "spec": {
            "workflow": "durablerun_bench.dr_flows:steps",
            "input": input,
            "checkpoint": {"uri": f"s3://{bucket}/runs", "endpoint": bed.s3.endpoint_url,
                           "credentialsSecret": "s3-credentials", "region": "us-east-1"},
            "policy": {"backoff": {"initial": "0s", "max": "1s"}},
            "template": {"spec": {"containers": [{
                "name": "runner", **runner,
                "env": [{"name": "PYTHONPATH", "value": "/app" if image else str(BENCH_DIR)},
                        {"name": dr_flows.MARK_ENV, "value": "/tmp/marks/marks.txt"},
                        {"name": dr_flows.STEP_MARKS_ENV, "value": "1"},
                        {"name": api.Env.LOG_LEVEL, "value": "WARNING"}],
                "volumeMounts": [{"name": "marks", "mountPath": "/tmp/marks"}],
            }], "volumes": [{"name": "marks", "hostPath": {"path": str(marks_dir)}}]}},
        },
    }


Kill = Callable[[TestBed, str, str], None]


def kill_process(bed: TestBed, namespace: str, pod: str) -> None:
    """The process node SIGKILLs the runner process."""
    assert bed.node
    bed.node.kill(namespace, pod)


def kill_container(bed: TestBed, namespace: str, pod: str) -> None:
    """containerd SIGKILLs the runner container's task on the real node."""
    assert bed.real_node
    body = json.loads(bed.kubectl("get", "pod", pod, "-n", namespace, "-o", "json").stdout)
    bed.real_node.kill_container(body["status"]["containerStatuses"][0]["containerID"])


def one(bed: TestBed, watcher: Watcher, namespace: str, bucket: str, root: Path, *, steps: int,
        kill_after: int, sleep: float, kill: Kill = kill_process, image: str | None = None) -> dict[str, float]:
    name = f"resume-{uuid.uuid4().hex[:6]}"
    marks_dir = root / name
    marks_dir.mkdir(parents=True)
    marks_dir.chmod(0o777)
    marks = marks_dir / "marks.txt"
    bed.kubectl("apply", "-f", "-", input=json.dumps(
        manifest(bed, namespace, name, bucket, marks_dir, {"n": steps, "sleep": sleep}, image)))
    procs.wait_for(lambda: any(w == f"step{kill_after}" for w, _, _ in _marks(marks)), timeout=120,
                   what=f"step {kill_after} of {name}")
    first_pid = next(pid for w, pid, _ in _marks(marks) if w == "process")
    t_kill = time.time()
    kill(bed, namespace, f"{name}-a1")
    new = procs.wait_for(lambda: [m for m in _marks(marks) if m[1] != first_pid and m[0].startswith("step")],
                         timeout=120, what=f"the new attempt of {name} to run a step")
    t_first = new[0][2]
    by_new = {w: t for w, pid, t in _marks(marks) if pid != first_pid}
    pod2 = f"{name}-a2"
    t_detect = watcher.first("dr", t_kill, lambda o: ((o.get("status") or {}).get("restarts") or 0) >= 1)
    t_pod = watcher.first("pod", t_kill, lambda o: o["metadata"]["name"] == pod2)
    t_lease = watcher.first("dr", t_kill, lambda o: (((o.get("status") or {}).get("lease") or {})
                                                     .get("holder")) == pod2)
    replayed = int(new[0][0][len("step"):])
    procs.wait_for(lambda: _phase(bed, namespace, name) == api.Phase.SUCCEEDED, timeout=120, what=f"{name} to succeed")
    bed.kubectl("delete", "dr", name, "-n", namespace, "--wait=false")
    if None in (t_detect, t_pod, t_lease):
        raise RuntimeError(f"missed a watch event: detect={t_detect} pod={t_pod} lease={t_lease}")
    assert t_detect is not None
    assert t_pod is not None
    assert t_lease is not None
    return {
        "detection_s": t_detect - t_kill,
        "pod_creation_s": t_pod - t_detect,
        "process_start_s": by_new["process"] - t_pod,
        "runner_start_s": t_lease - by_new["process"],
        "load_s": by_new["entry"] - t_lease,
        "replay_s": t_first - by_new["entry"],
        "total_s": t_first - t_kill,
        "journaled_steps": replayed,
    }


def _phase(bed: TestBed, namespace: str, name: str) -> str | None:
    out = bed.kubectl("get", "dr", name, "-n", namespace, "-o", "jsonpath={.status.phase}", check=False)
    return out.stdout.strip() or None


def bench(bed: TestBed, root: Path, run_id: str, *, repeats: int, steps: int, kill_after: int,
          sleep: float, log: Any = print, kill: Kill = kill_process, image: str | None = None) -> dict[str, Any]:
    namespace, bucket = f"bench-resume-{uuid.uuid4().hex[:4]}", f"bench-resume-{uuid.uuid4().hex[:8]}"
    prepare_namespace(bed, namespace, bucket)
    watcher = Watcher(bed, namespace).start()
    samples = []
    try:
        with operator(bed, namespace, root, run_id):
            for i in range(repeats):
                sample = one(bed, watcher, namespace, bucket, root, steps=steps, kill_after=kill_after, sleep=sleep,
                             kill=kill, image=image)
                samples.append(sample)
                log(f"  [{i + 1}/{repeats}] SIGKILL -> first new step {sample['total_s']:.2f}s " + ", ".join(
                    f"{k[:-2]} {v:.2f}" for k, v in sample.items() if k.endswith("_s") and k != "total_s"))
    finally:
        watcher.stop()
        bed.kubectl("delete", "namespace", namespace, "--wait=false", check=False)
    keys = samples[0].keys()
    return {"samples": samples, "median": {k: statistics.median(s[k] for s in samples) for k in keys},
            "steps": steps, "kill_after": kill_after, "step_sleep_s": sleep}
