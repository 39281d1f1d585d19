"""More than one operator: replicas split the runs by a stable hash of each run's uid over shards held as Leases.

A run belongs to shard ``shard_of(uid, shards)``; a replica decides the runs of the shards it holds and no
other. Which replica should hold a shard is a pure answer (``assign``: rendezvous hashing over the live
replicas, so a replica joining or leaving moves only its own share); holding it is a coordination.k8s.io
Lease per shard in the operator's namespace, renewed every third of its duration, as client-go's leader
election does. Each replica also renews a Lease of its own (``member_lease``): the live replicas are those
whose member Lease is renewed.

A Lease is judged expired on this replica's own clock, as client-go does: when its resourceVersion has not
changed for its duration since this replica first saw that version, whatever the times written in it (the
replicas' clocks need not agree). A replica stops deciding a shard's runs a margin before anyone else could
take it over: when it has not renewed the Lease for ``duration - FENCE_MARGIN`` since it sent the renewal.
A write already in flight when it stops is kept safe by the runs' own guards (docs/design.md, "More than
one operator").

With one replica (``Settings.shards`` 0) none of this runs: every run is the operator's, no Lease is made.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass

from durablerun_operator.config import Settings
from durablerun_operator.kube import Conflict, Kube

log = logging.getLogger("durablerun.operator.shards")

SHARD_PREFIX = "durablerun-shard-"
MEMBER_PREFIX = "durablerun-replica-"
TICK_SECONDS = 1.0  # how often the Leases are read: a dead replica's shards are taken over within duration + 2 ticks
FORGET_AFTER = 10  # lease durations after which a silent replica's member Lease is deleted
FENCE_MARGIN = 0.2  # share of the duration a replica gives up early, for its clock running slow against others'


# --- pure: which shard a run is in, which replica should hold a shard -------------------


def shard_of(uid: str, shards: int) -> int:
    """The shard of the run with this uid: stable across processes, versions and restarts."""
    return int.from_bytes(hashlib.sha256(uid.encode()).digest()[:8], "big") % shards


def _weight(shard: int, replica: str) -> int:
    return int.from_bytes(hashlib.sha256(f"{shard}/{replica}".encode()).digest()[:8], "big")


def assign(shard: int, replicas: Iterable[str]) -> str | None:
    """The replica that should hold ``shard`` (None with no replica): the highest weight, so a replica that
    joins or leaves moves only the shards it gains or held."""
    return max(replicas, key=lambda replica: (_weight(shard, replica), replica), default=None)


def wanted(me: str, replicas: Iterable[str], shards: int) -> frozenset[int]:
    """The shards replica ``me`` should hold, given the live replicas (``me`` counts as live)."""
    live = {*replicas, me}
    return frozenset(shard for shard in range(shards) if assign(shard, live) == me)


def shard_lease(shard: int) -> str:
    return f"{SHARD_PREFIX}{shard}"


def member_lease(identity: str) -> str:
    return f"{MEMBER_PREFIX}{identity}"


@dataclass(frozen=True)
class Seen:
    """A Lease's version and holder, and when (time.monotonic) this replica first saw that version."""

    version: str
    holder: str
    since: float


def expired(seen: Seen, duration: float, now: float) -> bool:
    """Unchanged for a whole duration on this replica's clock (or released): free to take."""
    return not seen.holder or now - seen.since >= duration


# --- the Leases ----------------------------------------------------------------------


