"""Output streams read from outside the cluster: ``ctx.stream_url`` served by the webhook ingress as Server-Sent
Events, on the test bed (the chart's ingress with its own ServiceAccount, the runs' store in MinIO).

The client below parses the event stream as a browser's EventSource does (WHATWG HTML, "server-sent events"),
so what the tests compare is what a user's client would get; the truth they compare it with is the chunks in
the run's store.
"""

from __future__ import annotations

import asyncio
import base64
import http.client
import json
import os
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest

from durablerun import streams, webhooks
from durablerun_testbed import procs
from durablerun_testbed.llmserver import LLMServer, Turn
from durablerun_testbed.testbed import TestBed
from tests.helpers.clis import Kubectl
from tests.helpers.runs import RunEnv, StartOperator
from tests.operator.ingress_bed import STORE_SECRET, Ingress, keys_of


@dataclass(frozen=True)
class Event:
    id: str | None
    kind: str
    data: str


class SSE:
    """A GET of a stream URL, read event by event."""

    def __init__(self, url: str, last_id: str | None = None, timeout: float = 60) -> None:
        parts = urlsplit(url)
        self.conn = http.client.HTTPConnection(parts.hostname or "", parts.port, timeout=timeout)
        headers = {"Accept": "text/event-stream", **({"Last-Event-ID": last_id} if last_id is not None else {})}
        self.conn.request("GET", parts.path + (f"?{parts.query}" if parts.query else ""), headers=headers)
        self.reply = self.conn.getresponse()

    def events(self) -> Iterator[Event]:
        data: list[str] = []
        kind, ident = "", None
        while raw := self.reply.readline():
            line = raw.decode().removesuffix("\n").removesuffix("\r")
            if not line:
                if data:
                    yield Event(ident, kind or "message", "\n".join(data))
                data, kind, ident = [], "", None
                continue
            if line.startswith(":"):
                continue
            field, _, value = line.partition(":")
            value = value.removeprefix(" ")
            if field == "data":
                data.append(value)
            elif field == "event":
                kind = value
            elif field == "id":
                ident = value

    def close(self) -> None:
        self.conn.close()


def _stream_url_of(runs: RunEnv) -> str:
    return procs.wait_for(lambda: next((line.split(" ", 1)[1] for line in runs.ledger()
                                        if line.startswith("stream ")), None),
                          timeout=90, what="the workflow's stream URL in the ledger")


def _get(url: str, headers: dict[str, str] | None = None) -> tuple[int, dict[str, str], bytes]:
    parts = urlsplit(url)
    conn = http.client.HTTPConnection(parts.hostname or "", parts.port, timeout=30)
    try:
        conn.request("GET", parts.path + (f"?{parts.query}" if parts.query else ""), headers=headers or {})
        reply = conn.getresponse()
        return reply.status, dict(reply.getheaders()), reply.read() if reply.status != 200 else b""
    finally:
        conn.close()


def _stored_chunks(testbed: TestBed, runs: RunEnv, run: str, stream: str) -> list[tuple[int, str]]:
    """(offset, text) of every chunk of the run's stream, read from its store with its own credentials."""
    secret = json.loads(testbed.kubectl("get", "secret", STORE_SECRET, "-n", runs.namespace, "-o", "json").stdout)
    entries = {k: base64.b64decode(v) for k, v in secret["data"].items()}
    reader = streams.open_run_stream(runs.get(run), stream, secret=entries)
    try:
        found: list[tuple[int, str]] = []
        while True:
            step = reader.advance()
            found += [(read.chunk.offset, read.chunk.text) for read in step.reads]
            if step.done:
                return found
    finally:
        reader.close()


