"""Model quotas shared by a fleet: the windows in a real redis-server, taken from by many processes at once.

Each RedisWindows below is its own connection, as each runner pod's is: what one takes, the others see.
"""

from __future__ import annotations

import json
import os
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from durablerun import api, errors, quotas
from durablerun._private.agents import redis_windows
from durablerun._private.agents.quota import Limiter, Quota
from durablerun._private.agents.redis_windows import RedisWindows
from durablerun_operator.quotas import Windows as OperatorWindows
from durablerun_testbed import procs
from durablerun_testbed.redis import RedisServer
from tests.agents.helpers import WORKFLOWS, launch
from tests.helpers.kubectl_plugin import Plugin
from tests.helpers.runs import WORKFLOWS as RUN_WORKFLOWS
from tests.helpers.runs import Operator, RunEnv, StartOperator


def windows(server: RedisServer, **kwargs: Any) -> RedisWindows:
    return RedisWindows(server.url, password=server.password, **kwargs)


def quota(**limits: int) -> Quota:
    return Quota("q-" + uuid.uuid4().hex[:8], "gpt-4o*", **limits)  # a fresh window for each test


def test_what_one_runner_takes_the_others_see(redis_server: RedisServer) -> None:
    q = quota(tokens_per_minute=60_000, requests_per_minute=600)
    a, b = Limiter([q], windows=windows(redis_server)), Limiter([q], windows=windows(redis_server))
    first = a.try_take("gpt-4o", 40_000)
    assert not isinstance(first, float)
    wait = b.try_take("gpt-4o", 40_000)  # 20,000 left: 20,000 short, refilled at 1,000 a second
    assert isinstance(wait, float)
    assert 19 < wait <= 20
    first.settle(10_000)  # it used 10,000 of the 40,000 it reserved: 30,000 come back
    assert not isinstance(b.try_take("gpt-4o", 40_000), float)


def test_concurrent_calls_are_counted_across_runners_and_a_killed_runners_slot_expires(
        redis_server: RedisServer) -> None:
    q = quota(concurrent=1)
    # A runner SIGKILLed mid-call never settles: to Redis that is a grant that is never settled.
    killed = Limiter([q], windows=windows(redis_server, slot_seconds=3))
    other = Limiter([q], windows=windows(redis_server))
    assert not isinstance(killed.try_take("gpt-4o", 10), float)
    assert other.try_take("gpt-4o", 10) == pytest.approx(0.05)  # the only slot is taken
    granted = procs.wait_for(lambda: not isinstance(g := other.try_take("gpt-4o", 10), float) and g,
                             timeout=10, what="the killed runner's slot to expire")
    granted.settle(10)
    assert not isinstance(other.try_take("gpt-4o", 10), float)


def test_a_providers_cooldown_holds_every_runner(redis_server: RedisServer) -> None:
    q = quota(requests_per_minute=1000)
    refused, other = Limiter([q], windows=windows(redis_server)), Limiter([q], windows=windows(redis_server))
    refused.refused("gpt-4o-mini", 30)
    wait = other.try_take("gpt-4o", 1)
    assert isinstance(wait, float)
    assert 29 < wait <= 30


def test_the_operator_reads_how_long_grants_waited_and_how_many_calls_providers_refused(
        redis_server: RedisServer) -> None:
    # The runners count both in the shared windows; what the operator reads is what its metrics render.
    q = quota(tokens_per_minute=600)  # 10 tokens a second
    early, late = Limiter([q], windows=windows(redis_server)), Limiter([q], windows=windows(redis_server))
    early.take("gpt-4o", 590).settle(590)  # room at once
    asked = time.monotonic()
    late.take("gpt-4o", 40).settle(40)  # 10 left: 30 short, 3 s
    waited = time.monotonic() - asked
    read = OperatorWindows(redis_server.url, redis_server.password).read
    spec = quotas.ModelQuotaSpec(models=q.models, tokensPerMinute=600)
    early.refused("gpt-4o", None)  # a 429 without Retry-After: counted, no cooldown
    assert read(q.name, spec).cooldown_seconds == 0
    late.refused("gpt-4o-mini", 20)
    reading = read(q.name, spec)
    assert 19 < reading.cooldown_seconds <= 20
    assert reading.rejected == 2
    assert reading.waits == (1, 0, 1, 0, 0, 0, 0, 0), "one grant at once, one in (1 s, 10 s]"
    assert 2.5 < reading.wait_seconds <= waited  # Redis's clock, inside the test's own measurement


