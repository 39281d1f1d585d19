"""The local sandbox: the test bed left running for a person with kubectl.

  python -m durablerun_testbed sandbox up      start it (prints KUBECONFIG, S3, metrics)
  python -m durablerun_testbed sandbox down    stop everything it started
  python -m durablerun_testbed sandbox status  what is running
  python -m durablerun_testbed sandbox node kill|oom|pause|continue|lose NAMESPACE POD
  python -m durablerun_testbed sandbox demo    up, the example story, down
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from durablerun_testbed import binaries, procs
from durablerun_testbed.testbed import NodeClient, TestBed

DEFAULT_DIR = binaries.REPO_ROOT / ".sandbox"
CRD = binaries.REPO_ROOT / "deploy" / "crd" / "durableruns.durablerun.dev.yaml"
EXAMPLE = binaries.REPO_ROOT / "deploy" / "samples" / "review-agent.yaml"
BUCKET = "durable-runs"


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


def _state_path(directory: Path) -> Path:
    return directory / "state.json"


def load_state(directory: Path) -> SandboxState | None:
    try:
        return SandboxState(**json.loads(_state_path(directory).read_text()))
    except FileNotFoundError:
        return None


def up(directory: Path) -> SandboxState:
    existing = load_state(directory)
    if existing and procs.processes_with_marker(existing.id):
        print(f"the sandbox is already running (state in {directory}); `make sandbox-down` stops it")
        return existing
    directory.mkdir(parents=True, exist_ok=True)
    shutil.rmtree(directory / "bed", ignore_errors=True)  # a fresh cluster and store every time
    bed = TestBed(directory / "bed", id="sandbox-" + os.urandom(4).hex()).start()
    try:
        return _provision(bed, directory)
    except BaseException:
        bed.stop()
        raise


def _provision(bed: TestBed, directory: Path) -> SandboxState:
    assert bed.s3
    assert bed.node
    assert bed.controlplane
    bed.kubectl("apply", "--server-side", "-f", str(CRD))
    bed.kubectl("wait", "--for=condition=Established", "--timeout=120s", "crd/durableruns.durablerun.dev")
    bed.s3.create_bucket(BUCKET)
    secret = bed.kubectl(
        "create", "secret", "generic", "durablerun-s3", "-n", "default", "--dry-run=client", "-o", "json",
        f"--from-literal=AWS_ACCESS_KEY_ID={bed.s3.access_key}",
        f"--from-literal=AWS_SECRET_ACCESS_KEY={bed.s3.secret_key}",
        f"--from-literal=AWS_ENDPOINT_URL_S3={bed.s3.endpoint_url}",
    ).stdout
    bed.kubectl("apply", "-f", "-", input=secret)
    operator, metrics_port = _start_operator(bed, directory)
    parts = [bed.controlplane.etcd, bed.controlplane.apiserver, bed.controlplane.controller_manager,
             bed.s3.process, bed.node_process, operator]
    state = SandboxState(
        id=bed.id, dir=str(directory), kubeconfig=str(bed.kubeconfig),
        s3_endpoint=bed.s3.endpoint_url, s3_access_key=bed.s3.access_key, s3_secret_key=bed.s3.secret_key,
        s3_bucket=BUCKET, node_url=bed.node.url, metrics_url=f"http://127.0.0.1:{metrics_port}/metrics",
        pids=[p.pid for p in parts if p is not None],
    )
    _state_path(directory).write_text(json.dumps(asdict(state), indent=2))
    _state_path(directory).chmod(0o600)
    return state


def _start_operator(bed: TestBed, directory: Path) -> tuple[procs.ManagedProcess, int]:
    """The operator as a local process with the admin kubeconfig (as `make run` does for kubebuilder)."""
    metrics_port, health_port = procs.free_port(), procs.free_port()
    operator = procs.ManagedProcess(
        "operator", [sys.executable, "-m", "durablerun_operator"],
        log_path=directory / "bed" / "logs" / "operator.log",
        env={**os.environ, "KUBECONFIG": str(bed.kubeconfig), "DURABLERUN_METRICS_PORT": str(metrics_port),
             "DURABLERUN_HEALTH_PORT": str(health_port), "DURABLERUN_RESYNC_SECONDS": "1"},
        testbed_id=bed.id,
    )

    def healthy() -> bool:
        operator.check_alive()
        with urllib.request.urlopen(f"http://127.0.0.1:{health_port}/healthz", timeout=2) as reply:
            return bool(reply.status == 200)

    procs.wait_for(healthy, timeout=60, what="the operator's /healthz")
    return operator, metrics_port


def describe(state: SandboxState) -> str:
    return "\n".join([
        "durable-run sandbox is up.",
        f"  export KUBECONFIG={state.kubeconfig}",
        "  kubectl get durableruns -A",
        f"  S3 (MinIO):   {state.s3_endpoint}  bucket {state.s3_bucket}",
        f"                access key {state.s3_access_key}, secret in {state.dir}/state.json"
        " and in Secret default/durablerun-s3",
        f"  operator:     metrics at {state.metrics_url}",
        f"  process node: {state.node_url}  (python -m durablerun_testbed sandbox node kill NAMESPACE POD)",
        f"  logs:         {state.dir}/bed/**/*.log",
        "  stop it:      make sandbox-down",
    ])


def down(directory: Path) -> None:
    state = load_state(directory)
    if state is None:
        print("no sandbox state found: nothing to stop")
        return
    for pid in state.pids:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(pid, signal.SIGTERM)
    deadline = time.monotonic() + 15
    while procs.processes_with_marker(state.id) and time.monotonic() < deadline:
        time.sleep(0.2)
    for pid, _ in procs.processes_with_marker(state.id):
        os.kill(pid, signal.SIGKILL)
    procs.wait_for(lambda: not procs.processes_with_marker(state.id), timeout=10,
                   what="every sandbox process to exit")
    _state_path(directory).unlink()
    print("sandbox stopped; nothing of it is running")


def demo(directory: Path) -> int:
    """The README's first command: the whole story with kubectl, then tear down."""
    state = up(directory)
    print(describe(state), flush=True)
    try:
        _story(state)
    finally:
        down(directory)
    return 0


