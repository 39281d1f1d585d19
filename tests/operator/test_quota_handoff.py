"""What the operator hands a runner pod of the ModelQuotas, and what it writes back into their status (pure: the
bed test, tests/agents/test_shared_quota.py, runs it all on the test bed with a real Redis)."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from typing import Any

from durablerun import api, quotas
from durablerun_operator import builders
from durablerun_operator import quotas as operator_quotas
from durablerun_operator.config import Settings
from tests.operator.run_bodies import body

ON = Settings(model_quotas=True, quota_redis="redis://redis.durable-run:6379/0", quota_redis_password="s3cret")


def index(**specs: dict[str, Any]) -> operator_quotas.Index:
    made = operator_quotas.Index()
    for name, spec in specs.items():
        made.changed(name, {"spec": spec})
    return made


def env_of(entries: list[dict[str, Any]]) -> dict[str, Any]:
    return {e["name"]: e.get("value", e.get("valueFrom")) for e in entries}


def test_a_pod_gets_the_quotas_covering_its_namespace_with_its_weight_and_the_password_from_its_secret() -> None:
    quotas_ = index(**{"gpt-4o": {"models": "gpt-4o*", "tokensPerMinute": 60000, "weights": {"team-b": 2}},
                       "claude": {"models": "claude-*", "concurrent": 4, "namespaces": ["team-a"]}})
    env = env_of(operator_quotas.runner_env(quotas_, "team-b", ON, named=set()))
    assert json.loads(env[api.Env.LLM_QUOTAS]) == {"quotas": [
        {"name": "gpt-4o", "models": "gpt-4o*", "tokensPerMinute": 60000, "weight": 2}]}  # not claude's: team-a only
    assert env[api.Env.LLM_QUOTA_REDIS] == ON.quota_redis
    assert env[api.Env.LLM_QUOTA_REDIS_PASSWORD] == {"secretKeyRef": {
        "name": api.QUOTA_REDIS_SECRET, "key": api.QUOTA_REDIS_SECRET_KEY, "optional": True}}
    assert "s3cret" not in json.dumps(env)  # the operator's own password never reaches a pod
    assert "s3cret" not in repr(ON)


def test_no_quota_no_setting_and_a_templates_own_quotas_win() -> None:
    quotas_ = index(**{"gpt-4o": {"models": "gpt-4o*", "tokensPerMinute": 60000, "namespaces": ["team-a"]}})
    assert operator_quotas.runner_env(quotas_, "team-z", ON, named=set()) == []  # not covered
    assert operator_quotas.runner_env(quotas_, "team-a", Settings(), named=set()) == []  # quotas off
    own = env_of(operator_quotas.runner_env(quotas_, "team-a", ON, named={api.Env.LLM_QUOTAS}))
    assert api.Env.LLM_QUOTAS not in own  # the run brought its own
    quotas_.changed("gpt-4o", None)
    assert operator_quotas.runner_env(quotas_, "team-a", ON, named=set()) == []  # deleted


def test_the_status_says_used_of_limit_and_a_failed_reading_clears_the_numbers() -> None:
    spec = quotas.ModelQuotaSpec(models="gpt-4o*", tokensPerMinute=60000, requestsPerMinute=500)
    now = datetime(2026, 11, 29, 12, 0, tzinfo=UTC)
    read = operator_quotas.status(spec, operator_quotas.Reading(41200.4, 12.0, 3, 40.0), 7, now)
    assert (read["tokens"], read["requests"], read["inFlight"], read["runsWaiting"]) == ("41200/60000", "12/500", 3, 7)
    assert read["coolingDownUntil"] == "2026-11-29T12:00:40Z"
    failed = operator_quotas.status(spec, None, 7, now, "the shared windows at redis cannot be read: ConnectionError")
    assert failed["tokens"] is None  # null in the merge patch: the stale numbers go
    assert failed["tokensUsed"] is None
    assert "cannot be read" in failed["message"]


def test_a_namespaced_operator_writes_the_status_only_of_quotas_it_serves_whole() -> None:
    quotas_ = index(mine={"models": "a*", "concurrent": 1, "namespaces": ["team-a"]},
                    everyone={"models": "b*", "concurrent": 1})
    namespaced = Settings(namespaces=("team-a",))
    assert operator_quotas.writes_status("mine", namespaced, None, quotas_)
    assert not operator_quotas.writes_status("everyone", namespaced, None, quotas_)
    assert operator_quotas.writes_status("everyone", Settings(), None, quotas_)


class FakeWindows:
    """The Redis read, as a test says: a reading, or an outage."""

    errors = (ConnectionError,)

    def __init__(self) -> None:
        self.reading: operator_quotas.Reading | None = operator_quotas.Reading(1000.0, 2.0, 1, 0.0)

    def read(self, name: str, spec: quotas.ModelQuotaSpec) -> operator_quotas.Reading:
        if self.reading is None:
            raise ConnectionError("refused")
        return self.reading


class FakeKube:
    def __init__(self) -> None:
        self.patches: list[tuple[str, dict[str, Any]]] = []
        self.events: list[tuple[str, str, str]] = []

    def patch_quota_status(self, name: str, status: dict[str, Any]) -> None:
        self.patches.append((name, status))

    def post_quota_event(self, name: str, uid: str, kind: str, reason: str, message: str) -> None:
        self.events.append((name, kind, reason))


def test_the_status_is_written_when_it_changes_and_an_outage_is_one_event_each_way() -> None:
    import asyncio

    from prometheus_client import CollectorRegistry

    from durablerun_operator import metrics

    quotas_ = index(**{"gpt-4o": {"models": "gpt-4o*", "tokensPerMinute": 60000}})
    kube, windows = FakeKube(), FakeWindows()
    writer = operator_quotas.StatusWriter(quotas_, kube, ON, metrics.RunMetrics(CollectorRegistry()),
                                          lambda name: True, windows)  # type: ignore[arg-type]
    now = datetime(2026, 11, 29, 12, 0, tzinfo=UTC)

    def tick(seconds: float) -> None:
        asyncio.run(writer.write_all(now, seconds))

    tick(0)
    tick(10)  # nothing changed: no write
    assert [status["tokens"] for _, status in kube.patches] == ["1000/60000"]
    windows.reading = None
    tick(20)
    tick(30)
    assert kube.events == [("gpt-4o", "Warning", "QuotaWindowsUnreachable")]
    assert kube.patches[-1][1]["tokens"] is None
    assert "cannot be read" in kube.patches[-1][1]["message"]
    windows.reading = operator_quotas.Reading(500.0, 1.0, 0, 0.0)
    tick(40)
    assert kube.events[-1] == ("gpt-4o", "Normal", "QuotaWindowsReachable")
    assert kube.patches[-1][1]["tokens"] == "500/60000"
    assert kube.patches[-1][1]["message"] is None
    tick(40 + operator_quotas.STATUS_REFRESH_SECONDS)  # unchanged, but written again to say it is fresh
    assert len(kube.patches) == 4


def test_with_shards_the_status_leaves_runs_waiting_to_the_summed_metric() -> None:
    import asyncio

    from prometheus_client import CollectorRegistry

    from durablerun import resource
    from durablerun_operator import metrics

    quotas_ = index(**{"gpt-4o": {"models": "gpt-4o*", "tokensPerMinute": 60000}})
    registry = CollectorRegistry()
    run_metrics = metrics.RunMetrics(registry)
    waiting = resource.DurableRunStatus(phase=api.Phase.WAITING, waitingFor=resource.WaitingFor(
        quota="gpt-4o", wakeTime="2026-11-29T12:01:00Z"))
    now = datetime(2026, 11, 29, 12, 0, tzinfo=UTC)
    run_metrics.observe_run("team-a", "agent", waiting, resource.Policy(), now)
    kube = FakeKube()
    sharded = Settings(model_quotas=True, quota_redis="redis://r:6379", shards=4)
    writer = operator_quotas.StatusWriter(quotas_, kube, sharded, run_metrics, lambda name: True,
                                          FakeWindows())  # type: ignore[arg-type]
    asyncio.run(writer.write_all(now, 0))
    assert kube.patches[-1][1]["runsWaiting"] is None  # this replica sees only its shards' runs
    assert registry.get_sample_value("durablerun_quota_runs_waiting", {"quota": "gpt-4o"}) == 1


def test_an_urgent_runs_pod_is_told_its_priority_and_a_run_without_one_is_told_nothing() -> None:
    def env_for(policy: dict[str, Any]) -> dict[str, Any]:
        spec = {"template": {"spec": {"containers": [{"name": "runner", "image": "localhost/wf:1"}]}},
                "policy": policy}
        return env_of(builders.runner_pod(body({"phase": "Pending"}, spec=spec), 1, ON)["spec"]["containers"][0]["env"])

    assert env_for({"quotaPriority": 100})[api.Env.LLM_QUOTA_PRIORITY] == "100"
    assert api.Env.LLM_QUOTA_PRIORITY not in env_for({})
