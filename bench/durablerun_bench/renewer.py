"""A light stand-in for N runner pods: acquires and renews each run's lease, as ``durablerun.pod.Lease`` does.

``python -m durablerun_bench.renewer PLAN.json LOG.jsonl`` with PLAN holding
``namespace``, ``lease_seconds``, ``stop`` (run name -> unix time after
which that run's current attempt stops renewing, as a hung or partitioned
runner would), and optionally ``shard`` (only runs labelled
``durablerun-bench/shard=<shard>``: several stand-ins split the runs) and
``wait_event`` (each attempt ends Waiting for that event instead of renewing,
as a runner reaching ``ctx.wait_for_event`` does, or Completed once the event
is in spec.events). Every attempt it sees running (``status.phase`` Running,
``status.pod`` set; found by a watch) is acquired with the runner's guarded
JSON patch (``test`` ``status.epoch`` and ``status.pod``, then ``add``
``status.lease``) and renewed every ``lease_seconds / 3`` (``test`` epoch and
holder, ``add`` renewTime). A run's new attempt after a restart is acquired and
renewed again. An attempt ends the way a runner's does: its outcome in status,
then its container terminated with the outcome's exit code and termination
message (written to the pod's status, as the node would). It writes one JSON
line per acquire, per stop (with the time of the last renewal sent), per
wait, and, on SIGTERM, its counts and its own lag (how late each renewal was
sent after it was due: the stand-in must keep up for the figures to be the
operator's).
"""

from __future__ import annotations

import heapq
import json
import signal
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime
from typing import Any

from durablerun import api
from durablerun_bench.util import percentile

JSON_PATCH = "application/json-patch+json"
#: A label splitting the runs between several stand-ins (one per value).
SHARD_LABEL = "durablerun-bench/shard"
#: How long a call is tried again while the API server is unreachable or overloaded.
TRANSIENT_SECONDS = 60.0


def _now() -> str:
    return api.format_time(datetime.now(UTC))


