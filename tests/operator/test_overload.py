"""Overload never becomes restarts: a fleet's renewals stall for longer than the lease, and no healthy run restarts.

On the test bed: 20 DurableRuns (40 in ``make faults``) whose pods stay unscheduled (a
scheduler name nothing serves), with their leases acquired and renewed by a
stand-in for their runners (``tests.operator.standin.StandIn``), and one run
with a real runner on the process node. The stand-in's renewals pause for
longer than the lease, as they would behind a slow API server. The operator
must hold every lease-only restart (a mass lease expiry, reported by its
metric and a LeaseExpiryHeld Event), still restart the real run whose pod is
killed meanwhile, and, once renewals resume, restart only the one stand-in
run whose renewals never came back.
"""

from __future__ import annotations

import json
import time
from typing import Any

import pytest

from durablerun_testbed import procs
from tests.helpers.metrics import scrape
from tests.helpers.runs import Operator, RunEnv, StartOperator
from tests.operator.standin import StandIn

pytestmark = pytest.mark.testbed

# A few hundred on a machine of their own; the suite shares two cores with everything else, and the stand-in
# must keep up with its renewals for "healthy" to mean anything. (stand-ins, lease seconds): `make test` runs 20
# runs on a 20 s lease (renewals every 6.7 s, 3 PATCHes a second; a lease counts as late 11 s after its renewal);
# `make faults` 40 on a 30 s lease (renewals every 10 s, 4 PATCHes a second; late after 16 s). Both are well
# past the operator's mass expiry threshold (DURABLERUN_MASS_EXPIRY_MIN_RUNS 10, half of the active leases).
SIZES = [(20, 20), pytest.param(40, 30, marks=pytest.mark.long)]


def step(what: str) -> None:
    print(f"{time.strftime('%X')} {what}", flush=True)  # shown with a failure: how far the test got, and when


def mass_expiry(operator: Operator) -> float | None:
    return scrape(operator).get(("durablerun_mass_lease_expiry", frozenset()))


@pytest.mark.timeout(900)
@pytest.mark.parametrize(("stand_ins", "lease"), SIZES, ids=["20-runs", "40-runs"])
def test_a_renewal_stall_restarts_no_healthy_run_and_a_dead_pod_still_restarts(
        start_operator: StartOperator, runs: RunEnv, stand_ins: int, lease: int) -> None:
    operator = start_operator()
    names = [f"standin-{i:03d}" for i in range(stand_ins)]
    items = []
    for name in names:
        manifest = runs.manifest(name, "optest_flows:steps", policy={"leaseDuration": f"{lease}s"})
        manifest["spec"]["template"]["spec"]["schedulerName"] = "durablerun-test-no-scheduler"  # stays Pending
        items.append(manifest)
    runs.testbed.kubectl("apply", "-f", "-", input=json.dumps({"apiVersion": "v1", "kind": "List", "items": items}))
    runs.apply(runs.manifest("real", "optest_flows:steps", {"steps": 2000, "sleep": 0.5},
                             policy={"leaseDuration": f"{lease}s", "backoff": {"initial": "0s", "max": "1s"}}))
    victim = names[0]

    with StandIn(runs, names, lease) as stand_in:
        procs.wait_for(lambda: len(stand_in.held) == stand_ins, timeout=240, interval=1.0,
                       what=f"all {stand_ins} stand-in leases acquired")
        procs.wait_for(lambda: "done s1" in runs.ledger(), timeout=120, what="the real run's first steps")
        step("all leases held")
        before = {run["metadata"]["name"]: run["status"] for run in _runs(runs)}
        assert all(before[name].get("restarts", 0) == 0 for name in names), "a lease lapsed before the stall"

        # The renewals stall for longer than the lease (validity: lease + 2 s).
        stand_in.never_again.add(victim)
        stand_in.paused.set()
        stalled = time.time()
        step("renewals paused")
        procs.wait_for(lambda: mass_expiry(operator) == 1, timeout=lease + 30, interval=0.5,
                       what="the operator to report a mass lease expiry")

        # A pod seen dead is restarted at once, mass expiry or not.
        real_pod = runs.get("real")["status"]["pod"]
        node = runs.testbed.node
        assert node
        step("killing the real run's pod")
        node.kill(runs.namespace, real_pod)
        procs.wait_for(lambda: runs.get("real")["status"].get("restarts") == 1, timeout=60,
                       what="the real run whose pod was killed to be restarted during the mass expiry")
        assert mass_expiry(operator) == 1
        # Every stand-in lease is well past its validity before the renewals come back.
        procs.wait_for(lambda: time.time() > stalled + 2 * (lease + 2), timeout=3 * lease + 10,
                       what="the stall to outlast two leases")
        assert all(status.get("restarts", 0) == 0 for status in _statuses(runs, names)), \
            "a healthy run was restarted during the stall"

        step("renewals resumed")
        stand_in.paused.clear()
        procs.wait_for(lambda: mass_expiry(operator) == 0, timeout=2 * lease + 30, interval=0.5,
                       what="the mass lease expiry to end once renewals resume")
        # The one runner that never came back is restarted once its lease has had a full validity since.
        step("mass expiry over")
        restarted = procs.wait_for(lambda: (s := runs.get(victim)["status"]).get("restarts") == 1 and s,
                                   timeout=3 * lease + 60, what=f"{victim} (never renewed again) to be restarted")
        assert restarted["epoch"] == before[victim]["epoch"] + 1
        # Another lease's time for anything that would still go wrong to show.
        step("victim restarted")
        procs.wait_for(_unchanged_for(runs, lease + 5), timeout=2 * lease + 30, interval=1.0,
                       what="a lease's time with no new restart")

    after = {run["metadata"]["name"]: run["status"] for run in _runs(runs)}
    healthy = [name for name in names if name != victim]
    assert [n for n in healthy if after[n].get("restarts", 0) != 0 or after[n]["epoch"] != before[n]["epoch"]] == []
    assert after[victim]["restarts"] == 1
    assert after["real"]["restarts"] == 1
    assert not stand_in.errors, stand_in.errors[:5]
    reasons = [e["reason"] for e in runs.events(names[1])]
    assert "LeaseExpiryHeld" in reasons, reasons
    assert "LeaseExpired" not in reasons, reasons
    assert "LeaseExpired" in [e["reason"] for e in runs.events(victim)]
    real_events = runs.events("real")
    assert any(e["reason"] == "Restarting" and "Crash" in e["message"] for e in real_events), \
        [(e["reason"], e["message"]) for e in real_events]


def _runs(runs: RunEnv) -> list[dict[str, Any]]:
    out = runs.testbed.kubectl("get", "dr", "-n", runs.namespace, "-o", "json").stdout
    return list(json.loads(out)["items"])


def _statuses(runs: RunEnv, names: list[str]) -> list[dict[str, Any]]:
    wanted = set(names)
    return [run.get("status") or {} for run in _runs(runs) if run["metadata"]["name"] in wanted]


def _unchanged_for(runs: RunEnv, seconds: float) -> Any:
    """A condition: true once no run's restart count has changed for ``seconds``."""
    seen: dict[str, Any] = {}

    def check() -> bool:
        counts = {run["metadata"]["name"]: (run.get("status") or {}).get("restarts", 0) for run in _runs(runs)}
        if seen.get("counts") != counts:
            seen.update(counts=counts, since=time.time())
        return bool(time.time() - seen["since"] >= seconds)

    return check
