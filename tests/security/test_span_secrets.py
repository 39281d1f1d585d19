"""No secret value ever reaches a trace: exported spans are scanned like logs and the journal are.

A local run on the test bed's MinIO, with its S3 keys in the environment, an OTLP header carrying a token,
an API key in the env, and a canary in the run's input, a step's result, a step's error message and an
event's payload, exports its trace to a real Jaeger; Jaeger's stored trace (as its query API returns it)
is scanned for every secret value, raw and base64-encoded. The scan is shown to find what the trace does
hold (a step's name).
"""

from __future__ import annotations

import json
import os
import secrets
import subprocess
import sys
import textwrap
from pathlib import Path

from durablerun import api
from durablerun_testbed import procs
from durablerun_testbed.jaeger import Jaeger
from durablerun_testbed.s3 import S3Server
from tests.helpers.runs import RunEnv, StartOperator
from tests.security.secret_scan import leaks


def test_no_secret_becomes_a_span_attribute(jaeger: Jaeger, s3_server: S3Server, s3_bucket: str,
                                            tmp_path: Path) -> None:
    canary, token, api_key = ("canary-" + secrets.token_hex(16), "token-" + secrets.token_hex(16),
                              "sk-" + secrets.token_hex(16))
    visible = "visible_" + secrets.token_hex(6)
    (tmp_path / "wf_secrets.py").write_text(textwrap.dedent(f'''
        from durablerun import errors

        def fails():
            raise errors.NonRetryableError("the key was " + {canary!r})

        async def run(ctx, input):
            await ctx.step("{visible}", lambda: input["secret"])
            try:
                await ctx.step("fails", fails)
            except errors.StepError:
                pass
            payload = await ctx.wait_for_event("approve")
            return payload["note"]
    '''))
    env = {k: v for k, v in os.environ.items() if not k.startswith("OTEL_")}
    env.update({"OTEL_EXPORTER_OTLP_ENDPOINT": jaeger.otlp_endpoint,
                "OTEL_EXPORTER_OTLP_HEADERS": f"authorization=Bearer%20{token}",
                "OTEL_BSP_SCHEDULE_DELAY": "100", "OTEL_BSP_EXPORT_TIMEOUT": "30000",
                "LLM_API_KEY": api_key, "PYTHONPATH": str(tmp_path),
                "AWS_ACCESS_KEY_ID": s3_server.access_key, "AWS_SECRET_ACCESS_KEY": s3_server.secret_key})
    store = ["--store", f"s3://{s3_bucket}/runs", "--endpoint-url", s3_server.endpoint_url, "--run-id", "secret-run"]
    cli = [sys.executable, "-m", "durablerun"]
    waiting = subprocess.run([*cli, "run", "wf_secrets:run", *store, "--quiet", "--input",
                              json.dumps({"secret": canary})], cwd=tmp_path, env=env, capture_output=True,
                             text=True, timeout=120)
    assert waiting.returncode == api.Outcome.WAITING.exit_code, waiting.stderr
    sent = subprocess.run([*cli, "send-event", *store, "approve", json.dumps({"note": canary})], cwd=tmp_path,
                          env=env, capture_output=True, text=True, timeout=60)
    assert sent.returncode == 0, sent.stderr
    done = subprocess.run([*cli, "resume", *store, "--quiet"], cwd=tmp_path, env=env, capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == 0, done.stderr

    for attempt in (waiting, done):  # dropped spans would fail the wait below without saying why
        assert "not delivered" not in attempt.stderr, attempt.stderr
    trace_id = api.trace_id("_local/secret-run")

    def stored() -> bytes | None:
        body = jaeger.raw_trace(trace_id)
        return body if b'"wait approve"' in body and b'"attempt"' in body else None

    body = procs.wait_for(stored, timeout=30, interval=0.2, what="the run's trace in Jaeger")
    values = {"the S3 secret key": s3_server.secret_key, "the OTLP header's token": token,
              "an API key in the env": api_key, "the canary in input, result, error and event": canary}
    assert leaks(body, values) == [], "secret values in the exported spans"
    assert leaks(body, {"a step's name": visible}) == ["a step's name"]  # the scan finds what is there


def test_no_workflow_text_becomes_an_operator_span_attribute(
        start_operator: StartOperator, runs: RunEnv, jaeger: Jaeger) -> None:
    """The operator's spans carry reasons and names, never an Event's message, which may quote the workflow: a
    DurableRun with a secret in its input, a step's result and a step's error, and one that reaches its
    exception (so the Failed Event's message and status.message quote it), traced through a real Jaeger."""
    start_operator(OTEL_EXPORTER_OTLP_ENDPOINT=jaeger.otlp_endpoint, OTEL_BSP_SCHEDULE_DELAY="100")
    canary, failure = "canary-" + secrets.token_hex(16), "failure-" + secrets.token_hex(16)
    visible = "visible_" + secrets.token_hex(6)
    runs.apply(runs.manifest("leaky", "optest_secrets:leaky", {"secret": canary, "visible": visible}))
    runs.wait_phase("leaky", "Waiting", timeout=90)
    runs.testbed.kubectl("patch", "dr", "leaky", "-n", runs.namespace, "--type", "merge",
                         "-p", json.dumps({"spec": {"events": {"approve": {"note": failure}}}}))
    done = runs.wait_phase("leaky", "Failed", timeout=90)
    assert failure in done["status"]["message"]  # the workflow's text is there to leak

    def stored() -> bytes | None:
        body = jaeger.raw_trace(done["status"]["traceID"])
        return body if b'"operator Failed"' in body and b'"operator Waiting"' in body else None

    body = procs.wait_for(stored, timeout=30, interval=0.2, what="the operator's Failed in the run's trace")
    values = {"the canary in input, result and a step's error": canary,
              "the exception the run failed with (its Failed Event's message)": failure}
    assert leaks(body, values) == [], "workflow text in the exported spans"
    assert leaks(body, {"a step's name": visible}) == ["a step's name"]  # the scan finds what is there

    # The run's Events carry no secret the workflow merely handled. (The Failed Event quotes the exception the
    # run failed with, as status.message does: docs/security.md.)
    # The operator posts the Failed Event after the status write that set Failed: wait for it.
    def failed_events() -> bytes | None:
        listed = runs.events("leaky")
        return json.dumps(listed).encode() if any(e["reason"] == "Failed" for e in listed) else None

    events = procs.wait_for(failed_events, timeout=30, interval=0.2, what="the run's Failed Event")
    assert leaks(events, {"the canary in input, result and a step's error": canary}) == []
    assert leaks(events, {"the failure": failure}) == ["the failure"]
