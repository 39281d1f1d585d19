"""The local sandbox: the test bed left running for a person with kubectl.

It is one module of over 400 lines because it is one command-line tool: its
commands (up, down, status, demo, image, node faults) share the saved
:class:`SandboxState` and the helpers that read it.

  python -m durablerun_testbed sandbox up      start it (prints KUBECONFIG, S3, metrics)
  python -m durablerun_testbed sandbox down    stop everything it started
  python -m durablerun_testbed sandbox status  what is running
  python -m durablerun_testbed sandbox image DIR   your workflows (DIR's contents) in an image FROM the
                                                   runner image, on the sandbox's node (real node only)
  python -m durablerun_testbed sandbox node kill NAMESPACE POD       SIGKILL a runner container
  python -m durablerun_testbed sandbox node oom|pause|continue|lose NAMESPACE POD   (process node only)
  python -m durablerun_testbed sandbox demo    up, the example story, down
  ... up --tour / demo --tour                  and Kueue, with a queue of runs, and Jaeger with the
                                               chart's traces (real node; `make tour`)

`--node real` (the default where the machine can run it: root, containerd,
runc, the built images) runs a kubelet and containerd, and the chart's
operator in a pod, installed with helm as docs/install.md says; `--node
process` runs the process node and the operator as a local process.
"""

from __future__ import annotations

import argparse
import contextlib
import ipaddress
import json
import os
import shutil
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, TypeVar

import yaml

from durablerun import api
from durablerun_testbed import binaries, procs, realnode
from durablerun_testbed.jaeger import Jaeger, read_trace
from durablerun_testbed.kueue import Kueue
from durablerun_testbed.prometheus import Prometheus
from durablerun_testbed.testbed import NodeClient, TestBed

DEFAULT_DIR = binaries.REPO_ROOT / ".sandbox"
EXAMPLE = binaries.REPO_ROOT / "deploy" / "samples" / "review-agent.yaml"
#: What the example prints before its review's URL (examples/review_agent, with the webhook ingress on).
REVIEW_URL_SAYS = "review: POST JSON to "
#: The tour's queue: Kueue's sample queues (docs/install.md), their ClusterQueue given room for one runner.
QUEUES = binaries.REPO_ROOT / "deploy" / "samples" / "kueue" / "queues.yaml"
QUEUED_RUNS = 3
RULES = binaries.REPO_ROOT / "deploy" / "monitoring" / "durablerun-rules.yaml"
BUCKET = "durable-runs"
OPERATOR_NAMESPACE = "durable-run-system"
PYTHON = f"{binaries.REPO_ROOT / '.venv' / 'bin' / 'python'} -m durablerun_testbed"
T = TypeVar("T")


@dataclass
class SandboxState:
    id: str
    dir: str
    kubeconfig: str
    s3_endpoint: str
    s3_access_key: str
    s3_secret_key: str
    s3_bucket: str
    node_url: str
    metrics_url: str
    pids: list[int]
    #: "real" (kubelet and containerd) or "process" (the process node)
    node: str = "process"
    #: the real node's pod network (subnet, bridge) and working directory, for `down`
    subnet: str = ""
    bridge: str = ""
    node_dir: str = ""
    #: Prometheus scraping the operator, with the shipped alerting rules loaded
    prometheus_url: str = ""
    #: the webhook ingress's base URL (real node: the chart's webhooks.url, a forwarder on the bridge)
    webhooks_url: str = ""
    #: the tour's parts: Jaeger's query API (the chart's tracing points at its collector) and Kueue (the chart's
    #: kueue.enabled), both empty/False without --tour
    jaeger_url: str = ""
    kueue: bool = False


def _state_path(directory: Path) -> Path:
    return directory / "state.json"


def load_state(directory: Path) -> SandboxState | None:
    try:
        return SandboxState(**json.loads(_state_path(directory).read_text()))
    except FileNotFoundError:
        return None


def default_node() -> tuple[str, str]:
    """("real", why) where this machine can run the real node, else ("process", why not)."""
    try:
        realnode.check_machine()
        realnode.image_archives()
    except realnode.RealNodeUnavailable as reason:
        return "process", str(reason)
    return "real", "this machine runs a kubelet and containerd"


