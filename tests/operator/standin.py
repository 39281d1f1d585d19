"""A stand-in for the runners of many DurableRuns: their leases acquired and renewed through the runner's own
guarded status patches, every third of the lease, as bench/durablerun_bench/renewer.py does. Their pods stay
unscheduled, so what is tested is the operator and the API server, not hundreds of processes."""

from __future__ import annotations

import threading
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from durablerun import api
from tests.helpers.runs import RunEnv

JSON_PATCH = "application/json-patch+json"


class StandIn:
    """Acquires and renews the leases of the stand-in runs, as their runners would; pausable."""

    def __init__(self, runs: RunEnv, names: list[str], lease: float, leases: dict[str, float] | None = None) -> None:
        self.runs, self.names = runs, set(names)
        self.lease = lease
        self.leases = leases or {}  # runs whose lease is not ``lease`` seconds
        self.paused = threading.Event()
        self.done = threading.Event()
        self.never_again: set[str] = set()  # runs whose runner hangs for good (no renewal after the pause)
        self.abandoned: set[tuple[str, int]] = set()  # (run, epoch): that attempt's runner hangs; a new one renews
        self.held: dict[str, tuple[int, str]] = {}
        self.due: dict[str, float] = {}
        self.errors: list[str] = []
        self.local = threading.local()
        self.thread = threading.Thread(target=self._loop, name="stand-in", daemon=True)

    def api(self) -> Any:
        from kubernetes import client

        if not hasattr(self.local, "api"):
            self.local.api = client.CustomObjectsApi(self.runs.testbed.api_client())
        return self.local.api

    def _patch(self, name: str, ops: list[dict[str, Any]]) -> bool:
        from kubernetes.client.rest import ApiException

        try:
            self.api().patch_namespaced_custom_object_status(
                api.GROUP, api.VERSION, self.runs.namespace, api.PLURAL, name, ops, _content_type=JSON_PATCH)
            return True
        except ApiException as error:
            if error.status not in (409, 422):  # a refused test: a newer attempt owns the run
                self.errors.append(f"{name}: {error.status} {error.reason}")
            return False

    def _acquire(self, name: str, epoch: int, pod: str) -> None:
        now = api.format_time(time.time())
        duration = self.leases.get(name, self.lease)
        lease = {"holder": pod, "epoch": epoch, "acquireTime": now, "renewTime": now, "durationSeconds": duration}
        if self._patch(name, [{"op": "test", "path": "/status/epoch", "value": epoch},
                              {"op": "test", "path": "/status/pod", "value": pod},
                              {"op": "add", "path": "/status/lease", "value": lease}]):
            self.held[name] = (epoch, pod)
            self.due[name] = time.time() + duration / 3

    def _renew(self, name: str) -> None:
        epoch, pod = self.held[name]
        self.due[name] = time.time() + self.leases.get(name, self.lease) / 3
        if (name, epoch) in self.abandoned:
            self.held.pop(name, None)  # its runner hangs: no renewal; the next attempt's is acquired anew
            return
        if not self._patch(name, [{"op": "test", "path": "/status/epoch", "value": epoch},
                                  {"op": "test", "path": "/status/lease/holder", "value": pod},
                                  {"op": "add", "path": "/status/lease/renewTime",
                                   "value": api.format_time(time.time())}]):
            self.held.pop(name, None)

    def renew_last(self, names: list[str]) -> float:
        """Renew ``names`` together, now, and never again (their runners hang right after): when it was sent."""
        self.never_again.update(names)
        sent = time.time()
        for name in names:
            if name in self.held:
                self._renew(name)
        return sent

    def _loop(self) -> None:
        with ThreadPoolExecutor(max_workers=4, thread_name_prefix="stand-in") as pool:
            next_list = 0.0
            while not self.done.wait(0.2):
                if self.paused.is_set():
                    continue
                if time.time() >= next_list:
                    next_list = time.time() + 5
                    items = self.api().list_namespaced_custom_object(
                        api.GROUP, api.VERSION, self.runs.namespace, api.PLURAL)["items"]
                    fresh = [(run["metadata"]["name"], run["status"]["epoch"], run["status"]["pod"])
                             for run in items
                             if run["metadata"]["name"] in self.names - self.never_again - set(self.held)
                             and (run.get("status") or {}).get("phase") == "Running"
                             and run["status"].get("pod")
                             and (run["metadata"]["name"], run["status"]["epoch"]) not in self.abandoned]
                    list(pool.map(lambda args: self._acquire(*args), fresh))
                due = [n for n, at in self.due.items() if at <= time.time() and n in self.held
                       and n not in self.never_again]
                list(pool.map(self._renew, due))

    def __enter__(self) -> StandIn:
        self.thread.start()
        return self

    def __exit__(self, *_: Any) -> None:
        self.done.set()
        self.thread.join(timeout=30)
