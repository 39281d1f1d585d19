"""The span export child (durablerun._private.telemetry.spanexport): what it is given, and that it neither holds up
the runner nor outlives it.

Real processes, a real Jaeger on loopback. The traces themselves: tests/observability/test_tracing.py.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import threading
import time
import uuid
from pathlib import Path

from durablerun import api
from durablerun._private.telemetry import spanexport
from durablerun_testbed import procs
from durablerun_testbed.jaeger import Jaeger

WAIT = 30.0


def environ(pid: int) -> dict[str, str]:
    raw = Path(f"/proc/{pid}/environ").read_bytes()
    return dict(item.split("=", 1) for item in raw.decode().split("\0") if "=" in item)


def gone(pid: int) -> bool:
    """Exited: no such process, or a zombie its new parent has not reaped yet."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "Z"
    except FileNotFoundError:
        return True


def test_the_export_child_gets_the_otel_settings_and_none_of_the_runners_secrets() -> None:
    env = {"OTEL_EXPORTER_OTLP_ENDPOINT": f"http://127.0.0.1:{procs.free_port()}",
           "OTEL_EXPORTER_OTLP_HEADERS": "x-tenant=t1", "OTEL_SERVICE_NAME": "svc", "PATH": os.environ["PATH"],
           "AWS_ACCESS_KEY_ID": "AKIA-canary", "AWS_SECRET_ACCESS_KEY": "secret-canary",
           "OPENAI_API_KEY": "sk-canary", api.Env.WEBHOOK_URL: "https://hooks.example/canary"}
    pipe = spanexport.start(api.trace_id_of("_local/env"), env)
    try:
        assert pipe.process is not None
        pid = pipe.process.pid
        # Empty for a moment after Popen returns, while the kernel finishes the child's exec.
        given = procs.wait_for(lambda: environ(pid) or None, timeout=WAIT, what="the export child's environment")
    finally:
        assert pipe.close() == 0
    assert {k: given[k] for k in given if k.startswith("OTEL_")} == {
        k: v for k, v in env.items() if k.startswith("OTEL_")}
    assert not {"AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "OPENAI_API_KEY", api.Env.WEBHOOK_URL} & set(given)
    assert not [v for v in given.values() if "canary" in v]


def test_a_full_pipe_drops_and_counts_spans_and_never_holds_the_runner_up(jaeger: Jaeger) -> None:
    key = f"_local/full-{uuid.uuid4().hex[:8]}"
    # A flush long enough for the child to read the 1 MiB it was behind and export it on a busy machine (the
    # default 2 s is not: CI once saw none of it delivered).
    pipe = spanexport.start(api.trace_id_of(key), {"OTEL_EXPORTER_OTLP_ENDPOINT": jaeger.otlp_endpoint,
                                                   "OTEL_SERVICE_NAME": "durablerun-tests", "PATH": os.environ["PATH"],
                                                   "OTEL_BSP_EXPORT_TIMEOUT": str(int(WAIT * 1000))})
    assert pipe.process is not None
    # A child that reads nothing (stopped: starved of CPU, or stuck behind a slow collector) and spans longer
    # than a pipe writes at once (PIPE_BUF, 4 KiB): the pipe's 1 MiB fills after some 200 of them, and the
    # last line that fits is written in part.
    pipe.process.send_signal(signal.SIGSTOP)
    spans = 400
    sent = threading.Event()

    def send() -> None:
        for i in range(spans):
            pipe.send((f"step s{i}", i + 1, 0, time.time_ns(), time.time_ns(), {"pad": "x" * 5000}, [], None))
        sent.set()

    threading.Thread(target=send, daemon=True).start()
    try:
        assert sent.wait(WAIT), "a send waited for the stopped export child"
    finally:
        pipe.process.send_signal(signal.SIGCONT)
    assert pipe.sent == spans
    assert 0 < pipe.dropped < spans
    delivered = pipe.close()
    # Every span the pipe took reached the collector whole: the line written in part was finished, not cut.
    assert delivered == spans - pipe.dropped
    stored = procs.wait_for(lambda: (t := jaeger.trace(api.trace_id(key))) and len(t["spans"]) >= delivered and t,
                            timeout=WAIT, interval=0.2, what="the delivered spans in Jaeger")
    assert len(stored["spans"]) == delivered


WORKFLOW = textwrap.dedent('''
    import os, time

    def hold_the_pipe():
        # A process forked from the runner keeps every descriptor it had, the span pipe's write end too:
        # the export child sees no end of the stream when the runner dies.
        pid = os.fork()
        if pid == 0:
            time.sleep(120)
            os._exit(0)
        with open(os.environ["FORKED"], "w") as f:
            f.write(str(pid))
        time.sleep(600)

    async def run(ctx, input):
        await ctx.step("a", lambda: 1)
        await ctx.step("b", lambda: 2)
        await ctx.step("hold", hold_the_pipe)
''')


def test_a_killed_runner_leaves_no_export_child_and_its_spans_are_delivered(jaeger: Jaeger, tmp_path: Path) -> None:
    (tmp_path / "wf_fork.py").write_text(WORKFLOW)
    forked = tmp_path / "forked"
    run_id = "killed-" + uuid.uuid4().hex[:8]
    env = {k: v for k, v in os.environ.items() if not k.startswith("OTEL_")}
    # A batch delay of 5 s: steps a and b are still in the child when the runner is killed.
    env.update({"OTEL_BSP_SCHEDULE_DELAY": "5000", "OTEL_EXPORTER_OTLP_ENDPOINT": jaeger.otlp_endpoint,
                "OTEL_SERVICE_NAME": "durablerun-tests",
                "FORKED": str(forked), "PYTHONPATH": str(tmp_path)})
    log = (tmp_path / "runner.log").open("wb")
    runner = subprocess.Popen([sys.executable, "-m", "durablerun", "run", "wf_fork:run", "--run-id", run_id,
                               "--store", f"file://{tmp_path / 'store'}", "--quiet"], cwd=tmp_path, env=env,
                              stdout=subprocess.DEVNULL, stderr=log)  # not a pipe: the forked process holds it
    holder = 0
    try:
        holder = int(procs.wait_for(lambda: forked.exists() and forked.read_text(), timeout=WAIT,
                                    what="the step to fork"))

        def export_child() -> int | None:
            for entry in Path("/proc").iterdir():
                try:
                    argv = (entry / "cmdline").read_bytes().split(b"\0")
                except OSError:
                    continue
                if spanexport.__file__.encode() in argv and str(runner.pid).encode() in argv:
                    return int(entry.name)
            return None

        child = procs.wait_for(export_child, timeout=WAIT, what="the runner's span export child")
        # Killed once the child reads the pipe, past its start (one killed before is found by its parent id).
        procs.wait_for(lambda: "pipe" in Path(f"/proc/{child}/wchan").read_text(), timeout=WAIT,
                       what="the export child to read the pipe")
        runner.send_signal(signal.SIGKILL)
        runner.wait(timeout=WAIT)
        procs.wait_for(lambda: gone(child), timeout=spanexport.EXIT_SECONDS + WAIT,
                       what="the export child to exit after the runner was killed")
    finally:
        runner.kill()
        runner.wait()
        log.close()
        if holder:
            os.kill(holder, signal.SIGKILL)
    trace = procs.wait_for(lambda: (t := jaeger.trace(api.trace_id(f"_local/{run_id}")))
                           and len(t["spans"]) >= 2 and t, timeout=WAIT, interval=0.2,
                           what="steps a and b in Jaeger")
    assert sorted(s["operationName"] for s in trace["spans"]) == ["step a", "step b"]


def test_a_span_sent_after_the_pipe_closed_is_dropped_not_written_to_whatever_reuses_its_number(
        tmp_path: Path) -> None:
    read, write = os.pipe()
    pipe = spanexport.SpanPipe(write)
    pipe.close()
    try:
        with (tmp_path / "other").open("wb") as other:
            assert other.fileno() == write  # the lowest free number
            pipe.send(("chat gpt-4o", 1, 0, 0, 0, {}, [], None))
    finally:
        os.close(read)
    assert (tmp_path / "other").read_bytes() == b""
    assert (pipe.sent, pipe.dropped) == (1, 1)


def test_the_export_child_yields_the_cpu_to_the_runner() -> None:
    # Sharing a CPU with the runner, the export takes the slack, not the steps' time (bench/RESULTS.md, 5).
    env = {"OTEL_EXPORTER_OTLP_ENDPOINT": f"http://127.0.0.1:{procs.free_port()}", "PATH": os.environ["PATH"]}
    pipe = spanexport.start(api.trace_id_of("_local/nice"), env)
    try:
        assert pipe.process is not None
        pid = pipe.process.pid
        lower = min(19, os.getpriority(os.PRIO_PROCESS, 0) + spanexport.EXPORT_NICE)  # 19 is the floor
        procs.wait_for(lambda: os.getpriority(os.PRIO_PROCESS, pid) == lower, timeout=WAIT,
                       what=f"the export child to lower its priority to nice {lower}")
    finally:
        assert pipe.close() == 0


def test_an_export_child_that_died_costs_spans_not_time() -> None:
    read, write = os.pipe()
    reader = subprocess.Popen(["sleep", "0.2"], stdin=read)  # reads nothing, then is gone
    os.close(read)
    os.set_blocking(write, False)
    pipe = spanexport.SpanPipe(write, reader)
    big = {"pad": "y" * 6000}  # over PIPE_BUF: the pipe takes the line that fills it in part
    while not pipe.dropped:
        pipe.send(("step s", 1, 0, 0, 0, big, [], None))
    reader.wait(timeout=WAIT)
    pipe.send(("step s", 1, 0, 0, 0, big, [], None))
    assert pipe.dropped == 2
    started = time.monotonic()
    assert pipe.close(seconds=WAIT) == 0
    assert time.monotonic() - started < 5, "close waited on a pipe nobody reads"


def test_a_steps_compact_span_reaches_the_exporter_with_its_attributes_retries_cost_and_failure(
        tmp_path: Path) -> None:
    """A step's span crosses the pipe as a flat spanexport.Step; the exporter sees the span it stands for."""
    from datetime import timedelta

    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
    from opentelemetry.trace import StatusCode

    from durablerun import DurableContext, NonRetryableError, llm
    from durablerun._private.telemetry import tracing
    from durablerun.engine import EngineConfig, Run
    from durablerun.stores import RunRef, open_store

    calls: list[int] = []

    def flaky() -> str:
        calls.append(1)
        if len(calls) == 1:
            raise ConnectionError("once")
        llm.charge(llm.Usage("gpt-4o", 1200, 300))
        return "x" * 100

    def broken() -> None:
        raise NonRetryableError("for good")

    async def workflow(ctx: DurableContext, input: object) -> None:
        await ctx.step("flaky", flaky)
        await ctx.step("broken", broken)

    exporter = InMemorySpanExporter()
    store = open_store(f"file://{tmp_path}")
    ref = RunRef.local("compact")
    try:
        sinks = tracing.sinks_for(store, ref, env={}, exporter=exporter)
        result = Run(store=store, run=ref, workflow=workflow, input={}, sinks=sinks,
                     config=EngineConfig(retry_initial=timedelta(milliseconds=1))).run_attempt()
    finally:
        store.close()
    assert result.outcome == api.Outcome.FAILED
    spans = {s.name: s for s in exporter.get_finished_spans()}
    attempt, flaky_span, broken_span = spans["attempt"], spans["step flaky"], spans["step broken"]
    assert flaky_span.parent is not None
    assert flaky_span.parent.span_id == attempt.context.span_id
    assert flaky_span.context.trace_id == attempt.context.trace_id == api.trace_id_of(ref.key)
    a = dict(flaky_span.attributes or {})
    assert a.pop("durablerun.cost.usd") > 0
    assert a == {"durablerun.step.name": "flaky", "durablerun.step.position": "0", "durablerun.step.attempts": 2,
                 "durablerun.step.ok": True, "durablerun.journal.seq": a["durablerun.journal.seq"],
                 "durablerun.step.result_bytes": a["durablerun.step.result_bytes"], "durablerun.cost.tokens": 1500}
    assert a["durablerun.step.result_bytes"] >= 100
    assert [(e.name, dict(e.attributes or {})) for e in flaky_span.events] == [
        ("retry", {"durablerun.step.attempt": 2})]
    assert flaky_span.status.status_code is StatusCode.UNSET
    start, end = flaky_span.start_time, flaky_span.end_time
    assert start is not None
    assert end is not None
    assert start <= flaky_span.events[0].timestamp <= end
    b = dict(broken_span.attributes or {})
    assert (b["durablerun.step.ok"], b["durablerun.step.result_bytes"], b["error.type"]) == (
        False, 0, "NonRetryableError")
    assert not {"durablerun.cost.usd", "durablerun.cost.tokens", "durablerun.step.reexecuted"} & set(b)
    assert broken_span.status.status_code is StatusCode.ERROR
    assert broken_span.status.description == "NonRetryableError"


def test_a_step_the_attempt_ended_in_the_middle_of_is_a_span_marked_interrupted(tmp_path: Path) -> None:
    import asyncio

    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
    from opentelemetry.trace import StatusCode

    from durablerun import DurableContext
    from durablerun._private.telemetry import tracing
    from durablerun.engine import Run
    from durablerun.stores import RunRef, open_store

    exporter = InMemorySpanExporter()
    store = open_store(f"file://{tmp_path}")
    ref = RunRef.local("interrupted")
    runs: list[Run] = []

    async def stuck() -> None:
        runs[0].fence("the lease was lost (test)")  # the attempt ends now, this step unjournaled
        await asyncio.sleep(WAIT)

    async def workflow(ctx: DurableContext, input: object) -> None:
        await ctx.step("stuck", stuck)

    try:
        runs.append(Run(store=store, run=ref, workflow=workflow, input={},
                        sinks=tracing.sinks_for(store, ref, env={}, exporter=exporter)))
        assert runs[0].run_attempt().outcome == api.Outcome.FENCED
    finally:
        store.close()
    spans = {s.name: s for s in exporter.get_finished_spans()}
    step = spans["step stuck"]
    assert step.parent is not None
    assert step.parent.span_id == spans["attempt"].context.span_id
    assert dict(step.attributes or {}) == {"durablerun.step.name": "stuck", "durablerun.step.position": "0",
                                           "durablerun.step.interrupted": True}
    assert step.status.status_code is StatusCode.ERROR
    assert step.status.description == ("the attempt ended (Fenced) before this step was journaled; it runs again "
                                       "in the next attempt")


def test_the_flush_at_an_attempts_end_is_otel_bsp_export_timeout_when_set() -> None:
    assert spanexport.flush_seconds({}) == spanexport.FLUSH_SECONDS
    assert spanexport.flush_seconds({"OTEL_BSP_EXPORT_TIMEOUT": "30000"}) == 30.0
    assert spanexport.flush_seconds({"OTEL_BSP_EXPORT_TIMEOUT": "soon"}) == spanexport.FLUSH_SECONDS


def test_a_span_leaves_the_child_within_a_second_or_so_not_only_at_the_attempts_end() -> None:
    """What a container killed whole loses is what the child held: at most the last SCHEDULE_DELAY_MS of spans,
    not the SDK's default 5 s."""
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    exporter = InMemorySpanExporter()
    export = spanexport.InProcess(api.trace_id_of("_local/delay"), {}, exporter)
    try:
        sent = time.monotonic()
        export.send(("attempt", 1, 0, time.time_ns(), time.time_ns(), {}, [], None))
        procs.wait_for(lambda: exporter.get_finished_spans() or None, timeout=WAIT, interval=0.05,
                       what="the span to be exported")
        took = time.monotonic() - sent
    finally:
        export.close()
    assert took < spanexport.SCHEDULE_DELAY_MS / 1000 + 1.5, took  # the SDK's default would take 5 s
    slow = spanexport.InProcess(api.trace_id_of("_local/delay"), {"OTEL_BSP_SCHEDULE_DELAY": "60000"}, exporter)
    try:
        slow.send(("attempt", 2, 0, time.time_ns(), time.time_ns(), {}, [], None))
        time.sleep(spanexport.SCHEDULE_DELAY_MS / 1000 + 1.5)  # a negative: nothing to wait on
        assert len(exporter.get_finished_spans()) == 1, "OTEL_BSP_SCHEDULE_DELAY was not honoured"
    finally:
        slow.close()
