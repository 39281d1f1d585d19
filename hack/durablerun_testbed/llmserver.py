"""A scripted model server on loopback speaking the providers' wire formats.

No model provider is reachable from here, so tests and the agent examples talk
to this server with the real SDKs (openai, anthropic, pydantic-ai, langchain)
pointed at it. It answers OpenAI chat completions (``POST /v1/chat/completions``)
and Anthropic messages (``POST /v1/messages``) from one script: turn *n* of a
conversation (the number of assistant messages the request already holds) gets
``script[n]``, either tool calls or a final text, with the token usage the
script gives. So a replayed or resumed agent gets the same answer for the same
turn, as from a deterministic model. Both can also stream, whole or word by
word (a turn's ``stream_pause`` apart, to kill a run mid-answer), as
server-sent events: Anthropic's events (clients such as pydantic-ai's always
stream), and OpenAI's chunks with the usage in a last chunk when the request
asks for it (``stream_options.include_usage``).

Every request is logged (``requests``: api, turn, model, tool results seen);
tests wait on the log (``wait_for``) and may hold one turn's answer
(``hold_turn``) to kill a run while that request is in flight.

Like a provider, it may limit each model's tokens per minute (``tokens_per_minute``): a bucket per model
that refills continuously, a minute's worth at most, charged each answer's usage. A request whose usage
does not fit is refused with 429, ``Retry-After`` (whole seconds) and the ``x-ratelimit-*`` headers, and
logged with ``"status": 429``. (Its own arithmetic, not durable-run's: it is the evidence.)

    python -m durablerun_testbed llm-server --script script.json [--port 8931] [--host ADDRESS]
"""

from __future__ import annotations

import argparse
import json
import math
import re
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

#: Usage of a turn the script gives none for: enough to price, different per turn.
DEFAULT_INPUT_TOKENS = 1000
DEFAULT_OUTPUT_TOKENS = 200


@dataclass
class Turn:
    """One scripted answer: ``text`` (final) or ``tool_calls`` ([{"name", "args"}])."""

    text: str | None = None
    tool_calls: list[dict[str, Any]] = field(default_factory=list)
    input_tokens: int | None = None
    output_tokens: int = DEFAULT_OUTPUT_TOKENS
    cached_tokens: int = 0
    #: Streamed, the text comes word by word, this many seconds apart (0: in one chunk), so that a test can
    #: kill a run while its answer is still arriving.
    stream_pause: float = 0.0

    @classmethod
    def parse(cls, raw: dict[str, Any]) -> Turn:
        unknown = set(raw) - {"text", "tool_calls", "input_tokens", "output_tokens", "cached_tokens", "stream_pause"}
        if unknown:
            raise ValueError(f"script turn has unknown keys {sorted(unknown)}: {raw}")
        if ("text" in raw) == ("tool_calls" in raw):
            raise ValueError(f"a script turn needs exactly one of 'text' or 'tool_calls': {raw}")
        return cls(**raw)


@dataclass
class Answer:
    """The server's answer to one request: its status, body and extra headers; streamed, its turn's pause."""

    status: int
    body: dict[str, Any]
    headers: dict[str, str] = field(default_factory=dict)
    stream_pause: float = 0.0