def up(directory: Path, node: str, bed_id: str = "", tour: bool = False) -> SandboxState:
    existing = load_state(directory)
    if existing and procs.processes_with_marker(existing.id):
        print(f"the sandbox is already running (state in {directory}); `make sandbox-down` stops it")
        return existing
    directory.mkdir(parents=True, exist_ok=True)
    shutil.rmtree(directory / "bed", ignore_errors=True)  # a fresh cluster and store every time
    bed_id = bed_id or "sandbox-" + os.urandom(4).hex()
    if tour and node != "real":
        raise SystemExit("the tour needs the real node (the chart's operator in a pod, Kueue admitting its pods); "
                         f"this machine runs the process node only: {default_node()[1]}")
    bed = TestBed(directory / "bed", id=bed_id).start(real_node=node == "real")
    try:
        return _provision(bed, directory, tour)
    except BaseException:
        bed.stop()
        for pid, _ in procs.processes_with_marker(bed.id):  # the sandbox's own parts: Prometheus, Kueue, Jaeger
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        raise


def _provision(bed: TestBed, directory: Path, tour: bool) -> SandboxState:
    assert bed.s3
    assert bed.controlplane
    bed.s3.create_bucket(BUCKET)
    secret = bed.kubectl(
        "create", "secret", "generic", "durablerun-s3", "-n", "default", "--dry-run=client", "-o", "json",
        f"--from-literal=AWS_ACCESS_KEY_ID={bed.s3.access_key}",
        f"--from-literal=AWS_SECRET_ACCESS_KEY={bed.s3.secret_key}",
        f"--from-literal=AWS_ENDPOINT_URL_S3={bed.s3.endpoint_url}",
    ).stdout
    bed.kubectl("apply", "-f", "-", input=secret)
    parts = [bed.controlplane.etcd, bed.controlplane.apiserver, bed.controlplane.controller_manager,
             bed.controlplane.scheduler, bed.s3.process]
    if bed.real_node:
        assert bed.network
        # The ingress's URL must be one both pods (which fetch their run's key there) and this machine reach:
        # the bridge's address on this machine, forwarded to the ingress pod (no kube-proxy, no Service IPs).
        webhooks_port = procs.free_port()
        webhooks_url = f"http://{bed.network.gateway}:{webhooks_port}"
        tour_values: list[str] = []
        tour_state: dict[str, Any] = {}
        if tour:  # Kueue before the chart (its operator then watches Workloads); Jaeger's collector on the bridge
            kueue = Kueue(directory / "bed" / "kueue", bed.id, bed.kubeconfig).start(bed.kubectl)
            jaeger = Jaeger(directory / "bed" / "jaeger", bed.id, otlp_host=str(bed.network.gateway)).start()
            parts += [kueue.process, jaeger.process]
            tour_values = ["--set", "kueue.enabled=true", "--set", f"tracing.endpoint={jaeger.otlp_endpoint}"]
            tour_state = {"jaeger_url": jaeger.query_url, "kueue": True}
        metrics_url = _install_chart(bed, directory, webhooks_url, tour_values)
        ingress = _pod_ip(bed, f"{api.LABEL_COMPONENT}=webhooks")
        forwarder = procs.ManagedProcess(
            "webhooks-forward", [sys.executable, "-m", "durablerun_testbed", "forward",
                                 f"{bed.network.gateway}:{webhooks_port}", f"127.0.0.1:{webhooks_port}",
                                 f"{ingress}:8443"],
            log_path=directory / "bed" / "logs" / "webhooks-forward.log", testbed_id=bed.id)
        parts += [bed.real_node.containerd, bed.real_node.kubelet, forwarder]
        node_url, extra = "", {"node": "real", "subnet": str(bed.network.subnet), "bridge": bed.network.bridge,
                               "node_dir": str(bed.real_node.workdir), "webhooks_url": webhooks_url, **tour_state}
    else:
        assert bed.node
        bed.install_crds()
        operator, metrics_port = _start_operator(bed, directory)
        parts += [bed.node_process, operator]
        metrics_url = f"http://127.0.0.1:{metrics_port}/metrics"
        node_url, extra = bed.node.url, {"node": "process"}
    # Prometheus as a cluster's would run it: scraping the operator, the shipped rules loaded (a run that
    # aborts shows as the DurableRunAborted alert at /alerts).
    prometheus = Prometheus(directory / "bed" / "prometheus", bed.id).start(
        [metrics_url.split("/")[2]], rule_files=[RULES], scrape_interval="5s", evaluation_interval="5s")
    parts.append(prometheus.process)
    state = SandboxState(
        id=bed.id, dir=str(directory), kubeconfig=str(bed.kubeconfig),
        s3_endpoint=bed.s3.endpoint_url, s3_access_key=bed.s3.access_key, s3_secret_key=bed.s3.secret_key,
        s3_bucket=BUCKET, node_url=node_url, metrics_url=metrics_url,
        prometheus_url=prometheus.url, pids=[p.pid for p in parts if p is not None], **extra,
    )
    _state_path(directory).write_text(json.dumps(asdict(state), indent=2))
    _state_path(directory).chmod(0o600)
    return state