def test_while_redis_is_down_calls_wait_or_proceed_as_set_and_its_windows_survive_a_restart(
        redis_server: RedisServer) -> None:
    q = quota(tokens_per_minute=60_000)
    waits, proceeds = Limiter([q], windows=windows(redis_server)), \
        Limiter([q], windows=windows(redis_server, unavailable=redis_windows.PROCEED))
    assert not isinstance(waits.try_take("gpt-4o", 50_000), float)
    redis_server.stop()
    try:
        assert waits.try_take("gpt-4o", 1) == redis_windows.UNAVAILABLE_RETRY_SECONDS
        unlimited = proceeds.try_take("gpt-4o", 1_000_000)
        assert not isinstance(unlimited, float)
        unlimited.settle(1_000_000)  # nothing was taken, nothing to give back, and no error
    finally:
        redis_server.start()
    # The append-only file kept the window: 10,000 left, so 20,000 waits about 10 s.
    wait = procs.wait_for(lambda: waits.try_take("gpt-4o", 20_000), timeout=10, what="Redis back")
    assert isinstance(wait, float)
    assert 9 < wait <= 10.5


def test_bad_settings_name_the_variable(redis_server: RedisServer) -> None:
    with pytest.raises(Exception, match=api.Env.LLM_QUOTA_UNAVAILABLE):
        windows(redis_server, unavailable="maybe")
    with pytest.raises(Exception, match=api.Env.LLM_QUOTA_REDIS):
        RedisWindows("127.0.0.1:6379")
    # A wrong password is a setting to fix, not an outage to wait out: the call fails at once, naming it.
    wrong = Limiter([quota(concurrent=1)], windows=RedisWindows(redis_server.url, password="wrong"))
    with pytest.raises(redis_windows.RedisRefusedError, match=api.Env.LLM_QUOTA_REDIS_PASSWORD):
        wrong.try_take("gpt-4o", 1)


@pytest.mark.parametrize(("shared", "limit"), [(False, 57_000), (True, 57_000), (True, 80_000)],
                         ids=["each runner its own window", "one window in Redis",
                              "one window in Redis above the provider's limit"])
def test_five_runners_under_one_shared_quota_are_never_refused_by_the_provider(
        llm_server: Any, redis_server: RedisServer, tmp_path: Path, shared: bool, limit: int) -> None:
    """Five `durablerun run` processes each make one 14,000-token call to a provider allowing 60,000 tokens a
    minute, under a quota of 57,000. Each with a window of its own, each sees room, and the provider refuses
    the fifth (429). Sharing one window in Redis, the fifth waits for room and the provider refuses none. A
    shared quota set above the provider's limit lets the fifth be refused, and the window counts the refusal
    for the operator to read."""
    server = llm_server([{"text": "ok", "input_tokens": 13_900, "output_tokens": 100}], repeat_last=True,
                        tokens_per_minute=60_000)
    name = "gpt-4o-" + uuid.uuid4().hex[:6]
    env = {api.Env.LLM_QUOTAS: json.dumps({"quotas": [{"name": name, "models": "gpt-4o*", "tokensPerMinute": limit}]})}
    if shared:
        env |= {api.Env.LLM_QUOTA_REDIS: redis_server.url, api.Env.LLM_QUOTA_REDIS_PASSWORD: redis_server.password}
    started = time.monotonic()
    runners = [launch(["run", "quota_call:ask", "--run-id", f"r{i}", "--store", f"file://{tmp_path / 's'}",
                       "--max-retries", "0", "--quiet",
                       "--input", json.dumps({"base_url": server.openai_base_url, "chars": 13_500 * 4})],
                      env, tmp_path) for i in range(5)]
    results = [(runner.wait(timeout=120), runner.communicate()) for runner in runners]
    refused = [r for r in server.requests if r.get("status") == 429]
    if shared and limit < 60_000:
        assert [code for code, _ in results] == [0] * 5, [err for _, (_, err) in results]
        assert refused == []
        assert len(server.requests) == 5
        assert time.monotonic() - started > 5  # the fifth waited for room
    else:
        assert sorted(code for code, _ in results) == [0, 0, 0, 0, 1], [err for _, (_, err) in results]
        assert len(refused) == 1
    if shared:
        reading = OperatorWindows(redis_server.url, redis_server.password).read(
            name, quotas.ModelQuotaSpec(models="gpt-4o*", tokensPerMinute=limit))
        assert reading.rejected == len(refused), "the provider's own log and the window disagree"
        assert sum(reading.waits) == 5  # a grant each: the refused call was refused after its grant