class Renewer:
    def __init__(self, plan: dict[str, Any], log_path: str) -> None:
        from kubernetes import client, config

        config.load_kube_config()
        self.client, self.config_mod = client, config
        self.namespace = plan["namespace"]
        self.lease = float(plan["lease_seconds"])
        self.stop_at: dict[str, float] = {k: float(v) for k, v in plan.get("stop", {}).items()}
        self.selector = f"{SHARD_LABEL}={plan['shard']}" if plan.get("shard") is not None else None
        self.wait_event: str | None = plan.get("wait_event")
        self.log = open(log_path, "a", buffering=1)  # noqa: SIM115 - open for the process's life
        self.lock = threading.Lock()
        self.held: dict[str, tuple[int, str]] = {}  # name -> (epoch, pod) this stand-in holds
        self.ended: set[tuple[str, int]] = set()  # attempts this stand-in ended (Waiting, Completed)
        self.heap: list[tuple[float, str]] = []
        self.last_ok: dict[str, float] = {}  # name -> when its last successful renewal (or acquire) was sent
        self.counts = {"acquired": 0, "renewed": 0, "fenced": 0, "errors": 0, "lists": 0, "waits": 0,
                       "completed": 0, "retries": 0}
        self.lags: list[float] = []  # seconds each renewal was sent after it was due
        self.local = threading.local()
        self.done = threading.Event()

    def api(self) -> Any:
        if not hasattr(self.local, "api"):
            self.local.api = self.client.CustomObjectsApi(self.client.ApiClient())
        return self.local.api

    def core(self) -> Any:
        if not hasattr(self.local, "core"):
            self.local.core = self.client.CoreV1Api(self.client.ApiClient())
        return self.local.core

    def write(self, **fields: Any) -> None:
        with self.lock:
            self.log.write(json.dumps(fields) + "\n")

    def retrying(self, call: Any, *args: Any, **kwargs: Any) -> Any:
        """``call``, tried again for up to TRANSIENT_SECONDS while the API server is unreachable or overloaded
        (5xx, 429, a dropped connection), as a runner's own client does: a stand-in that gave up there would
        leave its run as no runner would."""
        from kubernetes.client.rest import ApiException
        from urllib3.exceptions import HTTPError

        deadline = time.time() + TRANSIENT_SECONDS
        while True:
            try:
                return call(*args, **kwargs)
            except ApiException as error:
                if not (error.status == 429 or error.status >= 500) or time.time() > deadline:
                    raise
            except (HTTPError, OSError):  # the connection refused or dropped
                if time.time() > deadline:
                    raise
            with self.lock:
                self.counts["retries"] += 1
            self.done.wait(1.0)

    def patch(self, name: str, ops: list[dict[str, Any]]) -> dict[str, Any] | None:
        from kubernetes.client.rest import ApiException

        try:
            return dict(self.retrying(self.api().patch_namespaced_custom_object_status,
                                      api.GROUP, api.VERSION, self.namespace, api.PLURAL, name, ops,
                                      _content_type=JSON_PATCH))
        except ApiException as error:
            with self.lock:
                self.counts["fenced" if error.status in (409, 422) else "errors"] += 1
            return None

    def pod_exists(self, pod: str) -> bool:
        """Whether ``pod`` appears within a lease's duration: the operator names the pod in status first, and
        creates it after (later on a busy machine)."""
        from kubernetes.client.rest import ApiException

        deadline = time.time() + self.lease
        while not self.done.is_set():
            try:
                self.core().read_namespaced_pod(pod, self.namespace)
                return True
            except ApiException as error:
                if error.status != 404 or time.time() > deadline:
                    return False
            self.done.wait(0.5)
        return False

    def acquire(self, name: str, epoch: int, pod: str) -> bool:
        now = _now()
        lease = {"holder": pod, "epoch": epoch, "acquireTime": now, "renewTime": now,
                 "durationSeconds": int(self.lease)}
        sent = time.time()
        body = self.patch(name, [{"op": "test", "path": "/status/epoch", "value": epoch},
                                 {"op": "test", "path": "/status/pod", "value": pod},
                                 {"op": "add", "path": "/status/lease", "value": lease}])
        if body is None:
            return False
        with self.lock:
            self.held[name] = (epoch, pod)
            self.last_ok[name] = sent
            self.counts["acquired"] += 1
            if self.wait_event is None:
                heapq.heappush(self.heap, (time.time() + self.lease / 3, name))
        self.write(event="acquired", name=name, epoch=epoch, pod=pod, sent=sent, at=time.time())
        if self.wait_event is not None:
            self.end(name, epoch, pod, self.wait_event in ((body.get("spec") or {}).get("events") or {}))
        return True

    def end(self, name: str, epoch: int, pod: str, completed: bool) -> None:
        """End the attempt as a runner does: the outcome in status, then the container's exit on the pod."""
        outcome = api.Outcome.COMPLETED if completed else api.Outcome.WAITING
        since = _now()
        report: dict[str, Any] = {"outcome": outcome.value, "message": "done" if completed else
                                  f"waiting for event {self.wait_event}",
                                  "waitingFor": None if completed else {"event": self.wait_event, "since": since}}
        if self.patch(name, [{"op": "test", "path": "/status/epoch", "value": epoch},
                             {"op": "test", "path": "/status/lease/holder", "value": pod},
                             {"op": "add", "path": "/status/outcome", "value": outcome.value}]) is None:
            return
        reason = "Completed" if completed else "Error"  # literal-ok: a container's reason, not an outcome
        terminated = {"exitCode": outcome.exit_code, "reason": reason,
                      "message": json.dumps(report, separators=(",", ":")), "startedAt": since,
                      "finishedAt": since}
        self.retrying(self.core().patch_namespaced_pod_status, pod, self.namespace, {"status": {
            "phase": "Succeeded" if completed else "Failed",  # literal-ok: the pod's phase, not the run's
            "containerStatuses": [{"name": api.RUNNER_CONTAINER, "state": {"terminated": terminated},
                                   "ready": False, "restartCount": 0, "image": "", "imageID": ""}]}})
        with self.lock:
            self.held.pop(name, None)
            self.ended.add((name, epoch))
            self.counts["completed" if completed else "waits"] += 1
        self.write(event="completed" if completed else "waiting", name=name, epoch=epoch, at=time.time())

    def renew(self, name: str, due: float) -> None:
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
                               {"op": "add", "path": "/status/lease/renewTime", "value": _now()}]) is not None
        with self.lock:
            self.lags.append(sent - due)
            if ok:
                self.counts["renewed"] += 1
                self.last_ok[name] = sent
                heapq.heappush(self.heap, (sent + self.lease / 3, name))
            else:
                self.held.pop(name, None)  # fenced: a newer attempt owns it; acquire that one when it runs
        if ok and stop is not None and epoch == 1 and sent + self.lease / 3 >= stop:
            self.write(event="stopped", name=name, epoch=epoch, last_renewal_sent=sent, at=time.time())

    def seen(self, run: dict[str, Any], pool: ThreadPoolExecutor) -> None:
        """Acquire a running attempt this stand-in does not hold yet."""
        status = run.get("status") or {}
        name, epoch, pod = run["metadata"]["name"], status.get("epoch"), status.get("pod")
        lease = status.get("lease") or {}
        with self.lock:
            held = self.held.get(name)
            ended = (name, epoch) in self.ended
        if status.get("phase") != api.Phase.RUNNING or not epoch or not pod or held == (epoch, pod) or ended:
            return
        if status.get("outcome") and lease.get("epoch") == epoch:
            return  # this attempt already ended (the operator has not caught up yet)
        if lease.get("epoch") == epoch and lease.get("holder") == pod:
            # Held already (by this stand-in before a restart of it): carry on renewing.
            with self.lock:
                self.held[name] = (int(epoch), pod)
                heapq.heappush(self.heap, (time.time(), name))
        else:
            with self.lock:
                self.held[name] = (int(epoch), pod)  # not twice, while the acquire is queued
            pool.submit(self.guarded, self.acquire_or_forget, name, int(epoch), pod)

    def acquire_or_forget(self, name: str, epoch: int, pod: str) -> None:
        acquired = False
        try:
            # The operator names the pod in status before it creates it; a runner runs in it, so it exists
            # before the runner acts. Ending an attempt (wait_event) needs the pod: wait for it.
            if self.wait_event is not None and not self.pod_exists(pod):
                return
            acquired = self.acquire(name, epoch, pod)
        finally:
            if not acquired:
                with self.lock:
                    if self.held.get(name) == (epoch, pod):
                        self.held.pop(name, None)  # refused: tried again when its next version is seen

    def watch(self, pool: ThreadPoolExecutor) -> None:
        """Every version of the runs (of this shard): a list, then a watch from it that resumes where it was
        when it times out; a list again only when the watch cannot resume (410 Gone, or an error). Listing
        again at each timeout made 4 stand-ins of 10,000 runs read 45 MB a minute each, and the API server's
        answers timed out (504) under them."""
        from kubernetes import watch

        version: str | None = None
        while not self.done.is_set():
            try:
                kwargs = {"label_selector": self.selector} if self.selector else {}
                if version is None:
                    reply = self.api().list_namespaced_custom_object(api.GROUP, api.VERSION, self.namespace,
                                                                     api.PLURAL, **kwargs)
                    with self.lock:
                        self.counts["lists"] += 1
                    for run in reply["items"]:
                        self.seen(run, pool)
                    version = reply["metadata"]["resourceVersion"]
                w = watch.Watch()
                for event in w.stream(self.api().list_namespaced_custom_object, api.GROUP, api.VERSION,
                                      self.namespace, api.PLURAL, resource_version=version,
                                      allow_watch_bookmarks=True, timeout_seconds=60, **kwargs):
                    if self.done.is_set():
                        w.stop()
                        break
                    version = event["object"].get("metadata", {}).get("resourceVersion") or version
                    if event["type"] in ("ADDED", "MODIFIED"):
                        self.seen(event["object"], pool)
            except Exception as error:  # expired (410) or dropped: list again
                version = None
                print(f"renewer: watch: {type(error).__name__}: {error}", file=sys.stderr, flush=True)
                self.done.wait(0.5)

    def guarded(self, fn: Any, *args: Any) -> None:
        try:
            fn(*args)
        except Exception as error:  # a lost renewal must show, not vanish in a future
            with self.lock:
                self.counts["errors"] += 1
            print(f"renewer: {fn.__name__}{args}: {type(error).__name__}: {error}", file=sys.stderr, flush=True)

    def run(self) -> None:
        with ThreadPoolExecutor(max_workers=8, thread_name_prefix="renew") as pool:
            threading.Thread(target=self.watch, args=(pool,), name="watch", daemon=True).start()
            while not self.done.is_set():
                now = time.time()
                due = []
                with self.lock:
                    while self.heap and self.heap[0][0] <= now:
                        due.append(heapq.heappop(self.heap))
                for when, name in due:
                    pool.submit(self.guarded, self.renew, name, when)
                self.done.wait(0.05)
        lags = sorted(self.lags)
        self.write(event="counts", **self.counts, lag_p50=percentile(lags, 50), lag_p99=percentile(lags, 99),
                   lag_max=lags[-1] if lags else 0.0)


def main(argv: list[str]) -> int:
    with open(argv[0]) as f:
        plan = json.load(f)
    renewer = Renewer(plan, argv[1])
    signal.signal(signal.SIGTERM, lambda *_: renewer.done.set())
    renewer.run()
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