def _install_chart(bed: TestBed, directory: Path, webhooks_url: str, values: list[str]) -> str:
    """`helm install` as docs/install.md says (the chart brings the CRD); runs default to the examples image,
    and the webhook ingress serves the default namespace at ``webhooks_url``; ``values``: the tour's."""
    assert bed.real_node
    examples = bed.real_node.images["examples"].rsplit(":", 1)
    env = {"PATH": "/usr/bin:/bin", "HOME": str(directory), "KUBECONFIG": str(bed.kubeconfig),
           "HELM_CACHE_HOME": str(directory / "helm"), "HELM_CONFIG_HOME": str(directory / "helm"),
           "HELM_DATA_HOME": str(directory / "helm")}
    subprocess.run([str(binaries.find("helm")), "install", "durable-run", str(binaries.REPO_ROOT / "charts" /
                    "durable-run"), "--namespace", OPERATOR_NAMESPACE, "--create-namespace",
                    "--set", f"runner.image.repository={examples[0]}", "--set", f"runner.image.tag={examples[1]}",
                    "--set", "resyncSeconds=1", "--set", "webhooks.enabled=true",
                    "--set", "webhooks.namespaces={default}", "--set", f"webhooks.url={webhooks_url}", *values,
                    "--wait", "--timeout=180s"], env=env, check=True)
    return f"http://{_pod_ip(bed, api.OPERATOR_SELECTOR)}:9090/metrics"


def _pod_ip(bed: TestBed, selector: str) -> str:
    """The address of the chart's pod that ``selector`` picks (one replica)."""
    pod = json.loads(bed.kubectl("get", "pods", "-n", OPERATOR_NAMESPACE, "-l", selector, "-o", "json").stdout)
    return str(pod["items"][0]["status"]["podIP"])


def _start_operator(bed: TestBed, directory: Path) -> tuple[procs.ManagedProcess, int]:
    """The operator as a local process with the admin kubeconfig (as `make run` does for kubebuilder)."""
    metrics_port, health_port = procs.free_port(), procs.free_port()
    operator = procs.ManagedProcess(
        "operator", [sys.executable, "-m", "durablerun_operator"],
        log_path=directory / "bed" / "logs" / "operator.log",
        env={**os.environ, "KUBECONFIG": str(bed.kubeconfig), api.OperatorEnv.METRICS_PORT: str(metrics_port),
             api.OperatorEnv.HEALTH_PORT: str(health_port), api.OperatorEnv.RESYNC_SECONDS: "1"},
        testbed_id=bed.id,
    )

    def healthy() -> bool:
        operator.check_alive()
        with urllib.request.urlopen(f"http://127.0.0.1:{health_port}/healthz", timeout=2) as reply:
            return bool(reply.status == 200)

    procs.wait_for(healthy, timeout=60, what="the operator's /healthz")
    return operator, metrics_port


def describe(state: SandboxState) -> str:
    gateway = ipaddress.IPv4Network(state.subnet).network_address + 1 if state.node == "real" else None
    node = (f"  real node:    kubelet + containerd, pods on {state.subnet} (bridge {state.bridge});\n"
            f"                the operator runs in namespace {OPERATOR_NAMESPACE} (helm release durable-run);\n"
            f"                pods reach this machine at {gateway} only (serve a model there: llm-server --host)\n"
            f"  your code:    {PYTHON} sandbox image DIR   (prints the image to name in spec.template;\n"
            f"                DIR/requirements.txt is pip-installed)\n"
            f"  crash a pod:  {PYTHON} sandbox node kill NAMESPACE POD"
            if state.node == "real" else
            f"  process node: {state.node_url}\n"
            f"  crash a pod:  {PYTHON} sandbox node kill NAMESPACE POD")
    return "\n".join([
        f"durable-run sandbox is up on the {state.node} node.",
        f"  export KUBECONFIG={state.kubeconfig}",
        "  kubectl get durableruns -A",
        f"  S3 (MinIO):   {state.s3_endpoint}  bucket {state.s3_bucket}",
        f"                access key {state.s3_access_key}, secret in {state.dir}/state.json"
        " and in Secret default/durablerun-s3",
        f"  operator:     metrics at {state.metrics_url}",
        f"  Prometheus:   {state.prometheus_url} (the shipped alerting rules at /alerts)",
        *([f"  webhooks:     {state.webhooks_url} (the ingress; ctx.webhook_url's URLs are under it)"]
          if state.webhooks_url else []),
        *([f"  traces:       Jaeger's API at {state.jaeger_url}/api/traces/<status.traceID> (one trace per run)",
           "  Kueue:        the chart's kueue.enabled; queues: kubectl apply -f deploy/samples/kueue/queues.yaml,"
           " then label a run kueue.x-k8s.io/queue-name=agents"] if state.kueue else []),
        node,
        f"  logs:         kubectl logs POD; the parts' own in {state.dir}/bed/**/*.log"
        if state.node == "real" else
        f"  logs:         {state.dir}/bed/**/*.log (the process node serves no kubectl logs)",
        "  stop it:      make sandbox-down",
    ])


