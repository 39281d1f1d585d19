"""Model quotas shared by a fleet (issue 40): many agent runs of three namespaces calling one model, without a
quota and under one, side by side.

The model server is the test bed's (``llmserver``), limited like a provider to ``PROVIDER_TPM`` tokens a minute:
past it, it answers 429 with ``Retry-After``, and its own request log is the evidence of what was delivered
and refused. Each stand-in run is a thread that calls without pause until the phase ends, 1,000 tokens a call
(900 in, 100 out), so every namespace always wants more than its share:

- **without quotas**, a call that gets a 429 sleeps the ``Retry-After`` and is sent again, as a provider client
  retries; the run's pod stays alive through the sleep;
- **with a quota** of ``QUOTA_TPM`` (2.5% under the provider's, as docs/agents.md advises) in a real
  redis-server, each run takes its share through the runner's own limiter (``Limiter`` over ``RedisWindows``,
  one connection per run, its namespace's weight 1, 1 or 2) before it calls, and settles the usage after. A
  wait longer than a step waits in its pod (``INLINE_SECONDS``, the runner's default) would end the attempt
  and leave no pod: counted as such.

Delivered tokens a minute and each namespace's share are taken over the steady state (after the first
minute, whose full window is a burst by design). The limiter's added latency is measured by a probe in a
process of its own (this one's 200 threads would make it a measure of the GIL), asking a window of its own
in the same loaded Redis. The generator reports its own lag: how late a 10 ms sleep wakes in this process.
``python -m durablerun_bench.quotas`` runs this section alone and prints its RESULTS.md section.
"""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
import uuid
from pathlib import Path
from typing import Any

from durablerun._private.agents.quota import Limiter, Quota, next_ask
from durablerun._private.agents.redis_windows import RedisWindows
from durablerun_bench.util import percentile, quick
from durablerun_testbed.llmserver import LLMServer, Turn
from durablerun_testbed.redis import RedisServer

PROVIDER_TPM = 60_000
QUOTA_TPM = 58_500
CALL_TOKENS = 1_000
#: A wait longer than this ends the attempt: the runner's DURABLERUN_INLINE_SLEEP_MAX_SECONDS default.
INLINE_SECONDS = 60.0
WEIGHTS = {"team-a": 1, "team-b": 1, "research": 2}
NONE = "\u2013"  # an empty cell


def _call(url: str) -> tuple[int, float]:
    """One chat completion: its status, and the Retry-After of a 429 (status 0: the connection failed, as a
    loaded server's full accept queue resets it; the client tries again after a second)."""
    body = json.dumps({"model": "gpt-4o", "messages": [{"role": "user", "content": "x" * 3600}],
                       "max_tokens": 100}).encode()
    request = urllib.request.Request(url + "/chat/completions", data=body,
                                     headers={"content-type": "application/json", "authorization": "Bearer x"})
    try:
        with urllib.request.urlopen(request, timeout=60) as answer:
            answer.read()
            return answer.status, 0.0
    except urllib.error.HTTPError as refused:
        return refused.code, float(refused.headers.get("retry-after") or 1)
    except OSError:
        return 0, 1.0


class _Phase:
    """One phase's runs and what they saw."""

    def __init__(self, runs: int, seconds: float) -> None:
        self.runs, self.seconds = runs, seconds
        self.lock = threading.Lock()
        self.delivered: list[tuple[float, str]] = []  # (when, namespace) of every call answered 200
        self.resent = 0
        self.connection_errors = 0  # calls whose connection failed (the generator's, not the system's, trouble)
        self.throttled_seconds = 0.0  # run-seconds spent sleeping in a pod on the provider's Retry-After
        self.grant_waits: list[float] = []  # seconds from asking to the grant, per call
        self.redis_calls = 0
        self.yielded = 0  # calls whose first wait was past INLINE_SECONDS: the attempt would end, no pod
        self.pod_waits_past_inline = 0  # calls that waited in their pod longer than INLINE_SECONDS all the same

    def tenants(self) -> list[str]:
        return [list(WEIGHTS)[i % len(WEIGHTS)] for i in range(self.runs)]