class LLMServer:
    """The server; binds ``host`` (loopback, or the real node's bridge address so pods reach it) on a free
    port (or ``port``)."""

    def __init__(self, script: list[Turn], *, repeat_last: bool = False, port: int = 0,
                 host: str = "127.0.0.1", tokens_per_minute: int | None = None) -> None:
        if not script:
            raise ValueError("the script needs at least one turn")
        self.script = script
        #: Past the script, answer with its last turn again (a runaway agent that never stops).
        self.repeat_last = repeat_last
        self.requests: list[dict[str, Any]] = []
        self.hold_turn: int | None = None
        self.tokens_per_minute = tokens_per_minute
        self._buckets: dict[str, tuple[float, float]] = {}  # model -> (tokens left, when)
        self._released = threading.Event()
        self._cond = threading.Condition()
        self.host = host
        self._httpd = ThreadingHTTPServer((host, port), self._handler())
        self._httpd.daemon_threads = True
        self._thread: threading.Thread | None = None

    # --- lifecycle ------------------------------------------------------------------
    @property
    def port(self) -> int:
        return int(self._httpd.server_address[1])

    @property
    def openai_base_url(self) -> str:
        return f"http://{self.host}:{self.port}/v1"

    @property
    def anthropic_base_url(self) -> str:
        return f"http://{self.host}:{self.port}"

    def start(self) -> LLMServer:
        self._thread = threading.Thread(target=self._httpd.serve_forever, name="llm-server", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        self._released.set()
        self._httpd.shutdown()
        self._httpd.server_close()

    def __enter__(self) -> LLMServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # --- for tests ------------------------------------------------------------------
    def hold(self, turn: int) -> None:
        """Answer requests for ``turn`` only after ``release()`` (a request in flight to kill)."""
        self.hold_turn = turn
        self._released.clear()

    def release(self) -> None:
        self.hold_turn = None
        self._released.set()

    def turns(self, api: str | None = None) -> list[int]:
        with self._cond:
            return [r["turn"] for r in self.requests if api is None or r["api"] == api]

    def wait_for(self, condition: Callable[[list[dict[str, Any]]], bool], *, timeout: float,
                 what: str) -> None:
        """Wait until ``condition(requests)`` holds; AssertionError after ``timeout`` seconds."""
        deadline = time.monotonic() + timeout
        with self._cond:
            while not condition(self.requests):
                left = deadline - time.monotonic()
                if left <= 0:
                    raise AssertionError(f"timed out after {timeout}s waiting for {what}; "
                                         f"requests so far: {self.requests}")
                self._cond.wait(left)

    # --- answering ------------------------------------------------------------------
    def _turn(self, n: int) -> Turn:
        if n < len(self.script):
            return self.script[n]
        if self.repeat_last:
            return self.script[-1]
        raise LookupError(f"the script has {len(self.script)} turns; the request is for turn {n}")

    def _log(self, entry: dict[str, Any]) -> None:
        with self._cond:
            self.requests.append(entry)
            self._cond.notify_all()

    def answer(self, api: str, body: dict[str, Any]) -> Answer:
        """The answer to ``body``."""
        messages = body.get("messages") or []
        n = sum(1 for m in messages if m.get("role") == "assistant")
        self._log({"api": api, "turn": n, "model": body.get("model"), "messages": len(messages),
                   "tool_results": _tool_results(api, messages), "at": time.time()})
        if self.hold_turn == n:
            self._released.wait(timeout=120)
        try:
            turn = self._turn(n)
        except LookupError as e:
            return Answer(400, _error(api, str(e)))
        usage_in = turn.input_tokens if turn.input_tokens is not None else DEFAULT_INPUT_TOKENS + 100 * n
        refused = self._over_limit(str(body.get("model")), usage_in + turn.output_tokens)
        if refused is not None:
            return refused
        respond = _openai_response if api == "openai" else _anthropic_response
        return Answer(200, respond(body, n, turn, usage_in), stream_pause=turn.stream_pause)

    def _over_limit(self, model: str, tokens: int) -> Answer | None:
        """The 429 a provider would answer when ``model``'s bucket cannot take ``tokens`` now; else charge it."""
        limit = self.tokens_per_minute
        if limit is None:
            return None
        with self._cond:
            now = time.monotonic()
            left, then = self._buckets.get(model, (float(limit), now))
            left = min(float(limit), left + (now - then) * limit / 60)
            if left < tokens:
                self._buckets[model] = (left, now)
                wait = math.ceil((tokens - left) / (limit / 60))
                self.requests[-1]["status"] = 429
                headers = {"retry-after": str(wait), "x-ratelimit-limit-tokens": str(limit),
                           "x-ratelimit-remaining-tokens": str(int(left)), "x-ratelimit-reset-tokens": f"{wait}s"}
                return Answer(429, {"error": {"message": f"Rate limit reached for {model}: limit {limit} tokens "
                                              "per min", "type": "tokens", "code": "rate_limit_exceeded"}}, headers)
            self._buckets[model] = (left - tokens, now)
        return None

    def _handler(self) -> type[BaseHTTPRequestHandler]:
        server = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                length = int(self.headers.get("content-length") or 0)
                try:
                    body = json.loads(self.rfile.read(length) or b"{}")
                except ValueError:
                    self._send(400, {"error": {"message": "body is not JSON"}})
                    return
                path = self.path.split("?", 1)[0]
                if path.endswith("/chat/completions"):
                    got = server.answer("openai", body)
                    if body.get("stream") and got.status == 200:
                        usage = bool((body.get("stream_options") or {}).get("include_usage"))
                        self._stream(_openai_chunks(got.body, usage, by_word=got.stream_pause > 0), got.stream_pause,
                                     openai=True)
                    else:
                        self._send(got.status, got.body, got.headers)
                elif path.endswith("/messages"):
                    got = server.answer("anthropic", body)
                    if body.get("stream") and got.status == 200:
                        self._stream(_anthropic_events(got.body, by_word=got.stream_pause > 0), got.stream_pause)
                    else:
                        self._send(got.status, got.body, got.headers)
                else:
                    self._send(404, {"error": {"message": f"no such endpoint {path}"}})

            def _send(self, status: int, payload: dict[str, Any], headers: dict[str, str] | None = None) -> None:
                data = json.dumps(payload).encode()
                try:
                    self.send_response(status)
                    for name, value in (headers or {}).items():
                        self.send_header(name, value)
                    self.send_header("content-type", "application/json")
                    self.send_header("content-length", str(len(data)))
                    self.end_headers()
                    self.wfile.write(data)
                except OSError:
                    pass  # the client was killed while its request was held

            def _stream(self, events: list[dict[str, Any]], pause: float, openai: bool = False) -> None:
                if openai:  # data lines only, ended by [DONE]
                    parts = [f"data: {json.dumps(e)}\n\n".encode() for e in events] + [b"data: [DONE]\n\n"]
                else:
                    parts = [f"event: {e['type']}\ndata: {json.dumps(e)}\n\n".encode() for e in events]
                try:
                    self.send_response(200)
                    self.send_header("content-type", "text/event-stream")
                    if not pause:
                        self.send_header("content-length", str(sum(map(len, parts))))
                    self.end_headers()  # paced: no length, the answer ends when the connection closes (HTTP/1.0)
                    for part in parts:
                        self.wfile.write(part)
                        if pause:
                            self.wfile.flush()
                            time.sleep(pause)
                except OSError:
                    pass  # the client was killed mid-stream

            def log_message(self, format: str, *args: Any) -> None:
                pass

        return Handler


def _error(api: str, message: str) -> dict[str, Any]:
    if api == "anthropic":
        return {"type": "error", "error": {"type": "invalid_request_error", "message": message}}
    return {"error": {"message": message, "type": "invalid_request_error"}}


def _tool_results(api: str, messages: list[dict[str, Any]]) -> list[str]:
    """The tool results the request carries (to check what a tool returned)."""
    out: list[str] = []
    for m in messages:
        if api == "openai" and m.get("role") == "tool":
            out.append(str(m.get("content")))
        elif api == "anthropic" and isinstance(m.get("content"), list):
            out += [str(c.get("content")) for c in m["content"] if c.get("type") == "tool_result"]
    return out


def _openai_response(body: dict[str, Any], n: int, turn: Turn, usage_in: int) -> dict[str, Any]:
    message: dict[str, Any] = {"role": "assistant", "content": turn.text}
    if turn.tool_calls:
        message["tool_calls"] = [
            {"id": f"call_{n}_{i}", "type": "function",
             "function": {"name": c["name"], "arguments": json.dumps(c.get("args", {}))}}
            for i, c in enumerate(turn.tool_calls)]
    return {
        "id": f"chatcmpl-{n}", "object": "chat.completion", "created": 1_700_000_000 + n,
        "model": body.get("model", "unknown"),
        "choices": [{"index": 0, "message": message,
                     "finish_reason": "tool_calls" if turn.tool_calls else "stop"}],
        "usage": {"prompt_tokens": usage_in, "completion_tokens": turn.output_tokens,
                  "total_tokens": usage_in + turn.output_tokens,
                  "prompt_tokens_details": {"cached_tokens": turn.cached_tokens}},
    }


def _anthropic_response(body: dict[str, Any], n: int, turn: Turn, usage_in: int) -> dict[str, Any]:
    content: list[dict[str, Any]] = []
    if turn.text is not None:
        content.append({"type": "text", "text": turn.text})
    content += [{"type": "tool_use", "id": f"toolu_{n}_{i}", "name": c["name"], "input": c.get("args", {})}
                for i, c in enumerate(turn.tool_calls)]
    return {
        "id": f"msg_{n}", "type": "message", "role": "assistant", "model": body.get("model", "unknown"),
        "content": content, "stop_reason": "tool_use" if turn.tool_calls else "end_turn",
        "stop_sequence": None,
        # Anthropic counts cache reads apart from input_tokens (OpenAI counts them inside).
        "usage": {"input_tokens": usage_in - turn.cached_tokens, "output_tokens": turn.output_tokens,
                  "cache_read_input_tokens": turn.cached_tokens, "cache_creation_input_tokens": 0},
    }


def _words(text: str | None, by_word: bool) -> list[str | None]:
    """The pieces a streamed ``text`` comes in: word by word (each with the spaces after it), or whole."""
    return re.findall(r"\S+\s*|\s+", text) if by_word and text else [text]


def _openai_chunks(completion: dict[str, Any], include_usage: bool, by_word: bool = False) -> list[dict[str, Any]]:
    """A whole chat completion as OpenAI's stream of chunks: its usage only in a last chunk with no choices, and
    only when the request asked for it (``stream_options.include_usage``), as OpenAI does."""
    head = {k: completion[k] for k in ("id", "created", "model")} | {"object": "chat.completion.chunk"}
    choice, message = completion["choices"][0], completion["choices"][0]["message"]
    first, *rest = _words(message.get("content"), by_word)
    delta: dict[str, Any] = {"role": "assistant", "content": first}
    if message.get("tool_calls"):
        delta["tool_calls"] = [{"index": i, **call} for i, call in enumerate(message["tool_calls"])]
    chunks = [head | {"choices": [{"index": 0, "delta": delta, "finish_reason": None}]}]
    chunks += [head | {"choices": [{"index": 0, "delta": {"content": word}, "finish_reason": None}]} for word in rest]
    chunks += [head | {"choices": [{"index": 0, "delta": {}, "finish_reason": choice["finish_reason"]}]}]
    if include_usage:
        chunks.append(head | {"choices": [], "usage": completion["usage"]})
    return chunks


def _anthropic_events(message: dict[str, Any], by_word: bool = False) -> list[dict[str, Any]]:
    """A whole message as Anthropic's server-sent events (clients that always stream, like pydantic-ai's)."""
    usage = message["usage"]
    start = {**message, "content": [], "stop_reason": None, "usage": {**usage, "output_tokens": 1}}
    events: list[dict[str, Any]] = [{"type": "message_start", "message": start}]
    for i, block in enumerate(message["content"]):
        if block["type"] == "text":
            events.append({"type": "content_block_start", "index": i, "content_block": {"type": "text", "text": ""}})
            events += [{"type": "content_block_delta", "index": i, "delta": {"type": "text_delta", "text": word}}
                       for word in _words(block["text"], by_word)]
        else:
            events += [{"type": "content_block_start", "index": i,
                        "content_block": {**block, "input": {}}},
                       {"type": "content_block_delta", "index": i,
                        "delta": {"type": "input_json_delta", "partial_json": json.dumps(block["input"])}}]
        events.append({"type": "content_block_stop", "index": i})
    events += [{"type": "message_delta", "delta": {"stop_reason": message["stop_reason"], "stop_sequence": None},
                "usage": {"output_tokens": usage["output_tokens"]}},
               {"type": "message_stop"}]
    return events


def load_script(path: str) -> tuple[list[Turn], bool]:
    """A script file: {"turns": [...], "repeat_last": false}."""
    with open(path) as f:
        raw = json.load(f)
    return [Turn.parse(t) for t in raw["turns"]], bool(raw.get("repeat_last", False))


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="python -m durablerun_testbed llm-server",
                                     description=__doc__.split("\n\n")[0])
    parser.add_argument("--script", required=True, help='JSON file: {"turns": [...], "repeat_last": false}')
    parser.add_argument("--port", type=int, default=8931)
    parser.add_argument("--host", default="127.0.0.1",
                        help="the address to listen on (the sandbox's bridge address, for pods on its real node)")
    args = parser.parse_args(argv)
    turns, repeat = load_script(args.script)
    server = LLMServer(turns, repeat_last=repeat, port=args.port, host=args.host).start()
    print(f"OpenAI base URL {server.openai_base_url}, Anthropic base URL {server.anthropic_base_url}; "
          "Ctrl-C stops", flush=True)
    try:
        threading.Event().wait()
    except KeyboardInterrupt:
        pass
    finally:
        server.stop()
    return 0
