"""A run id's owner record, on every store: one holder at a time, taken over only when it is released or lapses.

The S3 case runs against the real MinIO (If-None-Match / If-Match); the filesystem's swap is flock-guarded.
"""

from __future__ import annotations

import json
import subprocess
import threading
import time
from pathlib import Path

import pytest

from durablerun import errors
from durablerun._private.storage import owner
from durablerun._private.storage.owner import HeldElsewhere, Holder, OwnerLease
from durablerun.stores import RunRef, Store
from tests.helpers.local_runs import StoreSpec

from .helpers import cli

REF = RunRef.local("moving-run")
UID = "3f2a9c1e-0000-4000-8000-000000000001"


@pytest.fixture
def store(store_spec: StoreSpec, monkeypatch: pytest.MonkeyPatch) -> Store:
    monkeypatch.setattr(owner, "MARGIN_SECONDS", 0.3)
    monkeypatch.setattr(owner, "POLL_SECONDS", 0.05)
    s = store_spec.open()
    s.check()
    return s


def pod(cluster: str, epoch: int = 1, uid: str = UID) -> Holder:
    return Holder(cluster=cluster, namespace="team-a", name="review", uid=uid, pod=f"review-a{epoch}", epoch=epoch)


def lease(store: Store, holder: Holder, duration: float = 1.0) -> OwnerLease:
    return OwnerLease(store.backend, REF, holder, duration)


def test_a_renewing_holder_is_named_and_never_taken_over(store: Store) -> None:
    a = lease(store, pod("cluster-a"))
    a.acquire()
    lost: list[str] = []
    a.start(on_lost=lost.append)
    try:
        b = lease(store, pod("cluster-b", uid="other-uid"))
        with pytest.raises(HeldElsewhere) as held:
            b.acquire()
        assert "cluster cluster-a" in str(held.value)
        assert "team-a/review" in str(held.value)
        assert held.value.retry_after == 1.0
        assert b.etag is None
        assert not b.valid()
        # Without giving up, it keeps waiting as long as the holder renews.
        with pytest.raises(HeldElsewhere):
            b.acquire(give_up_when_renewed=False, patience=2.5)
        assert a.valid()
        assert not lost
    finally:
        a.stop()


def test_a_lapsed_holder_is_taken_over_after_its_lease_and_then_fenced(store: Store) -> None:
    a = lease(store, pod("cluster-a"))
    a.acquire()  # and never renewed: its cluster is gone
    b = lease(store, pod("cluster-b", uid="other-uid"))
    started = time.monotonic()
    b.acquire()
    waited = time.monotonic() - started
    assert 1.0 + owner.MARGIN_SECONDS <= waited < 1.0 + owner.MARGIN_SECONDS + 1.5, waited
    assert b.valid()
    assert b.previous == a.holder
    assert not a.valid(), "a holder past its lease may not write"
    assert not a.renew()
    assert a.lost
    assert "cluster cluster-b" in a.lost
    assert b.renew(), "the new holder keeps it"


def test_a_released_record_is_taken_at_once(store: Store) -> None:
    a = lease(store, pod("cluster-a"), duration=30)
    a.acquire()
    a.release()
    assert not a.valid()
    b = lease(store, pod("cluster-b", uid="other-uid"), duration=30)
    started = time.monotonic()
    b.acquire()
    assert time.monotonic() - started < 1.0
    assert b.previous is None


def test_a_newer_attempt_of_the_same_run_takes_over_at_once_and_fences_the_older(store: Store) -> None:
    old = lease(store, pod("cluster-a", epoch=1), duration=30)
    old.acquire()
    new = lease(store, pod("cluster-a", epoch=2), duration=30)
    started = time.monotonic()
    new.acquire()
    assert time.monotonic() - started < 1.0
    assert not old.renew()
    assert old.lost
    with pytest.raises(errors.FencedError, match="newer attempt"):
        lease(store, pod("cluster-a", epoch=1), duration=30).acquire()


