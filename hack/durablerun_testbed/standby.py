"""A second Node that stays Ready and runs nothing: the test heartbeats it.

The node lifecycle controller evicts the pods of a silent node only while its
zone is partly healthy: once every node of a zone is NotReady it enters the
full-disruption mode and stops evicting (it takes the control plane, not the
nodes, to have failed). The bed has one real node, so a test that loses it
needs another Node to keep the zone healthy. This one is a Node object and its
Lease in ``kube-node-lease``, renewed by a thread as a kubelet would renew it;
it is cordoned and tainted, so no pod is ever scheduled to it.
"""

from __future__ import annotations

import threading
from datetime import UTC, datetime
from types import TracebackType
from typing import Any

LEASE_NAMESPACE = "kube-node-lease"
LEASE_SECONDS = 40  # the kubelet's default
RENEW_SECONDS = 2.0


class StandbyNode:
    """``with StandbyNode(api_client, name):`` the Node exists and is Ready; afterwards it is gone."""

    def __init__(self, api_client: Any, name: str) -> None:
        from kubernetes import client

        self.name = name
        self.core = client.CoreV1Api(api_client)
        self.coordination = client.CoordinationV1Api(api_client)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._heartbeat, name=f"heartbeat {name}", daemon=True)
        self.failures: list[str] = []

    def __enter__(self) -> StandbyNode:
        self.core.create_node({
            "metadata": {"name": self.name, "labels": {"kubernetes.io/hostname": self.name}},
            "spec": {"unschedulable": True, "taints": [
                {"key": "durablerun.dev/standby", "value": "true", "effect": "NoSchedule"}]},
        })
        self.coordination.create_namespaced_lease(LEASE_NAMESPACE, {
            "metadata": {"name": self.name},
            "spec": {"holderIdentity": self.name, "leaseDurationSeconds": LEASE_SECONDS, "renewTime": _now()},
        })
        self._report_ready()
        self._thread.start()
        return self

    def __exit__(self, kind: type[BaseException] | None, error: BaseException | None,
                 traceback: TracebackType | None) -> None:
        self._stop.set()
        self._thread.join(timeout=30)
        self.coordination.delete_namespaced_lease(self.name, LEASE_NAMESPACE)
        self.core.delete_node(self.name)

    def _report_ready(self) -> None:
        now = _now()
        self.core.patch_node_status(self.name, {"status": {"conditions": [{
            "type": "Ready", "status": "True", "reason": "KubeletReady", "message": "kept Ready by the test",
            "lastHeartbeatTime": now, "lastTransitionTime": now}]}})

    def _heartbeat(self) -> None:
        # The lease alone keeps a Ready node Ready (the controller reads its renewTime as the probe time).
        while not self._stop.wait(RENEW_SECONDS):
            try:
                self.coordination.patch_namespaced_lease(self.name, LEASE_NAMESPACE, {"spec": {"renewTime": _now()}})
            except Exception as error:  # the API server restarting: the next renewal tries again
                self.failures.append(repr(error))


def _now() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")
