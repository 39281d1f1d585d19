"""What the real-node tests share: the operator's namespace, and DurableRuns in a namespace enforcing `restricted`."""

from __future__ import annotations

import json
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import boto3

from durablerun import api
from durablerun_operator import builders
from durablerun_testbed import procs
from durablerun_testbed.testbed import TestBed
from tests.helpers.torture_runs import Ledger

#: Where the chart installs the operator.
OPERATOR_NAMESPACE = "durable-run-system"
#: The chart's release name.
RELEASE = "durable-run"
#: Version 2 of the workflows (test_pinning.py, test_chart_upgrade.py), and the moving tag a deploy retags.
V2 = Path(__file__).resolve().parent / "workflows_v2"
MOVING = "localhost/durable-run/pinning-test:moving"


#: The chart operator's start timeout here (the chart's startTimeoutSeconds): a run whose image cannot be pulled
#: fails this long after its attempt started. No image on this node is pulled from a registry, so no other run
#: waits on a pull that long.
START_TIMEOUT_SECONDS = 30


@dataclass
class RealRuns:
    """A namespace enforcing `restricted` with a bucket and its credentials, for runs on the real node."""

    bed: TestBed
    namespace: str
    bucket: str
    image: str

    def manifest(self, name: str, workflow: str, input: dict[str, Any] | None = None,
                 resources: dict[str, Any] | None = None, policy: dict[str, Any] | None = None,
                 grace: int = 5) -> dict[str, Any]:
        assert self.bed.s3
        runner: dict[str, Any] = {"name": "runner", "image": self.image}
        if resources:
            runner["resources"] = resources
        return {
            "apiVersion": api.API_VERSION, "kind": "DurableRun",
            "metadata": {"name": name, "namespace": self.namespace},
            "spec": {
                "workflow": workflow,
                "input": {"bucket": self.bucket, "endpoint": self.bed.s3.endpoint_url, **(input or {})},
                "checkpoint": {"uri": f"s3://{self.bucket}/runs", "endpoint": self.bed.s3.endpoint_url,
                               "region": "us-east-1", "credentialsSecret": "s3-credentials"},
                "policy": {"leaseDuration": "10s", "backoff": {"initial": "1s", "max": "2s"}, **(policy or {})},
                "template": {"spec": {"containers": [runner], "terminationGracePeriodSeconds": grace}},
            },
        }

    def apply(self, manifest: dict[str, Any]) -> None:
        self.bed.kubectl("apply", "-f", "-", input=json.dumps(manifest))

    def kubectl(self, *args: str, check: bool = True) -> str:
        return self.bed.kubectl("-n", self.namespace, *args, check=check).stdout

    def get(self, name: str) -> dict[str, Any]:
        return dict(json.loads(self.kubectl("get", "dr", name, "-o", "json")))

    def status(self, name: str) -> dict[str, Any]:
        return dict(self.get(name).get("status") or {})

    def wait_phase(self, name: str, *phases: str, timeout: float = 120) -> dict[str, Any]:
        return procs.wait_for(
            lambda: (status := self.status(name)).get("phase") in phases and status,
            timeout=timeout, interval=0.5, what=f"DurableRun {self.namespace}/{name} to reach {'/'.join(phases)}",
        )

    def wait_steps(self, name: str, steps: int, timeout: float = 120) -> dict[str, Any]:
        return procs.wait_for(
            lambda: (s := self.status(name)).get("phase") == "Running"
            and (s.get("progress") or {}).get("completedSteps", 0) >= steps and s,
            timeout=timeout, interval=0.2, what=f"{name} to journal {steps} steps in a running pod",
        )

    def pods(self, name: str) -> list[dict[str, Any]]:
        return list(json.loads(self.kubectl("get", "pods", "-l", f"{api.LABEL_RUN}={name}", "-o",
                                            "json"))["items"])

    def pod(self, pod: str) -> dict[str, Any]:
        return dict(json.loads(self.kubectl("get", "pod", pod, "-o", "json")))

    def running_container_id(self, pod: str) -> str:
        """The runner container's id once it runs (the runtime's, as `containerd://<id>`)."""
        def running() -> str | None:
            for status in self.pod(pod).get("status", {}).get("containerStatuses", []):
                if status["name"] == "runner" and "running" in status.get("state", {}):
                    return str(status["containerID"])
            return None

        return procs.wait_for(running, timeout=60, what=f"the runner container of {pod} to run")

    def events(self, name: str) -> list[dict[str, Any]]:
        return list(json.loads(self.kubectl("get", "events", "--field-selector", f"involvedObject.name={name}",
                                            "-o", "json"))["items"])

    def s3(self) -> Any:
        assert self.bed.s3
        return boto3.client("s3", endpoint_url=self.bed.s3.endpoint_url, region_name="us-east-1",
                            aws_access_key_id=self.bed.s3.access_key, aws_secret_access_key=self.bed.s3.secret_key)

    def _markers(self, prefix: str) -> list[tuple[str, int]]:
        pages = self.s3().get_paginator("list_objects_v2").paginate(Bucket=self.bucket, Prefix=prefix + "/")
        return [(key.split("/")[1], int(key.split("/")[2].split("-")[0]))
                for page in pages for key in (o["Key"] for o in page.get("Contents", []))]

    def executions(self, prefix: str = "executions") -> Counter[str]:
        """How often each step ran, across every attempt, from the markers its executions left in S3."""
        return Counter(step for step, _ in self._markers(prefix))

    def ledger(self, name: str, prefix: str = "executions") -> Ledger:
        """The fault suite's ledger of a run's step executions (``start <step> <pod>``), in epoch order."""
        return Ledger([("start", step, builders.pod_name(name, epoch))
                       for step, epoch in sorted(self._markers(prefix), key=lambda marker: marker[1])])