def _real_node(state: SandboxState) -> realnode.RealNode:
    """The sandbox's real node, as its state file describes it (for ctr; its processes are not ours)."""
    network = realnode.PodNetwork(ipaddress.IPv4Network(state.subnet), state.bridge)
    return realnode.RealNode(workdir=Path(state.node_dir), testbed_id=state.id, network=network)


def down(directory: Path) -> None:
    state = load_state(directory)
    if state is None:
        print("no sandbox state found: nothing to stop")
        return
    node = None
    if state.node == "real":
        node = _real_node(state)
        env = dict(os.environ, KUBECONFIG=state.kubeconfig)
        kubectl = str(binaries.kubectl())
        # First the controller-manager, or the operator's ReplicaSet starts a new pod for the one drained.
        for pid in state.pids:
            if "kube-controller-manager" in _cmdline(pid):
                _stop_group(pid)
        node.drain(lambda *args: subprocess.run([kubectl, *args], env=env, capture_output=True, timeout=30))
    for pid in state.pids:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(pid, signal.SIGTERM)
    deadline = time.monotonic() + 15
    while procs.processes_with_marker(state.id) and time.monotonic() < deadline:
        time.sleep(0.2)
    for pid, _ in procs.processes_with_marker(state.id):
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    procs.wait_for(lambda: not procs.processes_with_marker(state.id), timeout=10,
                   what="every sandbox process to exit")
    remains = []
    if node:
        realnode.clean_up(node.workdir, node.network, state.id)
        remains = realnode.remains(node.workdir, node.network, state.id)
    if remains:
        raise SystemExit("sandbox down left behind:\n  " + "\n  ".join(remains))
    _state_path(directory).unlink()
    print("sandbox stopped; nothing of it is running" + (" (no process, cgroup, mount or bridge)" if node else ""))


def _cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
    except FileNotFoundError:
        return ""


def _stop_group(pid: int, timeout: float = 10) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.killpg(pid, signal.SIGTERM)
    with contextlib.suppress(procs.Timeout):
        procs.wait_for(lambda: not procs.pid_alive(pid), timeout=timeout, what=f"process {pid} to exit")


@dataclass
class Story:
    """What the demo showed, for a test to check: the phases the run went through, the pod that was crashed,
    how often each step ran across every attempt, the run's Events and its status at the end."""

    state: SandboxState
    crashed_pod: str
    journaled_before_crash: int
    phases: list[str]
    executions: dict[str, int]
    events: list[dict[str, Any]]
    status: dict[str, Any]
    #: how the review reached the run: "webhook" (its capability URL, through the ingress) or "kubectl"
    reviewed_through: str
    #: the alerting rules the sandbox's Prometheus evaluated once it had scraped the operator
    alerting_rules: list[str]
    #: the tour's: the queue's runs, and the run's trace as Jaeger holds it (None without --tour)
    queue: QueueStory | None = None
    trace: dict[str, Any] | None = None


@dataclass
class QueueStory:
    """The tour's queue, as the API server showed it: QUEUED_RUNS runs in a queue with room for one runner."""

    #: the most runner pods of these runs that were live (not ended) at once
    most_pods: int
    #: the runs seen Queued (waiting for Kueue's admission) while another had the slot
    seen_queued: list[str]
    #: each run's phase at the end
    phases: dict[str, str]


def demo(directory: Path, node: str, bed_id: str = "", tour: bool = False) -> Story:
    """The README's first command: the whole story with kubectl, then tear down. The tour adds a queue of runs
    through Kueue and the crashed run's trace from Jaeger."""
    state = up(directory, node, bed_id, tour)
    print(describe(state), flush=True)
    try:
        story = _story(state)
        if state.kueue:
            story.trace = _trace_story(state, story.status)
            story.queue = _queue_story(state)
    finally:
        down(directory)
    return story