def quota_operator(start_operator: StartOperator, redis_server: RedisServer) -> Operator:
    """An operator with ModelQuotas on, the runners' windows in ``redis_server``."""
    return start_operator(**{api.OperatorEnv.MODEL_QUOTAS: "true", api.Env.LLM_QUOTA_REDIS: redis_server.url,
                             api.Env.LLM_QUOTA_REDIS_PASSWORD: redis_server.password})


@pytest.fixture
def model_quota(runs: RunEnv) -> Iterator[Callable[..., None]]:
    """``model_quota(name, **spec)``: a ModelQuota covering the test's namespace, deleted after the test (it is
    cluster-scoped: the namespace's deletion does not take it)."""
    made: list[str] = []

    def make(name: str, **spec: Any) -> None:
        runs.testbed.kubectl("apply", "-f", "-", input=json.dumps({
            "apiVersion": api.API_VERSION, "kind": api.QUOTA_KIND, "metadata": {"name": name},
            "spec": {"namespaces": [runs.namespace], **spec}}))
        made.append(name)

    yield make
    for name in made:
        runs.testbed.kubectl("delete", api.QUOTA_PLURAL, name, "--wait=false")


def get_quota(runs: RunEnv, name: str) -> dict[str, Any]:
    return dict(json.loads(runs.testbed.kubectl("get", api.QUOTA_PLURAL, name, "-o", "json").stdout))


@pytest.mark.testbed
def test_a_throttled_run_waits_with_no_pod_and_its_next_pod_starts_when_the_room_is_due(
        start_operator: StartOperator, runs: RunEnv, llm_server: Any, redis_server: RedisServer,
        model_quota: Callable[..., None], tmp_path: Path) -> None:
    """A ModelQuota of 1,500 tokens a minute covering the run's namespace; the run's second call would wait
    about 20 s for room, its steps wait out 2 s. The run waits with no pod, saying for which quota and until
    when; the quota's status shows the window used and the run waiting; the run's next pod makes the call then.
    No quota is in the run's manifest: the operator hands it to the pod, and the password comes from the
    namespace's Secret."""
    quota_operator(start_operator, redis_server)
    home = tmp_path / "home"
    home.mkdir()
    server = llm_server([{"text": "ok", "input_tokens": 900, "output_tokens": 100}], repeat_last=True)
    name = "tiny-" + uuid.uuid4().hex[:6]
    model_quota(name, models="gpt-4o*", tokensPerMinute=1500)  # 25 tokens a second
    runs.testbed.kubectl("create", "secret", "generic", api.QUOTA_REDIS_SECRET, "-n", runs.namespace,
                         f"--from-literal={api.QUOTA_REDIS_SECRET_KEY}={redis_server.password}")
    manifest = runs.manifest("throttled", "quota_call:ask_twice",
                             {"base_url": server.openai_base_url, "chars": 3560})  # ~1,000 tokens a call
    runner = manifest["spec"]["template"]["spec"]["containers"][0]
    runner["env"] = [e for e in runner["env"] if e["name"] != "PYTHONPATH"] + [
        {"name": "PYTHONPATH", "value": os.pathsep.join([str(WORKFLOWS), str(RUN_WORKFLOWS)])},
        {"name": api.Env.INLINE_SLEEP_MAX_SECONDS, "value": "2"}]
    runs.apply(manifest)

    status = runs.wait_phase("throttled", "Waiting", timeout=90)["status"]
    waiting = status["waitingFor"]
    assert waiting["quota"] == name, waiting
    assert f"waiting for room in model quota {name!r}" in status["message"], status["message"]
    due = api.parse_time(waiting["wakeTime"]).timestamp()
    assert len(server.requests) == 1  # the second call was never sent
    procs.wait_for(lambda: not [p for p in runs.pods("throttled") if p["status"].get("phase") in
                                ("Pending", "Running") and not p["metadata"].get("deletionTimestamp")],
                   timeout=30, what="no pod while the run waits for room")
    # What `kubectl get modelquotas` shows: the first call's 1,000 tokens in the window (less what refilled since),
    # and the run waiting.
    seen = procs.wait_for(lambda: (s := get_quota(runs, name).get("status", {})).get("runsWaiting") == 1 and s,
                          timeout=30, what="the quota's status to count the waiting run")
    assert 0 < seen["tokensUsed"] <= 1000, seen
    assert seen["tokens"] == f"{seen['tokensUsed']}/1500", seen
    said = Plugin(runs.testbed, runs.namespace, home).dr("status", "throttled").stdout  # as its owner asks
    assert f"waiting for room in model quota {name!r} until {waiting['wakeTime']}" in said, said
    table = runs.testbed.kubectl("get", api.QUOTA_PLURAL, name).stdout
    assert "gpt-4o*" in table, table
    assert "/1500" in table, table
    assert time.time() < due, "the wait was over before the pod was gone: the test proves nothing"

    done = runs.wait_phase("throttled", "Succeeded", "Failed", "Aborted", timeout=120)["status"]
    assert done["phase"] == "Succeeded", done.get("message")
    assert [r["turn"] for r in server.requests] == [0, 0]
    assert server.requests[1]["at"] >= due  # asked again only once the room was due
    assert done.get("restarts", 0) == 0  # a wait, not a crash
    reasons = [e["reason"] for e in runs.events("throttled")]
    assert "Waiting" in reasons, reasons
    procs.wait_for(lambda: get_quota(runs, name).get("status", {}).get("runsWaiting") == 0, timeout=30,
                   what="the quota's status to count no run waiting")