class Keeper:
    """Holds this replica's shards: renews them, takes the ones it should hold as they fall free, hands over
    the ones another replica should hold, and tells ``on_change(gained, lost)``."""

    def __init__(self, kube: Kube, settings: Settings) -> None:
        self.kube, self.identity, self.namespace = kube, settings.replica_name, settings.lease_namespace
        self.shards, self.duration = settings.shards, settings.shard_lease_seconds
        self.on_change: Callable[[set[int], set[int]], None] = lambda gained, lost: None
        self._held: dict[int, float] = {}  # shard -> time.monotonic() its last successful write was sent
        self._seen: dict[str, Seen] = {}
        self._member_sent: float | None = None

    def shard_of(self, uid: str) -> int:
        return shard_of(uid, self.shards)

    def owns(self, uid: str) -> bool:
        """Whether this replica may decide the run with this uid now: its shard's Lease is ours and fresh."""
        sent = self._held.get(self.shard_of(uid))
        return sent is not None and time.monotonic() < sent + self.duration * (1 - FENCE_MARGIN)

    def held(self) -> frozenset[int]:
        return frozenset(shard for shard, sent in self._held.items()
                         if time.monotonic() < sent + self.duration * (1 - FENCE_MARGIN))

    async def run_forever(self) -> None:
        while True:
            started = time.monotonic()
            try:
                await self.tick()
            except Exception:
                log.exception("shard leases could not be read or written; trying again")
                self._drop({shard for shard in self._held if shard not in self.held()})
            await asyncio.sleep(max(0.0, started + TICK_SECONDS - time.monotonic()))

    async def tick(self) -> None:
        """Read every Lease once, then renew, take and hand over what this replica should."""
        now = time.monotonic()
        leases = {lease["metadata"]["name"]: lease
                  for lease in await asyncio.to_thread(self.kube.list_leases, self.namespace)}
        self._observe(leases, now)
        members = {name: seen for name, seen in self._seen.items() if name.startswith(MEMBER_PREFIX)}
        live = {name.removeprefix(MEMBER_PREFIX) for name, seen in members.items()
                if not expired(seen, self.duration, now)}
        for name, member in members.items():  # replicas gone for good (a rollout names pods anew): tidy up
            if now - member.since >= FORGET_AFTER * self.duration and name != member_lease(self.identity):
                await asyncio.to_thread(self.kube.delete_lease, self.namespace, name, member.version)
        await self._renew_member(leases.get(member_lease(self.identity)), now)
        want = wanted(self.identity, live, self.shards)
        self._drop({shard for shard in self._held if shard not in self.held()})  # could not renew in time
        writes = []  # sent together: a slow API server must not make the last shard's renewal late
        for shard in range(self.shards):
            lease = leases.get(shard_lease(shard))
            seen = self._seen.get(shard_lease(shard))
            if shard in self._held:
                if seen is not None and seen.holder != self.identity:
                    self._drop({shard})  # taken over: we were too late to renew it
                elif shard not in want:
                    self._drop({shard})  # stop deciding first, then let the replica that should hold it
                    writes.append(self._write(shard, lease, "", now))
                elif now - self._held[shard] >= self.duration / 3:
                    writes.append(self._take(shard, lease, now))
            elif shard in want and (seen is None or seen.holder == self.identity
                                    or expired(seen, self.duration, now)):
                writes.append(self._take(shard, lease, now))
        await asyncio.gather(*writes)

    async def release_all(self) -> None:
        """On shutdown: hand every shard over at once instead of letting its Lease run out."""
        shards = set(self._held)
        self._drop(shards)
        for shard in sorted(shards):
            lease = await asyncio.to_thread(self.kube.get_lease, self.namespace, shard_lease(shard))
            if lease and lease["spec"].get("holderIdentity") == self.identity:
                await self._write(shard, lease, "", time.monotonic())

    def _observe(self, leases: dict[str, dict[str, object]], now: float) -> None:
        for name in set(self._seen) - set(leases):
            del self._seen[name]
        for name, lease in leases.items():
            if not name.startswith((SHARD_PREFIX, MEMBER_PREFIX)):
                continue
            version = str(lease["metadata"]["resourceVersion"])  # type: ignore[index]
            holder = str(lease["spec"].get("holderIdentity") or "")  # type: ignore[attr-defined]
            if (old := self._seen.get(name)) is None or old.version != version:
                self._seen[name] = Seen(version, holder, now)

    async def _renew_member(self, lease: dict[str, object] | None, now: float) -> None:
        if self._member_sent is not None and now - self._member_sent < self.duration / 3:
            return
        try:
            await asyncio.to_thread(self.kube.write_lease, self.namespace, member_lease(self.identity), lease,
                                    self.identity, self.duration)
            self._member_sent = now
        except Conflict:
            self._member_sent = None  # written meanwhile (by an earlier incarnation of this identity): next tick

    async def _take(self, shard: int, lease: dict[str, object] | None, now: float) -> bool:
        if await self._write(shard, lease, self.identity, now):
            gained = shard not in self._held
            self._held[shard] = now
            if gained:
                log.info("holding shard %d", shard)
                self.on_change({shard}, set())
            return True
        self._drop({shard})
        return False

    async def _write(self, shard: int, lease: dict[str, object] | None, holder: str, now: float) -> bool:
        try:
            await asyncio.to_thread(self.kube.write_lease, self.namespace, shard_lease(shard), lease, holder,
                                    self.duration)
            return True
        except Conflict:
            return False  # someone else wrote it first: read again next tick

    def _drop(self, shards: set[int]) -> None:
        lost = shards & set(self._held)
        for shard in lost:
            del self._held[shard]
            log.info("no longer holding shard %d", shard)
        if lost:
            self.on_change(set(), lost)