def kill(state: SandboxState, namespace: str, pod: str) -> dict[str, Any]:
    """SIGKILL the runner container of ``pod``: its process, through containerd or the process node."""
    if state.node != "real":
        return _on_process_node("kill", namespace, pod, NodeClient(state.node_url).kill)
    env = dict(os.environ, KUBECONFIG=state.kubeconfig)
    got = subprocess.run([str(binaries.kubectl()), "get", "pod", pod, "-n", namespace, "-o", "json"],
                         env=env, capture_output=True, text=True, check=False)
    if got.returncode != 0:  # most often: the pod is gone (the run moved on to its next attempt)
        raise SystemExit(f"no pod {namespace}/{pod} to kill: {got.stderr.strip()} (kubectl get pods -n {namespace} "
                         "lists the run's pods)")
    body = json.loads(got.stdout)
    running = [c for c in body["status"].get("containerStatuses", []) if "running" in c.get("state", {})]
    if not running:
        raise SystemExit(f"pod {namespace}/{pod} has no running container to kill")
    try:
        _real_node(state).kill_container(running[0]["containerID"])
    except RuntimeError as error:  # it ended between the kubelet's report and the kill
        raise SystemExit(f"pod {namespace}/{pod}'s container {running[0]['name']} ended before the kill "
                         f"reached it ({error})") from None
    return {"pod": pod, "container": running[0]["name"], "signal": "SIGKILL"}


class _LogFollower:
    """`kubectl logs -f POD` in the background: the container's whole log, kept after the pod is gone."""

    def __init__(self, env: dict[str, str], kubectl: str, pod: str) -> None:
        self.process = subprocess.Popen([kubectl, "logs", "-f", "--pod-running-timeout=60s", pod], env=env,
                                        stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)

    def lines(self) -> list[str]:
        out, _ = self.process.communicate(timeout=60)
        return out.splitlines()


def _story(state: SandboxState) -> Story:
    env = dict(os.environ, KUBECONFIG=state.kubeconfig)
    kubectl = str(binaries.kubectl())
    name = "review-agent"
    phases: list[str] = []

    def run() -> dict[str, Any]:
        out = subprocess.run([kubectl, "get", "dr", name, "-o", "json"], env=env, capture_output=True,
                             text=True, check=True).stdout
        return dict(json.loads(out))

    def status() -> dict[str, Any]:
        return dict(run().get("status") or {})

    def watch_until(what: str, done: Callable[[dict[str, Any]], bool]) -> dict[str, Any]:
        print(f"\n# waiting until {what} (kubectl get dr, every 2s)", flush=True)

        def look() -> tuple[str, dict[str, Any]]:
            row = subprocess.run([kubectl, "get", "dr", name, "--no-headers"], env=env, capture_output=True,
                                 text=True).stdout.strip()
            current = status()
            if current.get("phase") and current["phase"] not in phases[-1:]:
                phases.append(current["phase"])
            return row, current

        return _watch(what, look, done, timeout=180, every=2)

    _show(env, kubectl, "apply", "-f", str(EXAMPLE))
    # The runner reports progress with its lease renewals (every leaseDuration/3), so the status can lag the
    # journal by a renewal: crash early enough that steps are still left to run when the kill lands.
    first = watch_until("2 steps are journaled", lambda s: (s.get("progress") or {}).get("completedSteps", 0) >= 2)
    pod = str(first["pod"])
    if state.jaeger_url:  # the tour: the trace shows the steps as they are journaled, before any crash
        _steps_in_trace(state, first)
    followers = [_LogFollower(env, kubectl, pod)] if state.node == "real" else []
    print(f"\n# crash: SIGKILL the runner container of pod {pod} (as an OOM kill or a node crash would)")
    print(f"$ {PYTHON} sandbox node kill default {pod}", flush=True)
    print("  " + json.dumps(kill(state, "default", pod)), flush=True)
    second = watch_until("a new attempt runs", lambda s: s.get("pod") not in (None, pod))
    if state.node == "real":
        followers.append(_LogFollower(env, kubectl, str(second["pod"])))
    watch_until("it has resumed from the checkpoint and waits for the review",
                lambda s: s.get("phase") == api.Phase.WAITING)
    _show(env, kubectl, "get", "pods", "-l", f"{api.LABEL_RUN}={name}")
    if followers:
        lines = [line for follower in followers for line in follower.lines()]
        executions = _count_executions(lines, "kubectl logs")
    else:
        logs = sorted(Path(state.dir).glob("bed/node/pods/default_review-agent-a*/runner.log"))
        lines = [line for log in logs for line in log.read_text(errors="replace").splitlines()]
        executions = _count_executions(lines, "the runner logs")

    review = {"approved": True, "by": "dana"}
    urls = [line.split(REVIEW_URL_SAYS, 1)[1].strip() for line in lines if REVIEW_URL_SAYS in line]
    if urls:  # the chart's webhook ingress is on: the review comes over HTTP, as from any outside system
        print("\n# a human approves the draft through the run's webhook URL (its log printed it)", flush=True)
        print(f"$ curl -X POST -H 'Content-Type: application/json' -d '{json.dumps(review)}' {urls[-1]}")
        request = urllib.request.Request(urls[-1], data=json.dumps(review).encode(), method="POST",
                                         headers={"Content-Type": "application/json"})
        with urllib.request.urlopen(request, timeout=30) as reply:
            print(f"  HTTP {reply.status} {reply.read().decode().strip()}", flush=True)
    else:
        print("\n# a human approves the draft", flush=True)
        _show(env, kubectl, "patch", "dr", name, "--type", "merge",
              "-p", json.dumps({"spec": {"events": {"review": review}}}))
    final = watch_until("the run has succeeded", lambda s: s.get("phase") == api.Phase.SUCCEEDED)
    _show(env, kubectl, "get", "dr", "-o", "wide")
    _show(env, kubectl, "describe", "dr", name)
    print(f"\n$ curl -s {state.metrics_url} | grep 'durablerun_run_.*name=\"{name}\"'", flush=True)
    with urllib.request.urlopen(state.metrics_url, timeout=10) as reply:
        for line in reply.read().decode().splitlines():
            if f'name="{name}"' in line and not line.endswith(" 0.0"):
                print(f"  {line}")
    events = json.loads(subprocess.run([kubectl, "get", "events", "--field-selector", f"involvedObject.name={name}",
                                        "-o", "json"], env=env, capture_output=True, text=True, check=True).stdout)
    alerting = _prometheus_sees_the_operator(state)
    return Story(state, pod, int(first["progress"]["completedSteps"]), phases, executions,
                 list(events["items"]), final, "webhook" if urls else "kubectl", alerting)


