"""The ``durablerun`` command's arguments: the parser, and reading JSON, durations and policy flags.

``Parser`` and ``UsageError`` are shared with ``kubectl durablerun`` (``durablerun._private.tools.kubectl``): a bad
argument ends either command with its usage and exit code 2.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from decimal import Decimal, InvalidOperation
from typing import Any, NoReturn

from durablerun import api
from durablerun._version import __version__

DEFAULT_STORE = "file://./.durablerun"
#: ``inspect --store``'s default: the DurableRun's own spec.checkpoint.uri (with --kubernetes).
FROM_RUN = "<from the run>"


class UsageError(Exception):
    """A bad argument: the command prints it and exits 2."""


class Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:
        self.print_usage(sys.stderr)
        raise UsageError(message)


def store_args(p: argparse.ArgumentParser, *, run_id: bool = True, default_store: str | None = None) -> None:
    if run_id:
        p.add_argument("--run-id", required=True,
                       help="the run's id; the run lives under <store>/_local/<run-id>/")
    p.add_argument("--store", default=default_store or os.environ.get(api.Env.STORE, DEFAULT_STORE),
                   help="s3://bucket/prefix, file:///path or memory://name "
                        f"(default ${api.Env.STORE} or {DEFAULT_STORE})")
    p.add_argument("--endpoint-url", help="S3-compatible endpoint, e.g. http://127.0.0.1:9000")
    p.add_argument("--region", help="S3 region")


def kubernetes_run_args(p: argparse.ArgumentParser) -> None:
    """``--run-id ID`` (a local run) or ``--kubernetes NAMESPACE/NAME`` (a DurableRun's journal), and the store."""
    which = p.add_mutually_exclusive_group(required=True)
    which.add_argument("--run-id", help="a local run: <store>/_local/<run-id>/")
    which.add_argument("--kubernetes", metavar="NAMESPACE/NAME",
                       help="a DurableRun: its store and uid are read through your kubeconfig; the "
                            "store is read with your own credentials (AWS_* or --store/--endpoint-url)")
    # No default: a DurableRun's store is its spec.checkpoint.uri unless --store overrides it.
    store_args(p, run_id=False, default_store=FROM_RUN)
    p.add_argument("--context", help="kubeconfig context (with --kubernetes)")


def stream_args(p: argparse.ArgumentParser) -> None:
    """How ``durablerun stream`` and ``kubectl durablerun stream`` read a stream."""
    p.add_argument("-f", "--follow", action="store_true",
                   help="keep reading as the run writes; ends once the run has finished and the stream is read")
    p.add_argument("--from", dest="from_offset", type=int, default=0, metavar="OFFSET",
                   help="start at this offset (each chunk has one; what a read ends at: no gap, no duplicate)")
    p.add_argument("--final", action="store_true",
                   help="only the chunks of the step tries that were journaled: never what a later try "
                        "superseded (a step's chunks show once it is journaled)")
    p.add_argument("--json", action="store_true", help="one JSON object per chunk: offset, standing, step, text")


def run_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--input", help="JSON input, or @file.json (default: the stored input "
                                   "of an existing run, else {})")
    p.add_argument("--max-cost", metavar="USD",
                   help="cost ceiling in US dollars, e.g. 5.00 ('none': no ceiling)")
    p.add_argument("--max-tokens", metavar="N", help="token budget ('none': no limit)")
    p.add_argument("--max-steps", metavar="N", help="step budget ('none': no limit)")
    p.add_argument("--ask-at-cost", metavar="USD",
                   help="stop before the next step at this cost and exit Waiting until resumed with a higher one "
                        "('none': never ask)")
    p.add_argument("--ask-at-tokens", metavar="N", help="the same for tokens ('none': never ask)")
    p.add_argument("--max-duration", metavar="DURATION",
                   help="wall time since the first start, e.g. 8h (default 8h)")
    p.add_argument("--max-retries", metavar="N",
                   help="default retries of a failing step (default 3)")
    p.add_argument("--progress-timeout", metavar="DURATION",
                   help="abort when no step completes for this long (default 10m)")
    p.add_argument("--snapshot-every", type=int, metavar="N", default=100,
                   help="snapshot every N journal records (default 100)")
    p.add_argument("--max-result-bytes", type=int, metavar="N",
                   help="hard limit of a step result (default 64 MiB)")
    p.add_argument("--retry-initial", metavar="DURATION",
                   help="first delay between step retries (default 1s)")
    p.add_argument("--json-log", metavar="FILE",
                   help="also write progress events as JSON lines to FILE ('-' = stderr)")
    p.add_argument("--quiet", action="store_true", help="no progress display")
    p.add_argument("--follow", action="store_true",
                   help="stay through durable sleeps and waits: poll the store here, and resume once the wake "
                        "time passes or the event is sent (no manual resume)")


def build_parser() -> argparse.ArgumentParser:
    parser = Parser(prog="durablerun", description="Run durable workflows locally.")
    parser.add_argument("--version", action="version", version=f"durablerun {__version__}")
    sub = parser.add_subparsers(dest="command", required=True, parser_class=Parser)

    run = sub.add_parser("run", help="run a workflow: start the run, or resume it if it exists")
    run.add_argument("workflow", metavar="MODULE:FUNC", help="the async workflow function")
    store_args(run)
    run_args(run)

    resume = sub.add_parser("resume", help="resume an existing run (an unknown run id is an error)")
    resume.add_argument("workflow", metavar="MODULE:FUNC", nargs="?",
                        help="the async workflow function (default: the one the run started with)")
    store_args(resume)
    run_args(resume)

    rerun = sub.add_parser("rerun", help="run a run again from a step: drop its journal from the step's first "
                                         "record on (archived first), then resume it")
    store_args(rerun)
    rerun.add_argument("--from", dest="from_step", required=True, metavar="STEP",
                       help="the step's name, as `durablerun inspect` shows it")
    run_args(rerun)
    rerun.set_defaults(workflow=None)

    fork = sub.add_parser("fork", help="start a new run whose journal is a copy of this run's before a step")
    store_args(fork)
    fork.add_argument("--from", dest="from_step", required=True, metavar="STEP",
                      help="the first step the fork executes itself, as `durablerun inspect` shows it")
    fork.add_argument("--to", required=True, metavar="NEW_RUN_ID", help="the new run's id (must not exist)")
    run_args(fork)
    fork.set_defaults(workflow=None)

    retry = sub.add_parser("retry", help="retry a Failed or Aborted run after a fix: its failed steps run again, "
                                         "its completed ones replay")
    retry.add_argument("workflow", metavar="MODULE:FUNC", nargs="?",
                       help="the async workflow function (default: the one the run started with)")
    store_args(retry)
    run_args(retry)

    send = sub.add_parser("send-event", help="send an event to a run (first write wins)")
    store_args(send)
    send.add_argument("name", help="event name")
    send.add_argument("payload", nargs="?", default="null", help="JSON payload or @file")

    inspect = sub.add_parser("inspect", help="show a run's journal, cost, state and result")
    kubernetes_run_args(inspect)
    inspect.add_argument("--result", action="store_true",
                         help="print the completed run's result (its full JSON) and nothing else")
    inspect.add_argument("--json", action="store_true", help="machine-readable output")
    inspect.add_argument("--all", action="store_true",
                         help="every generation's records, not only the current one's (reads "
                              "the whole journal: one object per record on S3)")

    replay = sub.add_parser("replay", help="check today's code against a run's journal: replays it, executing "
                                          "nothing (exit 0 replays cleanly, 1 diverges, 3 the code raised)")
    replay.add_argument("workflow", metavar="MODULE:FUNC", help="the async workflow function to check")
    kubernetes_run_args(replay)
    replay.add_argument("--json", action="store_true", help="machine-readable output")

    stream = sub.add_parser("stream", help="print a run's output stream (ctx.stream): what its steps wrote, live "
                                           "with --follow (docs/sdk.md, 'Output streams')")
    stream.add_argument("name", nargs="?", help="the stream's name (default: the run's only stream)")
    kubernetes_run_args(stream)
    stream_args(stream)

    runs = sub.add_parser("list", help="list the local runs in a store")
    store_args(runs, run_id=False)
    runs.add_argument("--json", action="store_true", help="machine-readable output")

    delete = sub.add_parser("delete", help="delete a local run and everything it stored")
    store_args(delete)

    timeline = sub.add_parser("timeline",
                              help="draw a local run's steps, waits and restarts over time from its journal")
    store_args(timeline)
    timeline.add_argument("-o", "--output", choices=["text", "json"], default="text", help="json: for scripts")

    logs = sub.add_parser("logs", help="print an attempt's stdout and stderr as its pod stored them in the run's "
                                       "store (a DurableRun's, by --kubernetes or its spec.checkpoint.runId)")
    kubernetes_run_args(logs)
    logs.add_argument("--attempt", type=int, help="the attempt (the pod's epoch); without it, list the attempts "
                                                  "whose logs are kept")

    sub.add_parser("pod", help="the in-pod runner entrypoint", add_help=False)
    return parser


def json_arg(flag: str, text: str) -> Any:
    if text.startswith("@"):
        try:
            with open(text[1:], encoding="utf-8") as f:
                text = f.read()
        except OSError as e:
            raise UsageError(f"{flag}: cannot read {text[1:]!r}: {e.strerror}") from e
    try:
        return json.loads(text)
    except ValueError as e:
        raise UsageError(
            f"{flag}: not valid JSON ({e}); quote it for the shell, e.g. "
            f"{flag} '{{\"topic\": \"x\"}}', or pass @file.json"
        ) from e


def duration_arg(flag: str, text: str | None) -> str | None:
    if text is None:
        return None
    try:
        api.parse_duration(text)
    except ValueError as e:
        raise UsageError(f"{flag}: {e}") from e
    return text


def trace_url_template(text: str) -> str:
    """--trace-url's value: an http(s) URL with {traceID} in it."""
    if not text.startswith(("http://", "https://")) or "{traceID}" not in text:
        raise argparse.ArgumentTypeError(f"{text!r} is not an http(s) URL with {{traceID}} in it, e.g. "
                                         "http://localhost:16686/trace/{traceID}")
    return text


#: The flag that sets each policy field.
POLICY_FLAGS = {"costCeilingUSD": "--max-cost", "maxTokens": "--max-tokens",
                "askAt.costUSD": "--ask-at-cost", "askAt.tokens": "--ask-at-tokens",
                "maxSteps": "--max-steps", "maxDuration": "--max-duration",
                "progressTimeout": "--progress-timeout", "maxRetries": "--max-retries"}
NO_LIMIT = "none"


def policy_flags(args: argparse.Namespace) -> dict[str, Any]:
    """The policy fields the command line sets (``none`` lifts a budget)."""
    fields: dict[str, Any] = {}
    for flag, name, value in (("--max-cost", "costCeilingUSD", args.max_cost),
                              ("--ask-at-cost", "askAt.costUSD", args.ask_at_cost)):
        if value is None:
            continue
        if value == NO_LIMIT:
            fields[name] = None
            continue
        try:
            if not Decimal(value).is_finite() or Decimal(value) < 0:
                raise InvalidOperation
        except InvalidOperation:
            raise UsageError(f"{flag}: {value!r} is not an amount in USD, "
                             f"e.g. {flag} 5.00 (or 'none': no limit)") from None
        fields[name] = str(Decimal(value))
    for flag, name, value, low in (("--max-tokens", "maxTokens", args.max_tokens, 0),
                                   ("--ask-at-tokens", "askAt.tokens", args.ask_at_tokens, 0),
                                   ("--max-steps", "maxSteps", args.max_steps, 1),
                                   ("--max-retries", "maxRetries", args.max_retries, 0)):
        if value is None:
            continue
        if value == NO_LIMIT and name != "maxRetries":
            fields[name] = None
            continue
        try:
            number = int(value)
        except ValueError:
            raise UsageError(f"{flag}: {value!r} is not a whole number"
                             + (" (or 'none': no limit)" if name != "maxRetries" else "")) from None
        if number < low:
            raise UsageError(f"{flag}: must be >= {low}, got {number}")
        fields[name] = number
    for flag, name, value in (("--max-duration", "maxDuration", args.max_duration),
                              ("--progress-timeout", "progressTimeout", args.progress_timeout)):
        if duration_arg(flag, value) is not None:
            fields[name] = value
    return fields