def _story(state: SandboxState) -> None:
    env = dict(os.environ, KUBECONFIG=state.kubeconfig)
    kubectl = str(binaries.kubectl())
    node = NodeClient(state.node_url)
    name = "review-agent"

    def run() -> dict[str, Any]:
        out = subprocess.run([kubectl, "get", "dr", name, "-o", "json"], env=env, capture_output=True,
                             text=True, check=True).stdout
        return dict(json.loads(out))

    def status() -> dict[str, Any]:
        return dict(run().get("status") or {})

    def watch_until(what: str, done: Callable[[dict[str, Any]], bool], timeout: float = 120) -> None:
        print(f"\n# waiting until {what} (kubectl get dr, every 2s)", flush=True)
        deadline, last = time.monotonic() + timeout, ""
        while True:
            row = subprocess.run([kubectl, "get", "dr", name, "--no-headers"], env=env, capture_output=True,
                                 text=True).stdout.strip()
            if row != last:
                print(f"  {row}", flush=True)
                last = row
            if done(status()):
                return
            if time.monotonic() > deadline:
                raise SystemExit(f"demo: timed out waiting until {what}")
            time.sleep(2)

    _show(env, kubectl, "apply", "-f", str(EXAMPLE))
    watch_until("3 steps are journaled", lambda s: (s.get("progress") or {}).get("completedSteps", 0) >= 3)

    pod = str(status()["pod"])
    print(f"\n# crash: SIGKILL the runner process of pod {pod} (as an OOM kill or a node crash would)")
    print("$ python -m durablerun_testbed sandbox node kill default " + pod, flush=True)
    print("  " + json.dumps(node.kill("default", pod)), flush=True)
    watch_until("a new attempt has resumed from the checkpoint and waits for the review",
                lambda s: s.get("phase") == "Waiting")
    _show(env, kubectl, "get", "pods", "-l", f"durablerun.dev/run={name}")
    _count_executions(state)

    print("\n# a human approves the draft", flush=True)
    _show(env, kubectl, "patch", "dr", name, "--type", "merge",
          "-p", '{"spec": {"events": {"review": {"approved": true, "by": "dana"}}}}')
    watch_until("the run has succeeded", lambda s: s.get("phase") == "Succeeded")
    _show(env, kubectl, "get", "dr", "-o", "wide")
    _show(env, kubectl, "describe", "dr", name)
    print(f"\n$ curl -s {state.metrics_url} | grep 'durablerun_run_.*name=\"{name}\"'", flush=True)
    with urllib.request.urlopen(state.metrics_url, timeout=10) as reply:
        for line in reply.read().decode().splitlines():
            if f'name="{name}"' in line and not line.endswith(" 0.0"):
                print(f"  {line}")


def _count_executions(state: SandboxState) -> None:
    """Every step body logs `executing <step>`: count them across every attempt's runner log."""
    counts: dict[str, int] = {}
    for log in sorted(Path(state.dir).glob("bed/node/pods/default_review-agent-a*/runner.log")):
        for line in log.read_text(errors="replace").splitlines():
            if line.startswith("executing "):
                counts[line[len("executing "):]] = counts.get(line[len("executing "):], 0) + 1
    print("\n# step executions across all attempts (from the runner logs): only the step in flight "
          "when the pod was killed ran twice", flush=True)
    for step, count in counts.items():
        print(f"  {count}x {step}")


def _show(env: dict[str, str], kubectl: str, *args: str) -> None:
    print(f"\n$ kubectl {' '.join(args)}", flush=True)
    subprocess.run([kubectl, *args], env=env, check=True)


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="durablerun_testbed sandbox", description=__doc__)
    parser.add_argument("--dir", type=Path, default=DEFAULT_DIR, help="where state and logs live")
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("up")
    sub.add_parser("down")
    sub.add_parser("status")
    sub.add_parser("demo")
    node = sub.add_parser("node", help="act on a pod's process through the process node")
    node.add_argument("action", choices=["kill", "oom", "pause", "continue", "term", "lose"])
    node.add_argument("namespace")
    node.add_argument("pod")
    args = parser.parse_args(argv)
    directory: Path = args.dir.resolve()
    if args.command == "up":
        print(describe(up(directory)))
    elif args.command == "down":
        down(directory)
    elif args.command == "demo":
        return demo(directory)
    else:
        state = load_state(directory)
        if state is None:
            print("the sandbox is not running: `make sandbox-up` starts it", file=sys.stderr)
            return 1
        if args.command == "status":
            print(describe(state))
            for pid, cmd in procs.processes_with_marker(state.id):
                print(f"  {pid:>7}  {cmd[:110]}")
        else:
            client = NodeClient(state.node_url)
            action = {"continue": client.cont, "term": client.terminate}.get(args.action)
            result = (action or getattr(client, args.action))(args.namespace, args.pod)
            print(json.dumps(result))
    return 0
