"""The ingress's rate limits: token buckets in a table whose size is bounded, and who the client is.

Pure (the clock is a parameter), so the bound is tested without a server. Keys come from outside (a
client's address, a run's name), so the table must not grow with them: a bucket left alone for
``burst / rate`` seconds is full again, the same as no bucket, and is dropped; past ``max_buckets`` the
least recently used one goes. Buckets are kept in the order they were last used, so both are O(1).
"""

from __future__ import annotations

import ipaddress
import time
from collections import OrderedDict
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field


class _Bucket:
    __slots__ = ("stamp", "tokens")

    def __init__(self, tokens: float, stamp: float) -> None:
        self.tokens, self.stamp = tokens, stamp


@dataclass
class RateLimits:
    """A token bucket per key: ``rate`` a second, up to ``burst`` at once, at most ``max_buckets`` kept."""

    rate: float
    burst: int
    max_buckets: int = 20_000
    clock: Callable[[], float] = time.monotonic
    buckets: OrderedDict[str, _Bucket] = field(default_factory=OrderedDict)

    def __post_init__(self) -> None:
        if self.rate <= 0 or self.burst < 1 or self.max_buckets < 1:
            raise ValueError(f"a rate limit needs rate > 0, burst >= 1 and max_buckets >= 1, got rate {self.rate}, "
                             f"burst {self.burst}, max_buckets {self.max_buckets}")

    def _refill(self, key: str, now: float) -> _Bucket | None:
        # Drop the buckets that are full again (least recently used first): they hold nothing.
        refill_time = self.burst / self.rate
        while self.buckets:
            oldest = next(iter(self.buckets.values()))
            if now - oldest.stamp < refill_time:
                break
            self.buckets.popitem(last=False)
        bucket = self.buckets.get(key)
        if bucket is not None:
            bucket.tokens = min(float(self.burst), bucket.tokens + (now - bucket.stamp) * self.rate)
            bucket.stamp = now
            self.buckets.move_to_end(key)
        return bucket

    def available(self, key: str) -> bool:
        """Whether ``key`` has a request left, without spending it."""
        bucket = self._refill(key, self.clock())
        return bucket is None or bucket.tokens >= 1

    def allow(self, key: str) -> bool:
        """Spend one of ``key``'s requests; False if it has none left."""
        now = self.clock()
        bucket = self._refill(key, now)
        if bucket is None:
            while len(self.buckets) >= self.max_buckets:
                self.buckets.popitem(last=False)
            bucket = self.buckets[key] = _Bucket(float(self.burst), now)
        if bucket.tokens < 1:
            return False
        bucket.tokens -= 1
        return True


Network = ipaddress.IPv4Network | ipaddress.IPv6Network


def parse_networks(cidrs: Iterable[str]) -> tuple[Network, ...]:
    """The trusted proxies' networks; ValueError naming a bad one."""
    networks = []
    for cidr in cidrs:
        try:
            networks.append(ipaddress.ip_network(cidr.strip(), strict=False))
        except ValueError:
            raise ValueError(f"trusted proxy {cidr!r} is not an address or a network (e.g. 10.0.0.0/8)") from None
    return tuple(networks)


def client_key(peer: str | None, headers: Mapping[str, str], trusted: tuple[Network, ...]) -> str:
    """Who is asking, as a rate limit's key: the peer's address, or behind trusted proxies the last address of
    ``X-Forwarded-For`` that is not one of them. An IPv6 client is its /64, as one host usually holds all of
    it (else a single host would have 2^64 keys)."""
    address = _address(peer)
    if address is not None and any(address in net for net in trusted):
        hops = [h.strip() for h in ",".join(v for k, v in headers.items() if k.lower() == "x-forwarded-for")
                .split(",") if h.strip()]
        for hop in reversed(hops):
            address = _address(hop)
            if address is None or not any(address in net for net in trusted):
                break
    if address is None:
        return "unknown"
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is None:
        return str(ipaddress.ip_network(f"{address}/64", strict=False))
    return str(address.ipv4_mapped or address) if isinstance(address, ipaddress.IPv6Address) else str(address)


def _address(text: str | None) -> ipaddress.IPv4Address | ipaddress.IPv6Address | None:
    try:
        return ipaddress.ip_address((text or "").strip())
    except ValueError:
        return None