def test_a_stream_url_reads_a_live_stream_and_resumes_without_gap_or_duplicate(
        runs: RunEnv, ingress: Ingress, start_operator: StartOperator, testbed: TestBed) -> None:
    start_operator(DURABLERUN_WEBHOOK_URL=ingress.url)
    runs.apply(runs.manifest("talker", "optest_hooks:streamed", {"steps": 6, "pause_at": 2}))
    url = _stream_url_of(runs)
    assert url.startswith(ingress.url + webhooks.STREAMS_ROUTE)
    token = url.rsplit("/", 1)[1]
    claims = webhooks.read_claims(token)
    assert (claims.run, claims.event, claims.use) == ("talker", "notes", webhooks.USE_STREAM)

    # Live: the first three chunks arrive while the run runs; then this client goes away mid-run.
    first = SSE(url)
    assert first.reply.status == 200
    assert first.reply.getheader("Content-Type") == "text/event-stream; charset=utf-8"
    got: list[Event] = []
    for event in first.events():
        got.append(event)
        if len(got) == 3:
            break
    first.close()
    assert runs.get("talker")["status"].get("phase") not in ("Succeeded", "Failed", "Aborted")
    runs.wait_phase("talker", "Waiting", timeout=90)

    # The rest is written by the next attempt's pod; the reader picks up after its last event id.
    testbed.kubectl("patch", "dr", "talker", "-n", runs.namespace, "--type=merge",
                    "-p", json.dumps({"spec": {"events": {"more": True}}}))
    second = SSE(url, last_id=got[-1].id)
    ended = None
    for event in second.events():
        if event.kind == "end":
            ended = event
            break
        got.append(event)
    second.close()
    assert ended is not None, "the stream ended without its end event"
    # It ended because the run had: the runner's outcome is in the store before the operator sets the phase.
    runs.wait_phase("talker", "Succeeded", timeout=60)

    assert [e.kind for e in got] == ["message"] * 6
    stored = _stored_chunks(testbed, runs, "talker", "notes")
    assert [(int(e.id or -1), e.data) for e in got] == stored  # no gap, no duplicate, text as written
    assert [text for _, text in stored] == [f"note {i}\n  indented line of note {i}\n" for i in range(6)]
    assert ended.data == str(len(stored))

    # After the end, a reconnect at the end gets the end again at once (a client's auto-reconnect costs nothing).
    again = SSE(url, last_id=got[-1].id)
    assert [e.kind for e in again.events()] == ["end"]
    again.close()
    status, _, body = _get(url, {"Last-Event-ID": "twelve"})
    assert status == 400
    assert "Last-Event-ID" in json.loads(body)["error"]


#: The agent's answer, streamed word by word STREAM_PAUSE seconds apart: long enough to kill the run mid-answer.
ANSWER = ("Durable runs keep their answers: a reader outside the cluster gets every word of the surviving "
          "attempt once and in order, whatever happened to the pods that wrote them.")
STREAM_PAUSE = 0.25


def test_an_agents_streamed_answer_reaches_a_reader_outside_once_through_a_kill(
        runs: RunEnv, ingress: Ingress, start_operator: StartOperator, testbed: TestBed) -> None:
    """A pydantic-ai agent streams its answer to output stream ``answer`` as the model sends it; a reader of
    final chunks through the ingress is connected from before the first word, and the runner's pod is killed
    mid-answer. The step runs again in the next pod; the reader gets the surviving attempt's answer, each
    word once and in order, and the killed attempt's words only as superseded chunks of a plain read."""
    start_operator(DURABLERUN_WEBHOOK_URL=ingress.url)
    with LLMServer([Turn(text=ANSWER, stream_pause=STREAM_PAUSE)]) as model:
        runs.apply(runs.manifest("agent", "optest_agents:streamed_answer",
                                 {"llm": model.openai_base_url, "question": "what do durable runs keep?"}))
        url = _stream_url_of(runs)
        final = SSE(url, timeout=120)
        assert final.reply.status == 200
        # A plain reader sees the words as they come: once a few have, the pod is killed mid-answer.
        live = SSE(url.removesuffix("?final=true"))
        seen = [event for event, _ in zip(live.events(), range(4), strict=False)]
        live.close()
        assert [e.kind for e in seen] == ["message"] * 4, seen
        pod = runs.get("agent")["status"]["pod"]
        testbed.node.kill(runs.namespace, pod)
        got: list[Event] = []
        for event in final.events():
            if event.kind == "end":
                break
            got.append(event)
        final.close()
        runs.wait_phase("agent", "Succeeded", timeout=60)
        assert model.turns() == [0, 0], "the killed request is asked again, once"

    assert runs.get("agent")["status"]["attempt"] >= 2
    assert {e.kind for e in got} == {"message"}
    assert "".join(e.data for e in got) == ANSWER  # every word of the surviving attempt, once, in order
    offsets = [int(e.id or -1) for e in got]
    assert offsets == sorted(set(offsets))
    # A plain read after the run shows what the killed attempt wrote, marked superseded, before the answer.
    plain = SSE(url.removesuffix("?final=true"))
    everything = list(plain.events())
    plain.close()
    superseded = [e for e in everything if e.kind == "superseded"]
    assert superseded, everything
    assert ANSWER.startswith("".join(e.data for e in superseded)), superseded
    assert [e for e in everything if e.kind == "message"] == got


