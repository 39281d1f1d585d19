"""The mass-lease-expiry judgement and the hold of lease-only restarts (pure logic, no test bed).

tests/operator/test_overload.py proves the same on the test bed with stand-in runners.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from durablerun import api
from durablerun_operator import decide, overload
from tests.operator.run_bodies import body, running

NOW = datetime(2026, 11, 22, 12, 0, 0, tzinfo=UTC)
VALIDITY = timedelta(seconds=62)  # a 60 s lease plus the clock-skew margin
POLICY = overload.Policy(fraction=0.5, min_runs=10)
LEASE_EXPIRED = api.RestartReason.LEASE_EXPIRED.value


def leases(fresh: int, late: int) -> list[overload.Lease]:
    """``fresh`` leases renewed 5 s ago, ``late`` ones last renewed before half their validity."""
    return ([overload.Lease(NOW - timedelta(seconds=5), VALIDITY, 2)] * fresh
            + [overload.Lease(NOW - timedelta(seconds=40), VALIDITY, 2)] * late)


@pytest.mark.parametrize(("fresh", "late", "policy", "mass"), [
    (500, 0, POLICY, False),                  # all healthy
    (499, 1, POLICY, False),                  # one hung runner: restart it
    (491, 9, POLICY, False),                  # a few hung runners, a small share
    (5, 9, POLICY, False),                    # a large share, but fewer than min_runs: a node's worth of runners
    (250, 250, POLICY, True),                 # half the fleet at once: the API server or the operator is slow
    (0, 500, POLICY, True),                   # every renewal stalled
    (11, 10, POLICY, False),                  # just under the share
    (10, 10, POLICY, True),                   # exactly the share and the minimum
    (0, 500, overload.Policy(fraction=0, min_runs=10), False),   # turned off
    (0, 3, overload.Policy(fraction=0.5, min_runs=1), True),
    (0, 0, overload.Policy(fraction=0.5, min_runs=0), False),    # nothing late is never a mass expiry
])
def test_judge_counts_late_leases_against_the_share_and_the_minimum(
        fresh: int, late: int, policy: overload.Policy, mass: bool) -> None:
    judgement = overload.judge(leases(fresh, late), NOW, policy)
    assert (judgement.active, judgement.late, judgement.mass_expiry) == (fresh + late, late, mass)


@pytest.mark.parametrize(("fresh", "late", "mass"), [
    (250, 250, True),    # still half late
    (375, 125, True),    # renewals catching up: half of the 250 (50% of 500) it takes to start one
    (376, 124, False),   # fewer than half: over
    (495, 5, False),     # recovered
    (0, 5, True),        # few runs: half of min_runs (10) still holds
    (0, 4, False),
])
def test_a_mass_expiry_under_way_ends_only_once_half_as_many_leases_are_late(fresh: int, late: int,
                                                                             mass: bool) -> None:
    assert overload.judge(leases(fresh, late), NOW, POLICY, holding=True).mass_expiry is mass


def test_a_lease_is_late_once_half_its_validity_passed_without_a_renewal() -> None:
    lease = overload.Lease(NOW, VALIDITY, 2)
    assert not lease.late(NOW + VALIDITY / 2)
    assert lease.late(NOW + VALIDITY / 2 + timedelta(milliseconds=1))


def test_active_lease_is_only_a_held_lease_of_a_running_attempt() -> None:
    held = overload.active_lease(decide.RunView.from_body(body(running())))
    assert held is not None
    assert held.validity == timedelta(seconds=60) + decide.CLOCK_SKEW_MARGIN
    assert overload.active_lease(decide.RunView.from_body(body(running(lease={})))) is None
    stale_epoch = running(lease={"holder": "run-a1", "epoch": 1, "renewTime": "2026-11-22T12:00:00Z"})
    assert overload.active_lease(decide.RunView.from_body(body(stale_epoch))) is None
    assert overload.active_lease(decide.RunView.from_body(body({"phase": "Backoff"}))) is None


LEASE = overload.Lease(NOW - timedelta(seconds=70), VALIDITY, 2)


@pytest.mark.parametrize(("reason", "mass", "recovered", "expected"), [
    # No mass expiry, none recently: an expired lease is a hung runner, restart it.
    (LEASE_EXPIRED, False, None, None),
    # During a mass expiry: held, looked at again after a lease (or when the mass expiry ends).
    (LEASE_EXPIRED, True, None, NOW + VALIDITY),
    # A pod seen dead is restarted at once, mass expiry or not.
    (api.RestartReason.CRASH.value, True, None, None),
    (api.RestartReason.NODE_LOST.value, True, None, None),
    (None, True, None, None),
    # Renewals recovered 10 s ago, the lease was last renewed before that: one validity from the recovery.
    (LEASE_EXPIRED, False, NOW - timedelta(seconds=10), NOW - timedelta(seconds=10) + VALIDITY),
    # ... and once that has passed too, the runner really hung: restart it.
    (LEASE_EXPIRED, False, NOW - timedelta(seconds=65), None),
    # A recovery older than the lease's last renewal gives it nothing more.
    (LEASE_EXPIRED, False, NOW - timedelta(seconds=80), None),
])
def test_hold_until_holds_only_lease_restarts_during_and_just_after_a_mass_expiry(
        reason: str | None, mass: bool, recovered: datetime | None, expected: datetime | None) -> None:
    assert overload.hold_until(reason, LEASE, NOW, mass_expiry=mass, recovered_at=recovered) == expected


@pytest.mark.parametrize(("fresh", "late", "paced"), [
    (500, 0, False),    # renewals on time: starts at full rate
    (499, 1, False),    # one hung runner is not the API server
    (490, 10, True),    # 2% of the fleet's renewals late: the API server is falling behind
    (10, 2, True),      # a small fleet: two late leases
    (2000, 30, False),  # under 2%
])
def test_starts_are_paced_while_renewals_fall_behind(fresh: int, late: int, paced: bool) -> None:
    judgement = overload.judge(leases(fresh, late), NOW, POLICY)
    assert overload.pace_starts(judgement) is paced


def test_leases_past_their_validity_do_not_pace_the_restarts_of_their_runs() -> None:
    # A lost node's 50 runners of 1,000: their leases lapse together. Behind, they pace new starts; expired,
    # they are runners gone, and their restarts go at once (the lease-expiry detection target).
    behind = leases(950, 50)
    assert overload.pace_starts(overload.judge(behind, NOW, POLICY))
    expired = [overload.Lease(NOW - VALIDITY - timedelta(seconds=1), VALIDITY, 2)] * 50
    judgement = overload.judge(leases(950, 0) + expired, NOW, POLICY)
    assert (judgement.late, judgement.behind) == (50, 0)
    assert not overload.pace_starts(judgement)
    # Right at its validity a lease is still behind: its renewal may yet come.
    assert overload.Lease(NOW - VALIDITY, VALIDITY, 2).behind(NOW)


def run_view(name: str, attempt: int = 0) -> decide.RunView:
    """A run about to start its attempt ``attempt + 1``."""
    run = body({"phase": "Pending" if attempt == 0 else "Backoff", "attempt": attempt, "restarts": attempt})
    run["metadata"]["name"] = name
    return decide.RunView.from_body(run)


def test_paced_starts_come_at_the_paced_rate_each_run_keeping_its_turn() -> None:
    from durablerun_operator import holds
    from durablerun_operator.config import Settings

    held = holds.LeaseHolds(None, Settings(), None, lambda key: None)  # type: ignore[arg-type]
    now = datetime.now(UTC)
    for i, lease in enumerate(leases(0, 5)):
        held.leases[("ns", f"run-{i}")] = overload.Lease(now - (NOW - lease.renewed), lease.validity, 2)
    start = decide.Plan()
    start.create_pod_epoch = 1
    assert held.pace(run_view("a"), decide.Plan(), now) == 0  # a plan that starts no pod takes no turn
    waits = [held.pace(run_view(name), start, now) for name in ("a", "b", "c")]
    step = 1 / holds.PACED_STARTS_PER_SECOND
    assert waits[0] == 0  # the first goes now
    assert step - 0.1 < waits[1] <= step  # the 2nd and 3rd are told when their turn comes
    assert 2 * step - 0.1 < waits[2] <= 2 * step
    # Asked again before its turn, a run keeps it: a run decided again early takes no second turn.
    assert 2 * step - 0.2 < held.pace(run_view("c"), start, now) <= waits[2]
    assert 2 * step < held.pace(run_view("d"), start, now) <= 3 * step
    # A run that started before (a restart, a wake) goes on at once and takes no new run's turn.
    assert held.pace(run_view("restarted", attempt=1), start, now) == 0
    assert 3 * step < held.pace(run_view("e"), start, now) <= 4 * step
