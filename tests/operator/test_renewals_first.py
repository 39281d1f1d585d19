"""Renewals first: while running runs' renewals fall behind, a burst of new runs starts at the paced rate, and the
renewals that do come are never late by more than a third of their lease.

On the test bed: stand-in runs (``tests.operator.standin.StandIn``: their pods stay unscheduled, their leases
renewed by the stand-in as their runners would) and bursts of new runs whose pods stay unscheduled too, so the
operator and the API server are what is measured. The evidence is the API server's: each pod's creation
timestamp, and each renewal as a watch of the runs tells it.
"""

from __future__ import annotations

import itertools
import json
import threading
import time
from typing import Any

import pytest

from durablerun import api
from durablerun_operator import holds
from durablerun_testbed import procs
from tests.helpers.metrics import scrape
from tests.helpers.runs import Operator, RunEnv
from tests.operator.standin import StandIn

pytestmark = pytest.mark.testbed

LEASE = 30  # renewals every 10 s; a lease is late (the operator's judgement) 16 s after its last renewal
STAND_INS, STALLED, BURST = 10, 3, 12  # 3 of 10 late: past the judgement's 2% and its minimum of 2
NO_SCHEDULER = "durablerun-test-no-scheduler"


def unscheduled(runs: RunEnv, name: str, lease: int) -> dict[str, Any]:
    manifest = runs.manifest(name, "optest_flows:steps", policy={"leaseDuration": f"{lease}s"})
    manifest["spec"]["template"]["spec"]["schedulerName"] = NO_SCHEDULER  # its pod stays Pending
    return manifest


def apply_all(runs: RunEnv, manifests: list[dict[str, Any]]) -> None:
    runs.testbed.kubectl("apply", "-f", "-", input=json.dumps({"apiVersion": "v1", "kind": "List",
                                                               "items": manifests}))


def pods_created(runs: RunEnv, names: list[str]) -> list[float]:
    """The creation times (the API server's, to the second) of the first pods of ``names``, once all exist."""
    def created() -> list[float] | None:
        pods = json.loads(runs.testbed.kubectl("get", "pods", "-n", runs.namespace, "-o", "json").stdout)["items"]
        at = {pod["metadata"]["labels"].get(api.LABEL_RUN): pod["metadata"]["creationTimestamp"] for pod in pods}
        if not set(names) <= set(at):
            return None
        return sorted(api.parse_time(at[name]).timestamp() for name in names)

    return procs.wait_for(created, timeout=120, interval=0.5, what=f"the pods of {len(names)} runs")


class RenewalsSeen:
    """Every lease renewal of the namespace's runs, as a watch of the API server tells it: run -> arrival times."""

    def __init__(self, runs: RunEnv) -> None:
        self.runs = runs
        self.seen: dict[str, list[float]] = {}
        self._last: dict[str, str] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._watch, daemon=True)

    def _watch(self) -> None:
        from kubernetes import client, watch

        objects = client.CustomObjectsApi(self.runs.testbed.api_client())
        while not self._stop.is_set():
            stream = watch.Watch()
            for event in stream.stream(objects.list_namespaced_custom_object, api.GROUP, api.VERSION,
                                       self.runs.namespace, api.PLURAL, timeout_seconds=5):
                body = event["object"]
                renewed = ((body.get("status") or {}).get("lease") or {}).get("renewTime")
                name = body["metadata"]["name"]
                if renewed and self._last.get(name) != renewed:
                    self._last[name] = renewed
                    self.seen.setdefault(name, []).append(time.time())
                if self._stop.is_set():
                    stream.stop()

    def __enter__(self) -> RenewalsSeen:
        self._thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self._stop.set()
        self._thread.join(timeout=30)

    def longest_gap(self, names: list[str], since: float, until: float) -> float:
        """The longest time, within [since, until], any of ``names`` went without a renewal."""
        gaps = []
        for name in names:
            times = [since, *(t for t in self.seen.get(name, []) if since < t < until), until]
            gaps.append(max(b - a for a, b in itertools.pairwise(times)))
        return max(gaps)


def paced(operator: Operator) -> float | None:
    return scrape(operator).get(("durablerun_starts_paced", frozenset()))


@pytest.mark.timeout(600)
def test_starts_are_paced_while_renewals_fall_behind_and_go_at_full_rate_once_they_recover(
        operator: Operator, runs: RunEnv) -> None:
    names = [f"standin-{i:02d}" for i in range(STAND_INS)]
    stalled, healthy = names[:STALLED], names[STALLED:]
    apply_all(runs, [unscheduled(runs, name, LEASE) for name in names])
    with StandIn(runs, names, LEASE) as stand_in, RenewalsSeen(runs) as renewals:
        procs.wait_for(lambda: len(stand_in.held) == STAND_INS, timeout=120, interval=0.5,
                       what=f"all {STAND_INS} stand-in leases held")
        # Three runners stop renewing, as behind a slow API server, right after a renewal: late 16 s on, expired
        # (and restarted, no longer late) 32 s on, and the burst is started and paced in between. The others go on.
        # Renewed together on purpose: the stand-in acquired each lease when a list of its own first saw the
        # run Running, so their renewals need not fall within a second of each other.
        stopped = stand_in.renew_last(stalled)
        procs.wait_for(lambda: time.time() > stopped + LEASE / 2 + 2, timeout=LEASE, interval=0.5,
                       what="the stalled leases to be late")
        # Long leases for the burst: their pods never start, and no restart of theirs may count as a start.
        burst = [f"burst-{i:02d}" for i in range(BURST)]
        began = time.time()
        apply_all(runs, [unscheduled(runs, name, 600) for name in burst])
        created = pods_created(runs, burst)
        ended = time.time()
        assert paced(operator) == 1
        # 12 pods at 2 a second take 5.5 s or more; at full rate they take a second or two (to the second).
        assert created[-1] - created[0] >= (BURST - 1) / holds.PACED_STARTS_PER_SECOND - 1, created
        gap = renewals.longest_gap(healthy, began, ended)
        assert gap <= LEASE / 3 + LEASE / 3, f"a healthy run went {gap:.1f} s without a renewal during the burst"

        # The stalled runners come back (a new attempt would too): renewals recover, starts go at full rate.
        stand_in.never_again.difference_update(stalled)
        procs.wait_for(lambda: all(name in stand_in.held for name in stalled), timeout=LEASE * 3, interval=0.5,
                       what="the stalled runs' leases held again")
        more = [f"after-{i:02d}" for i in range(BURST)]
        procs.wait_for(lambda: renewals.longest_gap(names, time.time() - LEASE / 2, time.time()) < LEASE / 2,
                       timeout=LEASE * 2, interval=0.5, what="every stand-in lease renewed within half its validity")
        apply_all(runs, [unscheduled(runs, name, 600) for name in more])
        created = pods_created(runs, more)
        assert paced(operator) == 0
        assert created[-1] - created[0] <= 3, created
    assert not stand_in.errors, stand_in.errors[:5]
