"""The lease timeline of a test's namespace: every renewal each runner wrote, as the API server stored it.

A runner renews its lease by writing ``status.lease.renewTime`` (its own clock, its own write); the operator only
reads it. So the timeline is the runners' own record of when each attempt last renewed, kept outside the operator:
a check that must not take the operator's word that a lease lapsed (``LeaseExpired``) compares the operator's
decision with it (tests/faults/torture.py).
"""

from __future__ import annotations

import threading
import time
from datetime import datetime
from typing import Any

from durablerun import api
from durablerun_testbed.testbed import TestBed


class LeaseTimeline:
    """Watches the namespace's DurableRuns and keeps, per pod, every renewTime its runner wrote."""

    def __init__(self, testbed: TestBed, namespace: str) -> None:
        from kubernetes import client

        self.custom = client.CustomObjectsApi(testbed.api_client())
        self.namespace = namespace
        self._renewals: dict[str, set[datetime]] = {}  # pod (lease.holder) -> renewTimes seen
        self.relists = 0  # times the watch had to list again: versions between two watches may be missed
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._thread = threading.Thread(target=self._loop, name=f"leases-{namespace}", daemon=True)
        self._thread.start()

    def _record(self, run: dict[str, Any]) -> None:
        lease = (run.get("status") or {}).get("lease") or {}
        renewed = api.parse_time(lease.get("renewTime"))
        if lease.get("holder") and renewed is not None:
            with self._lock:
                self._renewals.setdefault(lease["holder"], set()).add(renewed)

    def _loop(self) -> None:
        from kubernetes import watch

        version: str | None = None
        while not self._stop.is_set():
            try:
                if version is None:
                    listed = self.custom.list_namespaced_custom_object(api.GROUP, api.VERSION, self.namespace,
                                                                       api.PLURAL)
                    for run in listed["items"]:
                        self._record(run)
                    version = listed["metadata"]["resourceVersion"]
                    self.relists += 1
                for event in watch.Watch().stream(self.custom.list_namespaced_custom_object, api.GROUP, api.VERSION,
                                                  self.namespace, api.PLURAL, resource_version=version,
                                                  timeout_seconds=5, allow_watch_bookmarks=True):
                    if event["type"] == "ERROR":
                        raise RuntimeError(f"watch error: {event['object']}")
                    if event["type"] != "BOOKMARK":
                        self._record(event["object"])
                    version = event["object"]["metadata"]["resourceVersion"]
                    if self._stop.is_set():
                        break
            except Exception:  # expired version (410) or the API server restarting: list again
                version = None
                time.sleep(0.2)

    def last_renewal(self, pod: str) -> datetime | None:
        """The latest renewTime the runner of ``pod`` wrote (None: it never held its lease)."""
        with self._lock:
            return max(self._renewals.get(pod) or (), default=None)

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=10)
