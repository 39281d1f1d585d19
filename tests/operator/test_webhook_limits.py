"""The ingress's rate limits: bounded whatever keys the outside sends, and who counts as the client."""

from __future__ import annotations

import random
import tracemalloc

import pytest

from durablerun_operator.ingress import limits


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_a_bucket_allows_its_burst_then_its_rate() -> None:
    clock = Clock()
    limit = limits.RateLimits(rate=2.0, burst=3, clock=clock)
    assert [limit.allow("a") for _ in range(4)] == [True, True, True, False]
    assert limit.allow("b")  # another key has its own bucket
    assert not limit.available("a")
    clock.now += 0.5  # one request's worth
    assert limit.available("a")
    assert limit.allow("a")
    assert not limit.allow("a")


KEYS = 1_000_000


# tracemalloc slows every allocation about twentyfold: `make test` traces the first 200,000 keys (ten times the
# table's cap, so 180,000 of them evicted one) and sends the rest untraced; `make faults` traces all of them.
@pytest.mark.parametrize("traced", [200_000, pytest.param(KEYS, marks=pytest.mark.long)],
                         ids=["traced-200k", "traced-1m"])
def test_a_million_random_keys_keep_the_table_bounded(traced: int) -> None:
    """What a forger controls (addresses, run names in URLs) cannot grow the ingress's memory: at most
    ``max_buckets`` buckets whatever arrives at once, and those left alone until full again are dropped."""
    clock = Clock()
    cap = limits.RateLimits(rate=1.0, burst=1).max_buckets  # the ingress's default
    limit = limits.RateLimits(rate=1.0, burst=20, max_buckets=cap, clock=clock)
    rng = random.Random(44)

    def send(first: int, last: int) -> None:
        for i in range(first, last):
            limit.allow(f"{rng.getrandbits(64):016x}")
            if i % 1000 == 0:
                clock.now += 0.001  # a million requests in one second: nothing is full again yet

    tracemalloc.start()
    try:
        baseline = tracemalloc.get_traced_memory()[0]
        send(0, traced)
        assert len(limit.buckets) == cap
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    per_bucket = (peak - baseline) / cap
    print(f"{traced:,} random keys traced: {len(limit.buckets)} buckets kept, peak {(peak - baseline) / 1e6:.1f} "
          f"MB ({per_bucket:.0f} B a bucket)")
    assert peak - baseline < 10e6, f"{(peak - baseline) / 1e6:.1f} MB for {cap} buckets"
    send(traced, KEYS)
    assert len(limit.buckets) == cap

    # Left alone for burst / rate seconds, every bucket is full again, the same as none: all dropped.
    clock.now += 20
    limit.allow("one more")
    assert list(limit.buckets) == ["one more"]


def test_the_least_recently_used_bucket_goes_first() -> None:
    clock = Clock()
    limit = limits.RateLimits(rate=1.0, burst=5, max_buckets=2, clock=clock)
    limit.allow("old")
    limit.allow("busy")
    limit.allow("old")  # used again: now "busy" is the least recent
    limit.allow("new")
    assert list(limit.buckets) == ["old", "new"]


@pytest.mark.parametrize(("peer", "forwarded", "trusted", "client"), [
    ("203.0.113.7", "", [], "203.0.113.7"),
    ("203.0.113.7", "198.51.100.1", [], "203.0.113.7"),  # an untrusted peer cannot name another client
    ("10.0.0.5", "198.51.100.1", ["10.0.0.0/8"], "198.51.100.1"),
    ("10.0.0.5", "1.2.3.4, 198.51.100.1, 10.0.0.9", ["10.0.0.0/8"], "198.51.100.1"),  # the client's own entry
    ("10.0.0.5", "", ["10.0.0.0/8"], "10.0.0.5"),
    ("2001:db8:1:2:aaaa::1", "", [], "2001:db8:1:2::/64"),  # a host's /64 is one client
    ("::ffff:203.0.113.7", "", [], "203.0.113.7"),
    (None, "", [], "unknown"),
])
def test_the_client_is_the_peer_or_what_a_trusted_proxy_says(
        peer: str | None, forwarded: str, trusted: list[str], client: str) -> None:
    headers = {"X-Forwarded-For": forwarded} if forwarded else {}
    assert limits.client_key(peer, headers, limits.parse_networks(trusted)) == client


def test_bad_settings_say_what_is_wrong() -> None:
    with pytest.raises(ValueError, match="not an address or a network"):
        limits.parse_networks(["10.0.0.0/33"])
    with pytest.raises(ValueError, match="rate > 0"):
        limits.RateLimits(rate=0, burst=1)