def _queue_story(state: SandboxState) -> QueueStory:
    """Kueue's sample queues, given room for one runner of 1 CPU, and QUEUED_RUNS runs asking 1 CPU each: one has
    a pod at a time, the others show Queued until Kueue admits them."""
    env = dict(os.environ, KUBECONFIG=state.kubeconfig)
    kubectl = str(binaries.kubectl())
    print("\n# a fleet through Kueue: its sample queues, the ClusterQueue given room for one runner of 1 CPU",
          flush=True)
    _show(env, kubectl, "apply", "-f", str(QUEUES))
    room = {"spec": {"resourceGroups": [{"coveredResources": ["cpu", "memory"], "flavors": [{
        "name": "durablerun-default", "resources": [{"name": "cpu", "nominalQuota": "1"},
                                                    {"name": "memory", "nominalQuota": "8Gi"}]}]}]}}
    _show(env, kubectl, "patch", "clusterqueue", "durablerun-runners", "--type", "merge", "-p", json.dumps(room))
    procs.wait_for(lambda: "True" in subprocess.run(
        [kubectl, "get", "localqueue", "agents", "-o", "jsonpath={.status.conditions[?(@.type=='Active')].status}"],
        env=env, capture_output=True, text=True).stdout, timeout=60, interval=1, what="the LocalQueue to be active")
    names = [f"digest-{i}" for i in range(1, QUEUED_RUNS + 1)]
    example = yaml.safe_load(EXAMPLE.read_text())["spec"]
    runs = [{"apiVersion": api.API_VERSION, "kind": api.KIND,
             "metadata": {"name": name, "labels": {"kueue.x-k8s.io/queue-name": "agents"}},
             "spec": {"workflow": "fake_llm_research:research", "input": {"topic": f"durable execution {i}"},
                      "checkpoint": example["checkpoint"], "policy": {"leaseDuration": "15s"},
                      "template": {"spec": {"containers": [{"name": "runner", "resources": {
                          "requests": {"cpu": "1", "memory": "256Mi"}}}]}}}}
            for i, name in enumerate(names, 1)]
    print(f"\n$ kubectl apply -f -   # {QUEUED_RUNS} research runs labelled kueue.x-k8s.io/queue-name=agents, "
          "each asking 1 CPU", flush=True)
    subprocess.run([kubectl, "apply", "-f", "-"], env=env, input=json.dumps({"apiVersion": "v1", "kind": "List",
                   "items": runs}), text=True, check=True)
    print("\n# waiting until all have succeeded (kubectl get dr, every second)", flush=True)
    most_pods, queued, shown = 0, set[str](), False

    def look() -> tuple[str, dict[str, str]]:
        nonlocal most_pods, shown
        listed = json.loads(subprocess.run([kubectl, "get", "dr", "-l", "kueue.x-k8s.io/queue-name=agents", "-o",
                                            "json"], env=env, capture_output=True, text=True, check=True).stdout)
        phases = {r["metadata"]["name"]: (r.get("status") or {}).get("phase", "") for r in listed["items"]}
        pods = json.loads(subprocess.run([kubectl, "get", "pods", "-l", f"{api.LABEL_RUN} in ({','.join(names)})",
                                          "-o", "json"], env=env, capture_output=True, text=True, check=True).stdout)
        live = [pod for pod in pods["items"]
                if pod["status"].get("phase") not in ("Succeeded", "Failed")]  # literal-ok: the pods' phases
        most_pods = max(most_pods, len(live))
        queued.update(name for name, phase in phases.items() if phase == api.Phase.QUEUED)
        if not shown and {api.Phase.RUNNING, api.Phase.QUEUED} <= set(phases.values()):
            _show(env, kubectl, "get", "workloads")  # one admitted, the others pending
            shown = True
        return "  ".join(f"{name} {phase or '-'}" for name, phase in sorted(phases.items())), phases

    phases = _watch("the queued runs have finished", look,
                    lambda now: len(now) == QUEUED_RUNS and all(p and api.Phase(p).finished for p in now.values()),
                    timeout=240, every=1)
    print(f"\n# at most {most_pods} live runner pod(s) at once; seen Queued: {', '.join(sorted(queued)) or 'none'}",
          flush=True)
    return QueueStory(most_pods, sorted(queued), phases)