def test_tenants_that_contend_share_the_window_by_their_weights_and_one_alone_takes_it_all(
        redis_server: RedisServer) -> None:
    """Two namespaces, weights 1 and 2, each with four runners asking without pause for 25-token calls from a
    window of 6,000 tokens a minute (100 a second), emptied first: over 15 s, after 3 s in which the lines form
    (the first places of each namespace are taken before it knows of the other), the heavier namespace gets
    twice the tokens (within 10%), and together they get what the window gives. Then the same runs of one namespace
    alone get the whole rate, once the places the other namespace's runs left in line (they stopped mid-wait,
    as runs that died would) no longer hold it up: GRACE_SECONDS after their turn."""
    import threading

    name = "q-" + uuid.uuid4().hex[:8]
    granted: dict[str, int] = {"light": 0, "heavy": 0}
    lock = threading.Lock()

    def drain() -> None:
        assert not isinstance(Limiter([Quota(name, "gpt-4o*", tokens_per_minute=6000)], windows=windows(
            redis_server, tenant="drain")).try_take("gpt-4o", 6000), float)

    def runner(tenant: str, weight: int, counted: float, until: float, i: int) -> None:
        limiter = Limiter([Quota(name, "gpt-4o*", tokens_per_minute=6000, weight=weight)],
                          windows=windows(redis_server, tenant=tenant, holder=f"{tenant}/run-{i}"))
        while time.monotonic() < until:
            taken = limiter.try_take("gpt-4o", 25)
            if isinstance(taken, float):
                time.sleep(min(taken, 0.05))
                continue
            taken.settle(25)
            if time.monotonic() >= counted:
                with lock:
                    granted[tenant] += 25

    def run(tenants: dict[str, int], seconds: float, warm_up: float = 0) -> float:
        started = time.monotonic()
        counted, until = started + warm_up, started + warm_up + seconds
        threads = [threading.Thread(target=runner, args=(tenant, weight, counted, until, i))
                   for tenant, weight in tenants.items() for i in range(4)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        return time.monotonic() - counted

    drain()
    elapsed = run({"light": 1, "heavy": 2}, 15, warm_up=3)
    total = granted["light"] + granted["heavy"]
    assert total <= 100 * elapsed + 25, granted  # the window held: nothing past its rate
    assert total >= 0.9 * 100 * elapsed, granted  # and fairness left little unused
    assert granted["heavy"] / granted["light"] == pytest.approx(2, rel=0.1), granted
    granted.update(light=0, heavy=0)
    elapsed = run({"light": 1}, redis_windows.GRACE_SECONDS + 10)
    assert granted["light"] >= 0.8 * 100 * (elapsed - redis_windows.GRACE_SECONDS), granted


def test_an_urgent_runs_call_goes_before_the_line_and_holds_the_lower_ones_until_it_is_granted(
        redis_server: RedisServer) -> None:
    """Three runs of priority 0 take places in line for an emptied window of 10 tokens a second; an urgent run
    (priority 10) asks after them. Its call is granted first, when the window has room for it, and none of the
    others goes before it, though their turns came earlier; then they go in their order. Without priorities
    it would be fourth."""
    name = "q-" + uuid.uuid4().hex[:8]

    def limiter(holder: str, priority: int = 0) -> Limiter:
        return Limiter([Quota(name, "gpt-4o*", tokens_per_minute=600)],
                       windows=windows(redis_server, holder=holder, priority=priority))

    assert not isinstance(limiter("drain").try_take("gpt-4o", 600), float)  # the window is empty
    asking = {holder: limiter(holder) for holder in ("low-1", "low-2", "low-3")}
    for low in asking.values():
        assert isinstance(low.try_take("gpt-4o", 20), float)  # places at about 2, 4 and 6 s
    asking["urgent"] = limiter("urgent", priority=10)
    order: list[str] = []
    deadline = time.monotonic() + 30
    while asking and time.monotonic() < deadline:
        for holder, each in list(asking.items()):
            if not isinstance(grant := each.try_take("gpt-4o", 20), float):
                grant.settle(20)
                order.append(holder)
                del asking[holder]
        time.sleep(0.05)
    assert order == ["urgent", "low-1", "low-2", "low-3"]


def test_a_bad_priority_names_its_variable(monkeypatch: pytest.MonkeyPatch, redis_server: RedisServer) -> None:
    monkeypatch.setenv(api.Env.LLM_QUOTA_REDIS, redis_server.url)
    monkeypatch.setenv(api.Env.LLM_QUOTA_PRIORITY, "urgent")
    with pytest.raises(errors.ConfigError, match=f"{api.Env.LLM_QUOTA_PRIORITY}: 'urgent' is not a whole number"):
        redis_windows.from_environment()


def test_calls_that_find_no_room_wait_in_line_and_a_run_that_yielded_finds_its_place_again(
        redis_server: RedisServer) -> None:
    """A window of 1,000 tokens a second, emptied. Three runs ask for 5,000 tokens each: each is told its own turn,
    5 s apart, in the order they asked (not all "5 s": no herd when the room comes). A run asking later goes
    behind them, though it asks when the first one's room is there; the first run, asking again at its turn as
    a run's next pod does after yielding (its place is kept under its run's name), gets it."""
    name = "q-" + uuid.uuid4().hex[:8]

    def run(holder: str) -> Limiter:
        return Limiter([Quota(name, "gpt-4o*", tokens_per_minute=60_000)],
                       windows=windows(redis_server, tenant="team", holder=holder))

    assert not isinstance(run("drain").try_take("gpt-4o", 60_000), float)
    asked = time.monotonic()
    waits = [run(f"team/run-{i}").try_take("gpt-4o", 5_000) for i in range(3)]
    assert all(isinstance(w, float) for w in waits), waits
    assert [round(w) for w in waits] == [5, 10, 15], waits  # type: ignore[arg-type]
    time.sleep(max(0.0, asked + waits[0] + 0.2 - time.monotonic()))  # type: ignore[operator]
    late = run("team/late").try_take("gpt-4o", 5_000)
    assert isinstance(late, float)
    assert late > 9, late  # behind the two still in line, not the first one's room
    again = run("team/run-0").try_take("gpt-4o", 5_000)  # a new process (its next pod), the same run
    assert not isinstance(again, float), again
