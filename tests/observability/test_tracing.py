"""Traces of runs in a real Jaeger: one trace per run across attempts, whatever happens to the collector.

The runner is the real local CLI (``durablerun run``) in its own process, exporting over OTLP/HTTP to a
Jaeger v2 on loopback; the tests read the trace back through Jaeger's HTTP query API (/api/traces/<id>).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from durablerun import api
from durablerun._private.records import layout
from durablerun._private.records.model import WaitRecord
from durablerun.stores import open_store
from durablerun_testbed import procs
from durablerun_testbed.jaeger import Jaeger

WAIT = 30.0  # seconds: spans leave the runner within 0.1 s (OTEL_BSP_SCHEDULE_DELAY below) and Jaeger stores
# them within 0.1 s more

WORKFLOW = textwrap.dedent('''
    import os, time
    from datetime import timedelta
    from durablerun import llm

    def slow():
        marker = os.environ["SLOW_MARKER"]
        if not os.path.exists(marker):  # the first time: say so, then hang until killed
            open(marker, "w").close()
            time.sleep(600)
        return "slow done"

    def think():
        llm.charge(llm.Usage("gpt-4o", 1200, 300))
        return "thought"

    async def run(ctx, input):
        await ctx.step("plan", lambda: "a plan")
        await ctx.step("think", think)
        await ctx.step("slow", slow)
        # Within inline_sleep_max: this attempt polls for the event itself.
        approval = await ctx.wait_for_event("approve", timeout=timedelta(seconds=50))
        await ctx.step("act", lambda: approval)
        return "done"

    async def quick(ctx, input):
        for i in range(5):
            await ctx.step(f"s{i}", lambda: i)
        return "quick"
''')


@pytest.fixture
def project(tmp_path: Path) -> Path:
    (tmp_path / "wf_traced.py").write_text(WORKFLOW)
    return tmp_path


def runner(project: Path, endpoint: str, **extra: str) -> tuple[list[str], dict[str, str]]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("OTEL_")}
    env.update({"OTEL_EXPORTER_OTLP_ENDPOINT": endpoint, "OTEL_SERVICE_NAME": "durablerun-tests",
                "OTEL_BSP_SCHEDULE_DELAY": "100", "SLOW_MARKER": str(project / "slow-started"),
                "PYTHONPATH": str(project), **extra})
    return [sys.executable, "-m", "durablerun", "run"], env


def trace_with(jaeger: Jaeger, trace_id: str, ready: Callable[[list[dict[str, Any]]], bool],
               what: str) -> list[dict[str, Any]]:
    def spans() -> list[dict[str, Any]] | None:
        trace = jaeger.trace(trace_id)
        found = list(trace["spans"]) if trace else []
        return found if ready(found) else None

    return procs.wait_for(spans, timeout=WAIT, interval=0.2, what=what)


def tags(span: dict[str, Any]) -> dict[str, Any]:
    return {t["key"]: t["value"] for t in span.get("tags", [])}


def parent(span: dict[str, Any]) -> str | None:
    return next((r["spanID"] for r in span.get("references", []) if r["refType"] == "CHILD_OF"), None)


def named(spans: list[dict[str, Any]], name: str) -> list[dict[str, Any]]:
    return [s for s in spans if s["operationName"] == name]


def test_a_run_killed_mid_step_is_one_trace_with_both_attempts(jaeger: Jaeger, project: Path) -> None:
    run_id = "traced-" + uuid.uuid4().hex[:8]
    store = f"file://{project / 'store'}"
    argv, env = runner(project, jaeger.otlp_endpoint)
    args = [*argv, "wf_traced:run", "--run-id", run_id, "--store", store, "--quiet"]
    trace_id = api.trace_id(f"_local/{run_id}")

    first = subprocess.Popen(args, cwd=project, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        procs.wait_for(lambda: (project / "slow-started").exists(), timeout=WAIT, what="step slow to start")
        # What a killed attempt can lose is what it had not exported yet (OTEL_BSP_SCHEDULE_DELAY): wait for it.
        trace_with(jaeger, trace_id, lambda s: len(named(s, "step plan") + named(s, "step think")) == 2,
                   "attempt 1's finished steps in Jaeger")
        first.send_signal(signal.SIGKILL)
    finally:
        first.kill()
        first.communicate(timeout=30)
    assert first.returncode == -signal.SIGKILL

    second = subprocess.Popen(args, cwd=project, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        ref = layout.RunRef.local(run_id)
        opened = open_store(store)

        def waiting() -> bool:
            rs = opened.run_store(ref)
            try:
                records = rs.load().records
            finally:
                rs.close()
            return bool(records) and isinstance(records[-1], WaitRecord)

        procs.wait_for(waiting, timeout=WAIT, what="attempt 2 to wait for the event")
        time.sleep(0.3)  # the wait lasts a measurable while
        sent = subprocess.run([*argv[:-1], "send-event", "--run-id", run_id, "--store", store, "approve",
                               '{"approved": true}'], cwd=project, env=env, capture_output=True, text=True, timeout=60)
        assert sent.returncode == 0, sent.stderr
        _out, err = second.communicate(timeout=90)
    finally:
        second.kill()
    assert second.returncode == 0, err

    spans = trace_with(jaeger, trace_id, lambda s: len(named(s, "attempt")) >= 2 and bool(named(s, "step act")),
                       "both attempts and the last step in Jaeger")
    assert {s["traceID"] for s in spans} == {trace_id}
    attempts = named(spans, "attempt")
    assert len(attempts) == 2, [tags(a) for a in attempts]
    killed = next(a for a in attempts if tags(a)["durablerun.attempt.outcome"] == "Crashed")
    resumed = next(a for a in attempts if tags(a)["durablerun.attempt.outcome"] == "Completed")
    assert tags(killed)["durablerun.attempt.reconstructed"] is True
    assert tags(resumed)["durablerun.attempt.resumed"] is True

    steps = [s for s in spans if s["operationName"].startswith("step ")]
    assert sorted(s["operationName"] for s in steps) == ["step act", "step plan", "step slow", "step think"]
    by_name = {s["operationName"]: s for s in steps}
    assert parent(by_name["step plan"]) == parent(by_name["step think"]) == killed["spanID"]
    assert parent(by_name["step slow"]) == parent(by_name["step act"]) == resumed["spanID"]
    assert tags(by_name["step slow"]).get("durablerun.step.reexecuted") is True
    assert [n for n, s in by_name.items() if tags(s).get("durablerun.step.reexecuted")] == ["step slow"]
    think = tags(by_name["step think"])
    assert (think["durablerun.cost.tokens"], think["durablerun.step.attempts"]) == (1500, 1)

    chat = named(spans, "chat gpt-4o")
    assert len(chat) == 1
    assert parent(chat[0]) == by_name["step think"]["spanID"]
    assert {k: v for k, v in tags(chat[0]).items() if k.startswith("gen_ai.")} == {
        "gen_ai.operation.name": "chat", "gen_ai.system": "openai", "gen_ai.request.model": "gpt-4o",
        "gen_ai.usage.input_tokens": 1200, "gen_ai.usage.output_tokens": 300}
    assert tags(chat[0])["durablerun.cost.usd"] == pytest.approx(think["durablerun.cost.usd"])

    wait = named(spans, "wait approve")
    assert len(wait) == 1
    assert parent(wait[0]) == resumed["spanID"]
    waited = tags(wait[0])["durablerun.wait.seconds"]
    assert waited >= 0.3
    assert wait[0]["duration"] == pytest.approx(waited * 1e6, rel=0.01, abs=2000)
    assert tags(wait[0])["durablerun.event.received"] is True
    assert "not delivered" not in err


def test_a_collector_that_is_down_loses_spans_not_the_run(project: Path) -> None:
    down = f"http://127.0.0.1:{procs.free_port()}"  # nothing listens there
    argv, env = runner(project, down)
    started = time.monotonic()
    done = subprocess.run([*argv, "wf_traced:quick", "--run-id", "down", "--store", f"file://{project / 'store'}",
                           "--quiet"], cwd=project, env=env, capture_output=True, text=True, timeout=120)
    took = time.monotonic() - started
    assert done.returncode == 0, done.stderr
    # Six spans (the attempt and five steps) could not be delivered, and the runner says so once.
    assert done.stderr.count("were not delivered") == 1, done.stderr
    assert "6 of 6 spans of run _local/down were not delivered" in done.stderr
    assert took < 20, f"an unreachable collector held the run up: it took {took:.1f}s"


def test_a_bad_tracing_setting_is_said_once_without_its_credentials_and_the_run_goes_on(project: Path) -> None:
    # Which settings are bad, and what is said of each: tests/observability/test_otel_settings.py.
    argv, env = runner(project, "")
    env["OTEL_EXPORTER_OTLP_ENDPOINT"] = "http://user:pw@:x/"
    done = subprocess.run([*argv, "wf_traced:quick", "--run-id", "bad", "--store", f"file://{project / 'store'}",
                           "--quiet"], cwd=project, env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stderr.count("tracing is off for this attempt") == 1, done.stderr
    assert "OTEL_EXPORTER_OTLP_ENDPOINT='<a URL with credentials>' is not an http(s) URL" in done.stderr
    assert "pw" not in done.stderr