def test_stream_and_event_tokens_cannot_stand_in_for_each_other(
        runs: RunEnv, ingress: Ingress, start_operator: StartOperator, testbed: TestBed) -> None:
    """A stream token POSTed as an event, an event token (validly signed for the run) used to read, a token
    claiming the stream scope but signed with the run's event key, and a forged one: each is refused with the
    401 any bad token gets, and nothing is delivered or read."""
    start_operator(DURABLERUN_WEBHOOK_URL=ingress.url)
    runs.apply(runs.manifest("talker", "optest_hooks:streamed", {"steps": 2, "pause_at": 0}))
    url = _stream_url_of(runs)
    runs.wait_phase("talker", "Waiting", timeout=90)
    token = url.rsplit("/", 1)[1]
    claims = webhooks.read_claims(token)
    current, keys = keys_of(testbed, runs.namespace)
    run_key = webhooks.derive_run_key(keys[current], runs.namespace, "talker", claims.uid)
    as_event = webhooks.Claims(**{**claims.__dict__, "use": webhooks.USE_EVENT, "event": "more"})
    event_token = webhooks.sign(as_event, run_key)

    assert ingress.post(f"/v1/hooks/{token}", b"true") == (401, {"error": "unauthorized"})
    for bad in (event_token, webhooks.sign(claims, run_key), webhooks.sign(claims, keys[current]),
                webhooks.sign(claims, b"f" * 32), token[:-2] + "AA", "garbage"):
        status, _, body = _get(ingress.url + webhooks.STREAMS_ROUTE + bad)
        assert (status, json.loads(body)) == (401, {"error": "unauthorized"})
    assert runs.get("talker")["spec"].get("events", {}) == {}
    # What lets the ingress read the run's store: the Secret the chart names, and no other.
    as_ingress = Kubectl(ingress.kubeconfig)
    assert as_ingress.can_i("get", f"secrets/{STORE_SECRET}", runs.namespace)
    assert not as_ingress.can_i("get", "secrets/elsewhere", runs.namespace)
    assert not as_ingress.can_i("list", "secrets", runs.namespace)
    # The event token itself is good for what it is: it sends the event.
    assert ingress.post(f"/v1/hooks/{event_token}", b"true")[0] == 202


def _peak_rss_kib(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1])
    raise AssertionError(f"no VmHWM in /proc/{pid}/status")


@pytest.mark.parametrize("ingress", [["--rate", "1000", "--burst", "2000", "--stream-write-timeout", "3",
                                      "--stream-max-per-run", "2"]], indirect=True)