def _without_quota(url: str, phase: _Phase, until: float, tenant: str) -> None:
    while time.monotonic() < until:
        status, retry_after = _call(url)
        if status == 200:
            with phase.lock:
                phase.delivered.append((time.monotonic(), tenant))
            continue
        with phase.lock:
            phase.resent += 1
            if status == 0:
                phase.connection_errors += 1
            else:
                phase.throttled_seconds += retry_after
        time.sleep(retry_after)


def _with_quota(url: str, phase: _Phase, until: float, tenant: str, windows: RedisWindows, name: str) -> None:
    limiter = Limiter([Quota(name, "gpt-4o*", tokens_per_minute=QUOTA_TPM, weight=WEIGHTS[tenant])],
                      windows=windows)
    while time.monotonic() < until:
        asked, first, asks = time.monotonic(), None, 0
        while True:
            asks += 1
            granted = limiter.try_take("gpt-4o", CALL_TOKENS)
            if not isinstance(granted, float):
                break
            first = granted if first is None else first
            # As the runner: in its pod it asks again as quota.next_ask says; a first wait past INLINE_SECONDS
            # ends the attempt, and the next pod asks at the due time.
            pause = next_ask(granted) if first <= INLINE_SECONDS else granted
            if time.monotonic() + pause > until:
                return  # still waiting when the phase ends
            time.sleep(pause)
        waited = time.monotonic() - asked
        status, _ = _call(url)
        granted.settle(CALL_TOKENS)
        with phase.lock:
            phase.redis_calls += asks + 1
            phase.grant_waits.append(waited)
            if first is not None and first > INLINE_SECONDS:
                phase.yielded += 1
            elif waited > INLINE_SECONDS:
                phase.pod_waits_past_inline += 1
            if status == 200:
                phase.delivered.append((time.monotonic(), tenant))
            else:
                phase.resent += 1
                phase.connection_errors += status == 0


def _lag_monitor(stop: threading.Event, lags: list[float]) -> None:
    while not stop.is_set():
        before = time.monotonic()
        time.sleep(0.01)
        lags.append(time.monotonic() - before - 0.01)


def _run_phase(url: str, runs: int, seconds: float, redis: RedisServer | None) -> dict[str, Any]:
    phase = _Phase(runs, seconds)
    name = "bench-" + uuid.uuid4().hex[:6]
    started = time.monotonic()
    until = started + seconds
    threads = []
    for tenant in phase.tenants():
        if redis is None:
            target, args = _without_quota, (url, phase, until, tenant)
        else:
            windows = RedisWindows(redis.url, password=redis.password, tenant=tenant)
            target, args = _with_quota, (url, phase, until, tenant, windows, name)  # type: ignore[assignment]
        threads.append(threading.Thread(target=target, args=args, daemon=True))
    stop, lags = threading.Event(), []  # type: ignore[var-annotated]
    monitor = threading.Thread(target=_lag_monitor, args=(stop, lags), daemon=True)
    monitor.start()
    probe = _start_probe(redis) if redis is not None else None
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=seconds + 120)
    stop.set()
    probe_ms = _probe_result(probe) if probe is not None else []
    steady_from = started + 60
    steady = [(at, t) for at, t in phase.delivered if steady_from <= at <= until]
    minutes = (until - steady_from) / 60
    by_tenant = {t: sum(1 for _, who in steady if who == t) for t in WEIGHTS}
    total = sum(by_tenant.values()) or 1
    weight_sum = sum(WEIGHTS.values())
    return {
        "runs": runs, "seconds": seconds,
        "delivered_tokens_per_min": len(steady) * CALL_TOKENS / minutes if minutes > 0 else None,
        "refused_429": phase.resent - phase.connection_errors,
        "connection_errors": phase.connection_errors,
        "throttled_pod_seconds": phase.throttled_seconds,
        "shares": {t: n / total for t, n in by_tenant.items()},
        "share_error": max(abs(n / total - WEIGHTS[t] / weight_sum) / (WEIGHTS[t] / weight_sum)
                           for t, n in by_tenant.items()),
        "grant_wait_p50_s": percentile(phase.grant_waits, 50) if phase.grant_waits else None,
        "grant_wait_p99_s": percentile(phase.grant_waits, 99) if phase.grant_waits else None,
        "redis_calls_per_call": phase.redis_calls / len(phase.delivered) if phase.delivered and redis else None,
        "yielded": phase.yielded, "pod_waits_past_inline": phase.pod_waits_past_inline,
        "limiter_p50_ms": percentile(probe_ms, 50) if probe_ms else None,
        "limiter_p99_ms": percentile(probe_ms, 99) if probe_ms else None,
        "generator_lag_p99_ms": percentile(lags, 99) * 1000 if lags else None,
    }


