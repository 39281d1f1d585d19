"""Mass lease expiry: when many leases lapse at once, the API server or the operator is slow, not the runners.

Like the node lifecycle controller's disruption mode: a lease that lapses alone
means its runner hung and the run is restarted; when a large share of the
active leases are late together (renewals stuck behind a slow API server, or
an operator whose watch fell behind), restarting them all would add load to
what is already overloaded and throw away healthy attempts. So restarts that
rest only on the lease are held while that lasts; a pod seen dead (its
container terminated, evicted, deleted) is still restarted at once, since
``decide`` gives it another reason than LeaseExpired. When renewals recover,
every held lease gets one more lease validity, counted from the recovery,
before it counts as expired (as the node lifecycle controller resets every
node's probe time when it leaves disruption mode). Pure: the reconciler
keeps the state and does the IO. docs/operator.md, "Mass lease expiry".
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime, timedelta

from durablerun import api
from durablerun_operator import decide
from durablerun_operator.decide import clocks


@dataclass(frozen=True)
class Policy:
    #: The share of active leases late at once that counts as a mass expiry (0 turns the hold off).
    fraction: float = 0.5
    #: Fewer late leases than this are never a mass expiry, whatever their share.
    min_runs: int = 10

    @property
    def enabled(self) -> bool:
        return self.fraction > 0


@dataclass(frozen=True)
class Lease:
    """An active run's lease, as the operator last saw it."""

    renewed: datetime  # its last renewal; before the first, its runner container's start
    validity: timedelta  # decide.lease_validity: the duration its holder published plus the clock-skew margin
    epoch: int  # the attempt's: a start time read with the pods stands until the attempt changes

    def late(self, now: datetime) -> bool:
        # Runners renew every third of the lease: a lease half through its validity has missed a renewal.
        # Counting those, not only the expired ones, sees a mass expiry coming before its first lease lapses.
        return now - self.renewed > self.validity / 2

    def behind(self, now: datetime) -> bool:
        """Late but still valid: its renewal may yet come. Past its validity it is restarted (or held)."""
        return self.late(now) and now - self.renewed <= self.validity


def active_lease(run: decide.RunView, running_since: datetime | None = None) -> Lease | None:
    """The lease of a Running run's current attempt: its last renewal, or, before the first, its runner
    container's start (``running_since``, from which decide judges a lease not yet acquired). Runners
    started together on a starved node acquire late as renewals behind a slow API server come late: their
    restarts are held alike, rather than fenced and started again onto the same starved CPUs. None for any
    other run, and for an attempt whose container's start is not known."""
    status = run.status
    if status.phase != api.Phase.RUNNING:
        return None
    held = status.lease.epoch == status.epoch
    renewed = api.parse_time(status.lease.renewTime) if held else running_since
    return Lease(renewed, clocks.lease_validity(run), status.epoch) if renewed is not None else None


@dataclass(frozen=True)
class Judgement:
    active: int
    late: int
    mass_expiry: bool
    #: Of the late leases, those still valid (Lease.behind).
    behind: int


def judge(leases: Iterable[Lease], now: datetime, policy: Policy, *, holding: bool = False) -> Judgement:
    """Whether the late leases among ``leases`` (every active run's) are a mass expiry.

    ``holding``: one is under way. It ends only once fewer than half as many
    leases are late as it took to start it, so renewals that catch up slowly
    do not flap it on and off (each end gives every held lease a fresh validity).
    """
    active = late = behind = 0
    for lease in leases:
        active += 1
        late += lease.late(now)
        behind += lease.behind(now)
    threshold = max(policy.min_runs, 1, policy.fraction * active)
    mass = policy.enabled and late >= (threshold / 2 if holding else threshold)
    return Judgement(active, late, mass, behind)


#: Pod starts are paced while at least this share of the active leases, and this many, are behind (late, still
#: valid): renewals falling behind mean the API server is saturated, and every start adds to its load
#: (docs/operator.md, "Renewals first"). A single hung runner is not enough.
PACE_FRACTION = 0.02
PACE_MIN_LATE = 2


def pace_starts(judgement: Judgement) -> bool:
    """Whether new pods should start at the paced rate: renewals are falling behind.

    Only leases still valid count. One past its validity is a runner gone, restarted now (or held in a mass
    expiry): the runners of a lost node, whose leases lapse together, must not slow their own restarts to the
    paced rate (the bench's 50 of 1,000 did: detected 10 s after expiry instead of 2)."""
    return judgement.behind >= max(PACE_MIN_LATE, PACE_FRACTION * judgement.active)


def hold_until(restart_reason: str | None, lease: Lease | None, now: datetime, *, mass_expiry: bool,
               recovered_at: datetime | None) -> datetime | None:
    """Until when a planned restart must wait (the reconciler decides again then); None: carry it out now.

    Only restarts for an expired lease wait: during a mass expiry, and after
    one until the lease has had a full validity since renewals recovered
    (its runner may simply not have had its turn yet).
    """
    if restart_reason != api.RestartReason.LEASE_EXPIRED.value:
        return None
    validity = lease.validity if lease is not None else timedelta(0)
    if mass_expiry:
        return now + max(validity, timedelta(seconds=1))  # the end of the mass expiry queues it sooner
    if recovered_at is not None and (lease is None or lease.renewed < recovered_at):
        until = recovered_at + validity
        if now < until:
            return until
    return None