def test_a_client_that_never_reads_is_dropped_and_costs_bounded_memory(
        runs: RunEnv, ingress: Ingress, start_operator: StartOperator) -> None:
    chunks, size = 320, 64 * 1024  # 20 MiB in the store, far past any socket buffer
    start_operator(DURABLERUN_WEBHOOK_URL=ingress.url)
    runs.apply(runs.manifest("pour", "optest_hooks:flood", {"chunks": chunks, "size": size}))
    url = _stream_url_of(runs)
    runs.wait_phase("pour", "Waiting", timeout=120)  # every chunk written; the run stays live

    # A reader that reads: the last 16 chunks (resumed there), which also warms the ingress's store client.
    reader = SSE(url, last_id=str(chunks - 17))
    tail = []
    for event in reader.events():
        tail.append(event)
        if event.id == str(chunks - 1):
            break
    reader.close()
    assert [(e.id, e.data[:8], len(e.data)) for e in tail] == [
        (str(i), f"{i:08d}", size) for i in range(chunks - 16, chunks)]
    procs.wait_for(lambda: ingress.open_streams() == 0, timeout=30, what="the first reader's connection to close")
    before = _peak_rss_kib(ingress.pid)

    # A client that never reads: a small receive buffer, a request, and nothing more.
    parts = urlsplit(url)
    idle = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    idle.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    idle.connect((parts.hostname, parts.port))
    idle.sendall(f"GET {parts.path} HTTP/1.1\r\nHost: {parts.netloc}\r\nAccept: text/event-stream\r\n\r\n".encode())
    started = time.monotonic()
    procs.wait_for(lambda: ingress.open_streams() == 1, timeout=30, what="the idle client's connection")
    # Its run's connections are capped: a second reader gets in, a third waits its turn.
    second = SSE(url)
    assert second.reply.status == 200
    status, headers, body = _get(url)
    assert status == 429
    assert headers["Retry-After"] == "5"
    assert "retry later" in json.loads(body)["error"]
    second.close()

    procs.wait_for(lambda: ingress.outcomes().get("slow_reader") == 1, timeout=60,
                   what="the ingress to drop the client that never reads")
    dropped_after = time.monotonic() - started
    procs.wait_for(lambda: ingress.open_streams() == 0, timeout=30, what="every stream connection to close")
    grown = _peak_rss_kib(ingress.pid) - before
    assert grown < 8 * 1024, f"the ingress's peak memory grew {grown} KiB for one client that never reads"
    assert dropped_after < 3 + 20, dropped_after
    # The client's side: the connection is gone (what was buffered, then its end), not held open.
    idle.settimeout(30)
    received = 0
    try:
        while data := idle.recv(1 << 20):
            received += len(data)
    except ConnectionResetError:
        pass
    idle.close()
    assert received < chunks * size / 2, received


# --- in process: the real ingress over HTTP, runs in a filesystem store --------------------------------------

NAMESPACE_KEY = b"n" * 32


class Cluster:
    """What the ingress reads of the API server, for in-process tests: the keys Secret and ``runs`` (by name)."""

    def __init__(self, runs: dict[str, dict[str, Any]]) -> None:
        self.runs = runs
        self.reads: list[str] = []  # the runs read, in order

    def get_secret_data(self, namespace: str, name: str) -> dict[str, bytes]:
        return {"current": b"k1", "k1": NAMESPACE_KEY}

    def get_run(self, namespace: str, name: str) -> dict[str, Any]:
        self.reads.append(name)
        return self.runs[name]


def stream_path(run: dict[str, Any], stream: str) -> str:
    """The path of a stream URL for ``run``, signed as a runner pod signs it."""
    meta = run["metadata"]
    claims = webhooks.Claims(namespace=meta["namespace"], run=meta["name"], uid=meta["uid"], event=stream,
                             expires=int(time.time()) + 600, key_id="k1", use=webhooks.USE_STREAM)
    run_key = webhooks.derive_run_key(NAMESPACE_KEY, meta["namespace"], meta["name"], meta["uid"])
    return webhooks.STREAMS_ROUTE + webhooks.sign(claims, webhooks.derive_stream_key(run_key))