# --- the latency probe: a process of its own ---------------------------------------------------------------

def _start_probe(redis: RedisServer) -> subprocess.Popen[str]:
    return subprocess.Popen([sys.executable, "-m", "durablerun_bench.quotas", "--probe", redis.url, redis.password],
                            stdout=subprocess.PIPE, stdin=subprocess.PIPE, text=True)


def _probe_result(probe: subprocess.Popen[str]) -> list[float]:
    out, _ = probe.communicate("stop\n", timeout=60)
    return [float(x) for x in json.loads(out or "[]")]


def probe(url: str, password: str) -> None:
    """Until stdin says stop: one take and settle of a window of its own every 50 ms, timed (milliseconds)."""
    windows = RedisWindows(url, password=password, tenant="probe")
    limiter = Limiter([Quota("probe-" + uuid.uuid4().hex[:6], "gpt-4o*", tokens_per_minute=10**9)], windows=windows)
    stop = threading.Event()

    def stop_when_told() -> None:
        sys.stdin.readline()
        stop.set()

    threading.Thread(target=stop_when_told, daemon=True).start()
    times: list[float] = []
    while not stop.wait(0.05):
        before = time.perf_counter()
        granted = limiter.try_take("gpt-4o", CALL_TOKENS)
        times.append((time.perf_counter() - before) * 1000)
        if not isinstance(granted, float):
            granted.settle(CALL_TOKENS)
    print(json.dumps(times))


def bench(root: Path, testbed_id: str, *, runs: int = 200, seconds: float = 180) -> dict[str, Any]:
    """Both phases, one after the other, against one model server and one Redis."""
    if quick():
        runs, seconds = 30, 75
    redis = RedisServer(root / "redis", testbed_id).start()
    try:
        results = {}
        for label, shared in (("without", None), ("with", redis)):
            server = LLMServer([Turn.parse({"text": "ok", "input_tokens": 900, "output_tokens": 100})],
                               repeat_last=True, tokens_per_minute=PROVIDER_TPM).start()
            try:
                results[label] = _run_phase(server.openai_base_url, runs, seconds, shared)
                results[label]["server_429s"] = sum(1 for r in server.requests if r.get("status") == 429)
            finally:
                server.stop()
        return {"runs": runs, "seconds": seconds, "provider_tpm": PROVIDER_TPM, "quota_tpm": QUOTA_TPM,
                "weights": WEIGHTS, **results}
    finally:
        redis.stop()


