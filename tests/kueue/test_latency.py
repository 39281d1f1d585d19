"""How long a run takes from creation to its pod when Kueue admits it: many runs created at once, measured.

The runner pods name a scheduler that does not exist, so none is bound and nothing runs: what is measured is
the operator and Kueue alone (run created -> Workload queued -> admitted -> pod created on the admission's
flavor). ``make test`` creates 10 runs; DURABLERUN_KUEUE_RUNS=100 is the figure reported in docs/install.md.
"""

from __future__ import annotations

import json
import os
import statistics
import time
import uuid

import pytest

from durablerun import api
from durablerun_testbed.kueue import Kueue
from tests.helpers.kueue import wait_active
from tests.helpers.runs import RunEnv, StartOperator
from tests.kueue.helpers import apply, queued_run, queues

pytestmark = pytest.mark.testbed

RUNS = int(os.environ.get("DURABLERUN_KUEUE_RUNS", "10"))


def test_runs_created_at_once_get_their_pods_on_the_admitted_flavor(
        kueue: Kueue, start_operator: StartOperator, runs: RunEnv) -> None:
    suffix = uuid.uuid4().hex[:6]
    objects = queues(f"cq-{suffix}", "lq", runs.namespace, cpu=str(RUNS), flavor=f"pool-{suffix}")
    objects[0]["spec"] = {"nodeLabels": {"example.com/pool": f"pool-{suffix}"}}
    apply(runs.testbed, objects)
    wait_active(runs.testbed, "localqueues.kueue.x-k8s.io", "lq", runs.namespace)
    start_operator(**{api.OperatorEnv.KUEUE: "true"})
    manifests = []
    for i in range(RUNS):
        manifest = queued_run(runs, f"m{i}", "lq", cpu="1")
        manifest["spec"]["template"]["spec"]["schedulerName"] = "nobody"  # never bound: nothing runs
        manifests.append(manifest)

    started = time.monotonic()
    runs.testbed.kubectl("apply", "-f", "-", input="\n---\n".join(json.dumps(m) for m in manifests), timeout=120)
    applied = time.monotonic() - started
    seen: dict[str, float] = {}
    deadline = started + 60 + RUNS * 2
    while len(seen) < RUNS:
        assert time.monotonic() < deadline, f"{RUNS - len(seen)} of {RUNS} runs have no pod"
        out = runs.testbed.kubectl("get", "pods", "-n", runs.namespace, "-l", api.LABEL_RUN, "-o", "json").stdout
        now = time.monotonic() - started
        for pod in json.loads(out)["items"]:
            if pod["metadata"]["name"] not in seen:
                seen[pod["metadata"]["name"]] = now
                assert pod["spec"]["nodeSelector"] == {"example.com/pool": f"pool-{suffix}"}
        time.sleep(0.25)

    latencies = sorted(seen.values())
    print(f"\n{RUNS} runs applied in {applied:.1f}s; create -> pod: p50 {statistics.median(latencies):.1f}s, "
          f"p90 {latencies[int(0.9 * (RUNS - 1))]:.1f}s, max {latencies[-1]:.1f}s "
          f"(load average {os.getloadavg()[0]:.1f})")
