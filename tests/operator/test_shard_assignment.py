"""Which shard a run falls in, and which replica should hold each shard: pure answers (shards.py)."""

from __future__ import annotations

import os
import subprocess
import sys
import uuid
from collections import Counter

from durablerun_operator import shards

SHARDS = 16


def test_a_runs_shard_depends_on_its_uid_alone_and_spreads_runs_evenly() -> None:
    uids = [str(uuid.uuid4()) for _ in range(16_000)]
    assert [shards.shard_of(uid, SHARDS) for uid in uids[:50]] == [shards.shard_of(uid, SHARDS) for uid in uids[:50]]
    counts = Counter(shards.shard_of(uid, SHARDS) for uid in uids)
    assert set(counts) == set(range(SHARDS))
    assert max(counts.values()) < 1.2 * 1000, counts
    assert min(counts.values()) > 0.8 * 1000, counts


def test_the_same_uid_falls_in_the_same_shard_in_another_process() -> None:
    # A replica started later (another PYTHONHASHSEED) must agree with the others.
    uids = [str(uuid.uuid4()) for _ in range(20)]
    code = ("import sys; from durablerun_operator import shards; "
            "print([shards.shard_of(u, 16) for u in sys.argv[1:]])")
    out = subprocess.run([sys.executable, "-c", code, *uids], check=True, capture_output=True, text=True,
                         env={**os.environ, "PYTHONHASHSEED": "12345"}).stdout
    assert out.strip() == str([shards.shard_of(uid, SHARDS) for uid in uids])


def test_live_replicas_split_every_shard_between_them_once() -> None:
    replicas = ["op-a", "op-b", "op-c"]
    held = {me: shards.wanted(me, replicas, SHARDS) for me in replicas}
    assert sorted(s for mine in held.values() for s in mine) == list(range(SHARDS))  # each shard exactly once
    assert all(len(mine) >= 2 for mine in held.values()), held


def test_a_replica_leaving_moves_only_its_own_shards() -> None:
    replicas = ["op-a", "op-b", "op-c", "op-d"]
    before = {me: shards.wanted(me, replicas, SHARDS) for me in replicas}
    survivors = ["op-a", "op-c", "op-d"]
    after = {me: shards.wanted(me, survivors, SHARDS) for me in survivors}
    for me in survivors:
        assert before[me] <= after[me], f"{me} lost a shard when op-b left"
    assert set().union(*after.values()) == set(range(SHARDS))
    # And the one that joins again takes back exactly what it had.
    assert shards.wanted("op-b", replicas, SHARDS) == before["op-b"]


def test_a_replica_alone_holds_every_shard_and_none_without_replicas() -> None:
    assert shards.wanted("op-a", [], SHARDS) == frozenset(range(SHARDS))
    assert shards.assign(3, []) is None


def test_a_lease_is_free_once_unchanged_for_its_duration_on_our_clock_or_released() -> None:
    seen = shards.Seen(version="41", holder="op-b", since=100.0)
    assert not shards.expired(seen, 10.0, 109.9)
    assert shards.expired(seen, 10.0, 110.0)
    assert shards.expired(shards.Seen(version="42", holder="", since=100.0), 10.0, 100.0)
