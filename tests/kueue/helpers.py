"""Kueue objects for the tests: one flavor, a ClusterQueue with a quota, a LocalQueue in a namespace; queued runs
and what became of them. Kueue's API version and ``wait_active`` are in ``tests.helpers.kueue`` (the real node's
Kueue test uses them too)."""

from __future__ import annotations

import json
from typing import Any

import yaml

from durablerun import api
from durablerun_testbed.testbed import TestBed
from tests.helpers.kueue import V1BETA2
from tests.helpers.runs import RunEnv


def queues(cluster_queue: str, local_queue: str, namespace: str, *, cpu: str, memory: str = "64Gi",
           flavor: str = "default-flavor") -> list[dict[str, Any]]:
    """A ResourceFlavor, a ClusterQueue open to every namespace with quota ``cpu``/``memory`` in it, and a
    LocalQueue in ``namespace`` pointing at it."""
    return [
        {"apiVersion": V1BETA2, "kind": "ResourceFlavor", "metadata": {"name": flavor}},
        {"apiVersion": V1BETA2, "kind": "ClusterQueue", "metadata": {"name": cluster_queue},
         "spec": {"namespaceSelector": {}, "resourceGroups": [{
             "coveredResources": ["cpu", "memory"],
             "flavors": [{"name": flavor, "resources": [{"name": "cpu", "nominalQuota": cpu},
                                                        {"name": "memory", "nominalQuota": memory}]}]}]}},
        {"apiVersion": V1BETA2, "kind": "LocalQueue", "metadata": {"name": local_queue, "namespace": namespace},
         "spec": {"clusterQueue": cluster_queue}},
    ]


def apply(testbed: TestBed, documents: list[dict[str, Any]]) -> None:
    testbed.kubectl("apply", "--server-side", "-f", "-", input=yaml.safe_dump_all(documents))


def queued_run(runs: RunEnv, name: str, queue: str, *, cpu: str = "500m", **input: Any) -> dict[str, Any]:
    """A DurableRun of ``optest_kueue:tagged`` (tag = its name) in LocalQueue ``queue``, its runner asking for
    ``cpu``. Its lease is longer than the operator tests' 6s: a restart for a lease that lapsed on a loaded
    machine is not what these tests are about, and they assert there is none."""
    manifest = runs.manifest(name, "optest_kueue:tagged", {"tag": name, **input}, policy={"leaseDuration": "30s"})
    manifest["metadata"]["labels"] = {api.LABEL_QUEUE_NAME: queue}
    manifest["spec"]["template"]["spec"]["containers"][0]["resources"] = {"requests": {"cpu": cpu}}
    return manifest


def live_pods(runs: RunEnv) -> list[str]:
    """The namespace's runner pods that are not over (Pending or Running): the ones quota must cover."""
    out = runs.testbed.kubectl("get", "pods", "-n", runs.namespace, "-l", api.LABEL_RUN, "-o", "json").stdout
    return [p["metadata"]["name"] for p in json.loads(out)["items"]
            if p.get("status", {}).get("phase") in ("Pending", "Running")]


def reasons(runs: RunEnv, name: str) -> list[str]:
    return [e["reason"] for e in sorted(runs.events(name), key=lambda e: e.get("firstTimestamp") or "")]


def phases(runs: RunEnv) -> dict[str, str]:
    out = runs.testbed.kubectl("get", "dr", "-n", runs.namespace, "-o", "json").stdout
    return {r["metadata"]["name"]: r.get("status", {}).get("phase", "") for r in json.loads(out)["items"]}