def test_connection_caps_answer_before_any_read(tmp_path: Path) -> None:
    """The caps are taken before the run or its store is read: past one run's share a reader gets 429, past the
    ingress's 503, both with Retry-After; a closed connection gives its slot back. In process: the real ingress
    over real HTTP, its runs' store on the filesystem (the runs have written nothing yet, so each reader waits)."""
    from aiohttp.test_utils import TestClient, TestServer

    from durablerun_operator.ingress.server import Ingress, Settings

    runs = {f"run-{i}": {"metadata": {"namespace": "team", "name": f"run-{i}", "uid": f"uid-{i}"},
                         "spec": {"workflow": "m:f", "checkpoint": {"uri": f"file://{tmp_path}"}}} for i in range(3)}
    cluster = Cluster(runs)
    ingress = Ingress(cluster, Settings(namespaces=frozenset({"team"}), stream_max_per_run=1,  # type: ignore[arg-type]
                                        stream_max_total=2))

    def path(name: str) -> str:
        return stream_path(runs[name], "notes")

    async def crowd() -> list[tuple[int, str | None]]:
        async with TestClient(TestServer(ingress.app(), host="127.0.0.1")) as client:
            first = await client.get(path("run-0"))
            answers = [(first.status, None)]
            for run in ("run-0", "run-1", "run-2"):
                reply = await client.get(path(run))
                answers.append((reply.status, reply.headers.get("Retry-After")))
                if reply.status != 200:
                    continue
                held = reply
            first.close()
            await released(lambda: ingress.streams.total == 1)
            again = await client.get(path("run-2"))
            answers.append((again.status, None))
            again.close()
            held.close()
            return answers

    async def released(condition: Callable[[], bool]) -> None:
        deadline = time.monotonic() + 10
        while not condition():
            assert time.monotonic() < deadline, "a closed connection never gave its slot back"
            await asyncio.sleep(0.05)

    answers = asyncio.run(crowd())
    assert answers == [(200, None), (429, "5"), (200, None), (503, "5"), (200, None)], answers
    assert cluster.reads == ["run-0", "run-1", "run-2"]  # the refused readers cost no API read


def test_superseded_chunks_are_marked_and_a_final_reader_gets_only_the_surviving_try(tmp_path: Path) -> None:
    """A step whose first try failed and was retried wrote two chunks; the first did not count. A plain reader
    gets it as an ``event: superseded`` (which EventSource's onmessage does not see), a ``?final=true`` reader
    not at all. In process: the real ingress, a run made by ``durablerun run`` in a filesystem store."""
    from aiohttp.test_utils import TestClient, TestServer

    from durablerun_operator.ingress.server import Ingress, Settings
    from tests.helpers.runs import WORKFLOWS

    store = tmp_path / "store"
    done = subprocess.run([sys.executable, "-m", "durablerun", "run", "optest_flows:reteller", "--run-id", "told",
                           "--store", f"file://{store}", "--quiet"], capture_output=True, text=True, timeout=120,
                          env={**os.environ, "PYTHONPATH": str(WORKFLOWS), "LEDGER": str(tmp_path / "ledger")})
    assert done.returncode == 4, done  # Waiting: for event "go", after the step
    run = {"metadata": {"namespace": "team", "name": "teller", "uid": "uid-1"},
           "spec": {"workflow": "optest_flows:reteller", "checkpoint": {"uri": f"file://{store}", "runId": "told"}}}
    path = stream_path(run, "story")
    ingress = Ingress(Cluster({"teller": run}), Settings(namespaces=frozenset({"team"})))  # type: ignore[arg-type]

    async def read(query: str, count: int) -> bytes:
        async with TestClient(TestServer(ingress.app(), host="127.0.0.1")) as client:
            reply = await client.get(path + query)
            assert reply.status == 200
            wire = b""
            while wire.count(b"\n\n") < 1 + count:  # the retry field, then whole events; the run waits, so the
                # stream stays open: read what is due
                wire += await asyncio.wait_for(reply.content.readany(), 30)
            reply.close()
            return wire

    plain = asyncio.run(read("", 2))
    assert plain.startswith(b"retry: 2000\n\nid: 0\nevent: superseded\ndata: try 1\ndata: \n\nid: 1\ndata: try 2\n")
    final = asyncio.run(read("?final=true", 1))
    assert final.startswith(b"retry: 2000\n\nid: 1\ndata: try 2\ndata: \n\n")
    assert b"try 1" not in final