def section(q: dict[str, Any]) -> list[str]:
    w, wo = q["with"], q["without"]

    def pct(x: float | None) -> str:
        return NONE if x is None else f"{x * 100:.0f}%"

    def share(r: dict[str, Any]) -> str:
        return ", ".join(f"{t} {pct(s)}" for t, s in r["shares"].items())

    def ms(x: float | None) -> str:
        return NONE if x is None else f"{x:.1f} ms"

    def s(x: float | None) -> str:
        return NONE if x is None else f"{x:.1f} s"

    weight_sum = sum(q["weights"].values())
    wanted = ", ".join(f"{t} {v / weight_sum * 100:.0f}%" for t, v in q["weights"].items())
    rows = [
        ["provider 429s (its own log)", str(wo["server_429s"]), str(w["server_429s"]), "0",
         "**met**" if w["server_429s"] == 0 else "**missed**"],
        ["calls refused (429) and sent again", str(wo["refused_429"]), str(w["refused_429"]), "", ""],
        ["delivered tokens/min (after the first minute)", f"{wo['delivered_tokens_per_min']:,.0f}",
         f"{w['delivered_tokens_per_min']:,.0f}", f"within 5% of {q['provider_tpm']:,}",
         "**met**" if abs(w["delivered_tokens_per_min"] - q["provider_tpm"]) <= 0.05 * q["provider_tpm"]
         else "**missed**"],
        ["namespaces' shares", share(wo), share(w), f"{wanted} (within 10%)",
         "**met**" if w["share_error"] <= 0.10 else "**missed**"],
        ["run-seconds a pod slept on a 429", f"{wo['throttled_pod_seconds']:,.0f}", "0", "", ""],
        ["grant wait p50 / p99", NONE, f"{s(w['grant_wait_p50_s'])} / {s(w['grant_wait_p99_s'])}", "", ""],
        ["calls that would end the attempt (no pod) / waited in a pod past 60 s", NONE,
         f"{w['yielded']} / {w['pod_waits_past_inline']}", "none in a pod past 60 s",
         "**met**" if w["pod_waits_past_inline"] == 0 else "**missed**"],
        ["Redis calls per model call", NONE, f"{w['redis_calls_per_call']:.1f}", "", ""],
        ["limiter's latency per ask, p50 / p99 (probe process)", NONE,
         f"{ms(w['limiter_p50_ms'])} / {ms(w['limiter_p99_ms'])}", "p99 < 5 ms",
         "**met**" if (w["limiter_p99_ms"] or 1e9) < 5 else "**missed**"],
        ["load generator lag p99 (a 10 ms sleep, late by) / its failed connections",
         f"{ms(wo['generator_lag_p99_ms'])} / {wo['connection_errors']}",
         f"{ms(w['generator_lag_p99_ms'])} / {w['connection_errors']}", "", ""],
    ]
    header = ["", "without quotas", "with a ModelQuota in Redis", "target", ""]
    return [
        "## Model quotas shared by a fleet (issue 40)",
        "",
        f"{q['runs']} stand-in runs (threads, one Redis connection each) of three namespaces with weights "
        f"{', '.join(f'{t} {v}' for t, v in q['weights'].items())}, each calling without pause for "
        f"{q['seconds']:.0f} s, 1,000 tokens a call, against the test bed's model server limited like a provider "
        f"to {q['provider_tpm']:,} tokens a minute. With quotas: one quota of {q['quota_tpm']:,} in a real "
        "redis-server, taken through the runner's own limiter. Side by side in one run.",
        "",
        "| " + " | ".join(header) + " |",
        "|" + "|".join("---" for _ in header) + "|",
        *("| " + " | ".join(r) + " |" for r in rows),
        "",
    ]


def main() -> int:
    """``python -m durablerun_bench.quotas``: this section alone; prints its RESULTS.md section."""
    from durablerun_bench.alone import alone

    with alone("quotas") as run:
        result = bench(run.root, run.run_id)
        run.report(section(result), result)
    return 0


if __name__ == "__main__":
    if sys.argv[1:2] == ["--probe"]:
        probe(sys.argv[2], sys.argv[3])
    else:
        raise SystemExit(main())