def _watch(what: str, look: Callable[[], tuple[str, T]], done: Callable[[T], bool], *, timeout: float,
           every: float) -> T:
    """Print the row ``look`` shows each time it changes, until ``done`` holds for what it found; a clear
    SystemExit after ``timeout`` seconds (the sandbox's commands print no traceback)."""
    deadline, last = time.monotonic() + timeout, ""
    while True:
        row, found = look()
        if row != last:
            print(f"  {row}", flush=True)
            last = row
        if done(found):
            return found
        if time.monotonic() > deadline:
            raise SystemExit(f"demo: timed out waiting until {what}")
        time.sleep(every)


def _steps_in_trace(state: SandboxState, status: dict[str, Any]) -> None:
    """Waits until Jaeger holds a span for each step ``status`` shows journaled. A runner sends its spans every
    second; a container killed whole loses those it had not sent (docs/metrics.md, "Traces")."""
    journaled = int(status["progress"]["completedSteps"])

    def steps() -> list[str] | None:
        found = read_trace(state.jaeger_url, status["traceID"])
        names = [span["operationName"] for span in found["spans"] if span["operationName"].startswith("step ")] \
            if found else []
        return names if len(names) >= journaled else None

    names = procs.wait_for(steps, timeout=30, interval=0.5, what="the journaled steps' spans in Jaeger")
    print(f"\n# the run's trace already holds them: {', '.join(sorted(names))} ({state.jaeger_url})", flush=True)


def _trace_story(state: SandboxState, status: dict[str, Any]) -> dict[str, Any]:
    """The run's trace as Jaeger holds it: both attempts' steps (the crashed one's journaled steps too) and the
    operator's decisions, in one trace named in status.traceID."""
    url = f"{state.jaeger_url}/api/traces/{status['traceID']}"
    print(f"\n# the run's trace: one per run, every attempt and the operator's decisions\n$ curl -s {url}", flush=True)

    def trace() -> dict[str, Any] | None:
        found = read_trace(state.jaeger_url, status["traceID"])
        spans = found["spans"] if found else []
        # The crashed attempt's span is ended by the next attempt, from the journal the crashed one left.
        attempts = [span for span in spans if span["operationName"] == "attempt"]
        done = any(span["operationName"].startswith("operator ") for span in spans) and len(attempts) >= 2
        return found if done else None

    found = procs.wait_for(trace, timeout=60, interval=1, what="the run's trace in Jaeger")
    spans = sorted(found["spans"], key=lambda span: span["startTime"])  # µs since the epoch
    print("  start    took  span")
    for span in spans:
        print(f"  {(span['startTime'] - spans[0]['startTime']) / 1e6:6.1f}s {span['duration'] / 1e6:6.1f}s  "
              f"{span['operationName']}")
    return found


def _prometheus_sees_the_operator(state: SandboxState) -> list[str]:
    """Waits until Prometheus has scraped the operator; prints and returns the alerting rules it evaluates."""
    def get(path: str) -> Any:
        with urllib.request.urlopen(f"{state.prometheus_url}/api/v1/{path}", timeout=10) as reply:
            return json.load(reply)["data"]

    print(f"\n# Prometheus ({state.prometheus_url}) scrapes the operator and evaluates the shipped alerts", flush=True)
    procs.wait_for(lambda: any(r["value"][1] == "1" for r in get("query?query=up")["result"]), timeout=60,
                   interval=1, what="Prometheus to scrape the operator")
    alerts = [rule["name"] for group in get("rules?type=alert")["groups"] for rule in group["rules"]]
    print(f"  up 1; {len(alerts)} alerting rules, e.g. {', '.join(alerts[:3])} (see {state.prometheus_url}/alerts)")
    return alerts


