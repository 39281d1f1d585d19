"""A light stand-in for N runner pods: acquires and renews each run's lease, as ``durablerun._private.lease`` does.

``python -m durablerun_bench.renewer PLAN.json LOG.jsonl`` with PLAN holding
``namespace``, ``lease_seconds`` and ``stop`` (run name -> unix time after
which that run's current attempt stops renewing, as a hung or partitioned
runner would). Every attempt it sees running (``status.phase`` Running,
``status.pod`` set) is acquired with the runner's guarded JSON patch (``test``
``status.epoch`` and ``status.pod``, then ``add`` ``status.lease``) and renewed
every ``lease_seconds / 3`` (``test`` epoch and holder, ``add`` renewTime). A
run's new attempt after a restart is acquired and renewed again. It writes
one JSON line per acquire, per stop (with the time of the last renewal sent)
and, on SIGTERM, its counts.
"""

from __future__ import annotations

import heapq
import json
import signal
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from durablerun import api

JSON_PATCH = "application/json-patch+json"


def _now() -> str:
    return api.format_time(api.now())


class Renewer:
    def __init__(self, plan: dict[str, Any], log_path: str) -> None:
        from kubernetes import client, config

        config.load_kube_config()
        self.client, self.config_mod = client, config
        self.namespace = plan["namespace"]
        self.lease = float(plan["lease_seconds"])
        self.stop_at: dict[str, float] = {k: float(v) for k, v in plan.get("stop", {}).items()}
        self.log = open(log_path, "a", buffering=1)  # noqa: SIM115 - open for the process's life
        self.lock = threading.Lock()
        self.held: dict[str, tuple[int, str]] = {}  # name -> (epoch, pod) this stand-in holds
        self.stopped: set[tuple[str, int]] = set()
        self.heap: list[tuple[float, str]] = []
        self.last_ok: dict[str, float] = {}  # name -> when its last successful renewal (or acquire) was sent
        self.counts = {"acquired": 0, "renewed": 0, "fenced": 0, "errors": 0, "lists": 0}
        self.local = threading.local()
        self.done = threading.Event()

    def api(self) -> Any:
        if not hasattr(self.local, "api"):
            self.local.api = self.client.CustomObjectsApi(self.client.ApiClient())
        return self.local.api

    def write(self, **fields: Any) -> None:
        with self.lock:
            self.log.write(json.dumps(fields) + "\n")

    def patch(self, name: str, ops: list[dict[str, Any]]) -> bool:
        from kubernetes.client.rest import ApiException

        try:
            self.api().patch_namespaced_custom_object_status(
                api.GROUP, api.VERSION, self.namespace, api.PLURAL, name, ops, _content_type=JSON_PATCH)
            return True
        except ApiException as error:
            with self.lock:
                self.counts["fenced" if error.status in (409, 422) else "errors"] += 1
            return False

    def acquire(self, name: str, epoch: int, pod: str) -> None:
        now = _now()
        lease = {"holder": pod, "epoch": epoch, "acquireTime": now, "renewTime": now,
                 "durationSeconds": int(self.lease)}
        sent = time.time()
        if self.patch(name, [{"op": "test", "path": "/status/epoch", "value": epoch},
                             {"op": "test", "path": "/status/pod", "value": pod},
                             {"op": "add", "path": "/status/lease", "value": lease}]):
            with self.lock:
                self.held[name] = (epoch, pod)
                self.last_ok[name] = sent
                self.counts["acquired"] += 1
                heapq.heappush(self.heap, (time.time() + self.lease / 3, name))
            self.write(event="acquired", name=name, epoch=epoch, pod=pod, sent=sent, at=time.time())

    def renew(self, name: str) -> None:
        with self.lock:
            held = self.held.get(name)
        if held is None:
            return
        epoch, pod = held
        stop = self.stop_at.get(name)
        if stop is not None and epoch == 1 and time.time() >= stop:
            return  # this attempt hangs: no more renewals (the last one was logged)
        sent = time.time()
        gap = sent - self.last_ok.get(name, sent)
        if gap > self.lease:
            # This stand-in fell behind (an overloaded machine): the lease really lapsed, and a
            # restart of this run is the operator doing its job, not a duplicate.
            self.write(event="lapsed", name=name, epoch=epoch, gap=gap, at=sent)
        ok = self.patch(name, [{"op": "test", "path": "/status/epoch", "value": epoch},
                               {"op": "test", "path": "/status/lease/holder", "value": pod},
                               {"op": "add", "path": "/status/lease/renewTime", "value": _now()}])
        with self.lock:
            if ok:
                self.counts["renewed"] += 1
                self.last_ok[name] = sent
                heapq.heappush(self.heap, (sent + self.lease / 3, name))
            else:
                self.held.pop(name, None)  # fenced: a newer attempt owns it; acquire that one when it runs
        if ok and stop is not None and epoch == 1 and sent + self.lease / 3 >= stop:
            self.write(event="stopped", name=name, epoch=epoch, last_renewal_sent=sent, at=time.time())

    def discover(self, pool: ThreadPoolExecutor) -> None:
        """Acquire every running attempt this stand-in does not hold yet (one LIST, not N GETs)."""
        try:
            reply = self.api().list_namespaced_custom_object(api.GROUP, api.VERSION, self.namespace, api.PLURAL)
        except Exception:
            with self.lock:
                self.counts["errors"] += 1
            return
        with self.lock:
            self.counts["lists"] += 1
        for run in reply["items"]:
            status = run.get("status") or {}
            name, epoch, pod = run["metadata"]["name"], status.get("epoch"), status.get("pod")
            lease = status.get("lease") or {}
            with self.lock:
                held = self.held.get(name)
            if status.get("phase") != api.Phase.RUNNING or not epoch or not pod or held == (epoch, pod):
                continue
            if lease.get("epoch") == epoch and lease.get("holder") == pod:
                # Held already (by this stand-in before a restart of it): carry on renewing.
                with self.lock:
                    self.held[name] = (int(epoch), pod)
                    heapq.heappush(self.heap, (time.time(), name))
            else:
                pool.submit(self.guarded, self.acquire, name, int(epoch), pod)

    def guarded(self, fn: Any, *args: Any) -> None:
        try:
            fn(*args)
        except Exception as error:  # a lost renewal must show, not vanish in a future
            with self.lock:
                self.counts["errors"] += 1
            print(f"renewer: {fn.__name__}{args}: {type(error).__name__}: {error}", file=sys.stderr, flush=True)

    def run(self) -> None:
        with ThreadPoolExecutor(max_workers=8, thread_name_prefix="renew") as pool:
            next_list = 0.0
            while not self.done.is_set():
                now = time.time()
                if now >= next_list:
                    self.discover(pool)
                    next_list = now + 2.0
                due = []
                with self.lock:
                    while self.heap and self.heap[0][0] <= now:
                        due.append(heapq.heappop(self.heap)[1])
                for name in due:
                    pool.submit(self.guarded, self.renew, name)
                self.done.wait(0.05)
        self.write(event="counts", **self.counts)


def main(argv: list[str]) -> int:
    with open(argv[0]) as f:
        plan = json.load(f)
    renewer = Renewer(plan, argv[1])
    signal.signal(signal.SIGTERM, lambda *_: renewer.done.set())
    renewer.run()
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