def test_a_local_holder_whose_process_is_gone_is_taken_over_at_once(store: Store) -> None:
    dead = subprocess.Popen(["true"])
    dead.wait()
    stale = OwnerLease(store.backend, REF, Holder(host=Holder.local().host, pid=dead.pid), 30)
    stale.acquire()
    mine = OwnerLease(store.backend, REF, Holder.local(), 30)
    started = time.monotonic()
    mine.acquire()
    assert time.monotonic() - started < 1.0
    assert mine.previous == stale.holder


def test_deleting_claims_only_a_journal_this_durablerun_held_last(store: Store) -> None:
    assert lease(store, pod("cluster-a", epoch=0)).claim_own() is None, "an absent record is claimed"
    moved = lease(store, pod("cluster-b", uid="other-uid"), duration=30)
    moved.acquire()
    moved.release()  # released, but the journal moved on to cluster B's run
    before = store.backend.get_versioned(f"{REF.path}/owner.json")
    keeper = lease(store, pod("cluster-a", epoch=0)).claim_own()
    assert keeper == moved.holder
    assert store.backend.get_versioned(f"{REF.path}/owner.json") == before, "the record was written"
    mine = lease(store, pod("cluster-b", epoch=0, uid="other-uid"))
    assert mine.claim_own() is None
    assert mine.valid()


def test_concurrent_takers_exactly_one_wins(store: Store) -> None:
    results: list[str] = []
    barrier = threading.Barrier(4)

    def take(i: int) -> None:
        mine = lease(store, pod(f"cluster-{i}", uid=f"uid-{i}"), duration=30)
        barrier.wait()
        try:
            mine.acquire(patience=1.0)
            results.append("won")
        except HeldElsewhere:
            results.append("waits")

    threads = [threading.Thread(target=take, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=30)
    assert sorted(results) == ["waits", "waits", "waits", "won"], results


# --- the local CLI goes through the same record --------------------------------------------------------


def test_durablerun_run_waits_for_a_pod_that_holds_the_run_and_takes_it_once_released(
        durable_store_spec: StoreSpec, tmp_path: Path) -> None:
    store = durable_store_spec.open()
    store.check()
    pod_lease = OwnerLease(store.backend, REF, pod("prod-eu"), 3.0)
    pod_lease.acquire()
    pod_lease.start(on_lost=lambda why: None)
    marker = tmp_path / "marker"
    argv = ["run", "racing:slow_steps", "--run-id", REF.name, "--store", durable_store_spec.uri,
            *durable_store_spec.cli_args, "--input", json.dumps({"marker": str(marker), "steps": 3}), "--quiet"]
    try:
        refused = cli(argv, env=durable_store_spec.env)
        assert refused.returncode == 4, refused.stderr
        assert "held by DurableRun team-a/review" in refused.stderr
        assert "cluster prod-eu" in refused.stderr
        assert not marker.exists(), "a step ran while the pod held the run"
        assert store.backend.list_keys(f"{REF.path}/") == [f"{REF.path}/owner.json"], "something was written"
        # Read-only by default: inspect names the holder and changes nothing.
        shown = cli(["inspect", "--run-id", REF.name, "--store", durable_store_spec.uri,
                     *durable_store_spec.cli_args, "--json"], env=durable_store_spec.env)
        assert shown.returncode == 1  # no run there yet: the pod has written nothing either
    finally:
        pod_lease.release()
    done = cli(argv, env=durable_store_spec.env)
    assert done.returncode == 0, done.stderr
    record = owner.read_owner(store.backend, REF)
    assert record is not None
    assert record["released"] is True
    assert record["holder"]["host"] == Holder.local().host
    shown = cli(["inspect", "--run-id", REF.name, "--store", durable_store_spec.uri,
                 *durable_store_spec.cli_args], env=durable_store_spec.env)
    assert "owner     released by `durablerun run` on host" in shown.stdout, shown.stdout