def _count_executions(lines: list[str], source: str) -> dict[str, int]:
    """Every step body logs `executing <step>`: count them across every attempt."""
    counts: dict[str, int] = {}
    for line in lines:
        if line.startswith("executing "):
            counts[line[len("executing "):]] = counts.get(line[len("executing "):], 0) + 1
    print(f"\n# step executions across all attempts (from {source}): only the step in flight "
          "when the pod was killed ran twice", flush=True)
    for step, count in counts.items():
        print(f"  {count}x {step}")
    return counts


def image(state: SandboxState, directory: Path) -> str:
    """Build DIR's workflows into an image FROM the runner image and import it into the sandbox's node."""
    if state.node != "real":
        raise SystemExit("`sandbox image` needs the real node (`make sandbox-up` on a machine that runs it): "
                         "the process node runs no images")
    try:
        archive, ref = realnode.build_workflow_image(directory)
    except RuntimeError as error:
        raise SystemExit(str(error)) from None
    _real_node(state).import_image(archive)
    return ref


def _show(env: dict[str, str], kubectl: str, *args: str) -> None:
    print(f"\n$ kubectl {' '.join(args)}", flush=True)
    subprocess.run([kubectl, *args], env=env, check=True)


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="durablerun_testbed sandbox", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--dir", type=Path, default=DEFAULT_DIR, help="where state and logs live")
    sub = parser.add_subparsers(dest="command", required=True)
    for command in ("up", "demo"):
        started = sub.add_parser(command)
        started.add_argument("--node", choices=["real", "process"],
                             help="the kubelet and containerd, or the process node (default: real where the "
                                  "machine runs it)")
        started.add_argument("--tour", action="store_true",
                             help="also Kueue and Jaeger (real node; hack/build-binaries.sh kueue jaeger first)")
    sub.add_parser("down")
    sub.add_parser("status")
    built = sub.add_parser("image", help="your workflows in an image FROM the runner image, on the node")
    built.add_argument("path", type=Path, help="the folder you would put on PYTHONPATH; its contents go to /app")
    node = sub.add_parser("node", help="act on a pod's runner container")
    node.add_argument("action", choices=["kill", "oom", "pause", "continue", "term", "lose"])
    node.add_argument("namespace")
    node.add_argument("pod")
    args = parser.parse_args(argv)
    directory: Path = args.dir.resolve()
    if args.command in ("up", "demo"):
        kind, why = default_node()
        if args.node == "real" and kind != "real":
            print(why, file=sys.stderr)
            return 1
        kind = args.node or kind
        print(f"sandbox node: {kind} ({why})" if kind == "real" or not args.node else f"sandbox node: {kind}",
              flush=True)
        if args.command == "demo":
            demo(directory, kind, tour=args.tour)
            return 0
        print(describe(up(directory, kind, tour=args.tour)))
    elif args.command == "down":
        down(directory)
    else:
        state = load_state(directory)
        if state is None:
            print("the sandbox is not running: `make sandbox-up` starts it", file=sys.stderr)
            return 1
        if args.command == "status":
            print(describe(state))
            for pid, cmd in procs.processes_with_marker(state.id) + realnode.cgroup_processes(state.id):
                print(f"  {pid:>7}  {cmd[:110]}")
        elif args.command == "image":
            print(image(state, args.path))
        elif args.action == "kill":
            print(json.dumps(kill(state, args.namespace, args.pod)))
        elif state.node == "real":
            print(f"`node {args.action}` is the process node's; on the real node use kubectl (delete, drain, "
                  "evict) or a memory limit for a real OOM kill", file=sys.stderr)
            return 2
        else:
            client = NodeClient(state.node_url)
            action = {"continue": client.cont, "term": client.terminate}.get(args.action)
            print(json.dumps(_on_process_node(args.action, args.namespace, args.pod,
                                              action or getattr(client, args.action))))
    return 0


def _on_process_node(action: str, namespace: str, pod: str,
                     call: Callable[[str, str], dict[str, Any]]) -> dict[str, Any]:
    """The process node's answer to ``action`` on ``pod``, or a sentence (exit 1) where it refused or is gone."""
    try:
        return call(namespace, pod)
    except urllib.error.HTTPError as error:  # 404: no such pod (the run moved on to its next attempt)
        try:
            why = json.loads(error.read() or b"{}").get("error") or error.reason
        except ValueError:
            why = error.reason
        raise SystemExit(f"no pod {namespace}/{pod} to {action} on the process node: {why} (kubectl get pods -n "
                         f"{namespace} lists the run's pods)") from None
    except urllib.error.URLError as error:
        raise SystemExit(f"the process node does not answer ({error.reason}): is the sandbox up? "
                         "(make sandbox-up)") from None
