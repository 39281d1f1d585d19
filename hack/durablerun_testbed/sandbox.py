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
import signal
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path

from durablerun_testbed import binaries, procs
from durablerun_testbed.testbed import NodeClient, TestBed

DEFAULT_DIR = binaries.REPO_ROOT / ".sandbox"
CRD = binaries.REPO_ROOT / "deploy" / "crd" / "durableruns.durablerun.dev.yaml"
EXAMPLE = binaries.REPO_ROOT / "deploy" / "samples" / "hello.yaml"
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
    bed = TestBed(directory / "bed", id="sandbox-" + os.urandom(4).hex()).start()
    assert bed.s3
    assert bed.node
    assert bed.controlplane
    bed.kubectl("apply", "--server-side", "-f", str(CRD))
    bed.kubectl("wait", "--for=condition=Established", "--timeout=30s", "crd/durableruns.durablerun.dev")
    bed.s3.create_bucket(BUCKET)
    secret = bed.kubectl(
        "create", "secret", "generic", "durablerun-s3", "-n", "default", "--dry-run=client", "-o", "json",
        f"--from-literal=AWS_ACCESS_KEY_ID={bed.s3.access_key}",
        f"--from-literal=AWS_SECRET_ACCESS_KEY={bed.s3.secret_key}",
    ).stdout
    bed.kubectl("apply", "-f", "-", input=secret)
    parts = [bed.controlplane.etcd, bed.controlplane.apiserver, bed.controlplane.controller_manager,
             bed.s3.process, bed.node_process]
    state = SandboxState(
        id=bed.id, dir=str(directory), kubeconfig=str(bed.kubeconfig),
        s3_endpoint=bed.s3.endpoint_url, s3_access_key=bed.s3.access_key, s3_secret_key=bed.s3.secret_key,
        s3_bucket=BUCKET, node_url=bed.node.url, pids=[p.pid for p in parts if p is not None],
    )
    _state_path(directory).write_text(json.dumps(asdict(state), indent=2))
    _state_path(directory).chmod(0o600)
    return state


def describe(state: SandboxState) -> str:
    return "\n".join([
        "durable-run sandbox is up.",
        f"  export KUBECONFIG={state.kubeconfig}",
        "  kubectl get durableruns -A",
        f"  S3 (MinIO):   {state.s3_endpoint}  bucket {state.s3_bucket}",
        f"                access key {state.s3_access_key}, secret in {state.dir}/state.json"
        " and in Secret default/durablerun-s3",
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
    """Up, the example run, down — the README's first command."""
    state = up(directory)
    print(describe(state), flush=True)
    env = dict(os.environ, KUBECONFIG=state.kubeconfig)
    try:
        kubectl = str(binaries.kubectl())
        _show(env, kubectl, "apply", "-f", str(EXAMPLE))
        _show(env, kubectl, "get", "durableruns")
        _show(env, kubectl, "get", "durablerun", "hello", "-o", "yaml")
    finally:
        down(directory)
    return 0


def _show(env: dict[str, str], kubectl: str, *args: str) -> None:
    import subprocess

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
