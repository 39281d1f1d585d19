"""The ``durablerun`` command: argument parsing and the three local subcommands.

::

    durablerun run MODULE:FUNC --run-id ID [--store URI] [--input JSON|@file] [--max-cost USD] ...
    durablerun send-event --run-id ID [--store URI] NAME [JSON|@file]
    durablerun inspect --run-id ID [--store URI] [--json] [--all]
    durablerun pod [...]          # the in-pod entrypoint (durablerun.pod)

``run`` runs the workflow locally until it completes, fails, is aborted or
has to wait; re-running the same command resumes it. Exit codes follow
DESIGN.md: 0 Completed, 1 Failed, 2 usage error, 3 Aborted, 4 Waiting or
Suspended, 5 Fenced; 75 when the store could not be reached (try again).
The default store is ``file://./.durablerun``; a ``--run-id`` run lives
under ``<store>/_local/<run-id>/``.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import signal
import sys
from decimal import Decimal, InvalidOperation
from typing import Any, NoReturn

from durablerun import errors
from durablerun._private import layout
from durablerun._private.display import PlainProgress, TtyProgress
from durablerun._private.engine import EngineConfig, Run
from durablerun._private.sinks import JsonLinesSink, ProgressSink
from durablerun._private.stores import Store, open_store
from durablerun._version import __version__
from durablerun.api import Outcome, Policy, parse_duration

EXIT_STORE_UNAVAILABLE = 75
DEFAULT_STORE = "file://./.durablerun"


class _UsageError(Exception):
    pass


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:
        self.print_usage(sys.stderr)
        raise _UsageError(message)


def _store_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--run-id", required=True,
                   help="the run's id; the run lives under <store>/_local/<run-id>/")
    p.add_argument("--store", default=os.environ.get("DURABLERUN_STORE", DEFAULT_STORE),
                   help="s3://bucket/prefix, file:///path or memory://name "
                        f"(default $DURABLERUN_STORE or {DEFAULT_STORE})")
    p.add_argument("--endpoint-url", help="S3-compatible endpoint, e.g. http://127.0.0.1:9000")
    p.add_argument("--region", help="S3 region")


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="durablerun", description="Run durable workflows locally.")
    parser.add_argument("--version", action="version", version=f"durablerun {__version__}")
    sub = parser.add_subparsers(dest="command", required=True, parser_class=_Parser)

    run = sub.add_parser("run", help="run (or resume) a workflow")
    run.add_argument("workflow", metavar="MODULE:FUNC", help="the async workflow function")
    _store_args(run)
    run.add_argument("--input", help="JSON input, or @file.json (default: the stored input "
                                     "of an existing run, else {})")
    run.add_argument("--max-cost", metavar="USD", help="cost ceiling in US dollars, e.g. 5.00")
    run.add_argument("--max-tokens", type=int, metavar="N", help="token budget")
    run.add_argument("--max-steps", type=int, metavar="N", help="step budget")
    run.add_argument("--max-duration", metavar="DURATION",
                     help="wall time since the first start, e.g. 8h (default 8h)")
    run.add_argument("--max-retries", type=int, metavar="N",
                     help="default retries of a failing step (default 3)")
    run.add_argument("--progress-timeout", metavar="DURATION",
                     help="abort when no step completes for this long (default 10m)")
    run.add_argument("--snapshot-every", type=int, metavar="N", default=100,
                     help="snapshot every N journal records (default 100)")
    run.add_argument("--max-result-bytes", type=int, metavar="N",
                     help="hard limit of a step result (default 64 MiB)")
    run.add_argument("--retry-initial", metavar="DURATION",
                     help="first delay between step retries (default 1s)")
    run.add_argument("--json-log", metavar="FILE",
                     help="also write progress events as JSON lines to FILE ('-' = stderr)")
    run.add_argument("--quiet", action="store_true", help="no progress display")

    send = sub.add_parser("send-event", help="send an event to a run (first write wins)")
    _store_args(send)
    send.add_argument("name", help="event name")
    send.add_argument("payload", nargs="?", default="null", help="JSON payload or @file")

    inspect = sub.add_parser("inspect", help="show a run's journal, cost and state")
    _store_args(inspect)
    inspect.add_argument("--json", action="store_true", help="machine-readable output")
    inspect.add_argument("--all", action="store_true",
                         help="every generation's records, not only the current one's (reads "
                              "the whole journal: one object per record on S3)")

    sub.add_parser("pod", help="the in-pod runner entrypoint", add_help=False)
    return parser


def _json_arg(flag: str, text: str) -> Any:
    if text.startswith("@"):
        try:
            with open(text[1:], encoding="utf-8") as f:
                text = f.read()
        except OSError as e:
            raise _UsageError(f"{flag}: cannot read {text[1:]!r}: {e.strerror}") from e
    try:
        return json.loads(text)
    except ValueError as e:
        raise _UsageError(
            f"{flag}: not valid JSON ({e}); quote it for the shell, e.g. "
            f"{flag} '{{\"topic\": \"x\"}}', or pass @file.json"
        ) from e


def _duration_arg(flag: str, text: str | None) -> str | None:
    if text is None:
        return None
    try:
        parse_duration(text)
    except ValueError as e:
        raise _UsageError(f"{flag}: {e}") from e
    return text


def _open(args: argparse.Namespace) -> Store:
    store = open_store(args.store, endpoint_url=args.endpoint_url, region=args.region)
    return store


def _policy(args: argparse.Namespace) -> Policy:
    fields: dict[str, Any] = {}
    if args.max_cost is not None:
        try:
            if Decimal(args.max_cost) < 0:
                raise InvalidOperation
        except InvalidOperation:
            raise _UsageError(f"--max-cost: {args.max_cost!r} is not an amount in USD, "
                              "e.g. --max-cost 5.00") from None
        fields["costCeilingUSD"] = str(Decimal(args.max_cost))
    for flag, name, value, low in (("--max-tokens", "maxTokens", args.max_tokens, 0),
                                   ("--max-steps", "maxSteps", args.max_steps, 1),
                                   ("--max-retries", "maxRetries", args.max_retries, 0)):
        if value is not None:
            if value < low:
                raise _UsageError(f"{flag}: must be >= {low}, got {value}")
            fields[name] = value
    for flag, name, value in (("--max-duration", "maxDuration", args.max_duration),
                              ("--progress-timeout", "progressTimeout", args.progress_timeout)):
        if _duration_arg(flag, value) is not None:
            fields[name] = value
    return Policy(**fields)


def cmd_run(args: argparse.Namespace) -> int:
    ref = layout.RunRef.local(args.run_id)
    policy = _policy(args)
    if args.snapshot_every < 1:
        raise _UsageError("--snapshot-every: must be >= 1")
    config_fields: dict[str, Any] = {"snapshot_every": args.snapshot_every}
    if args.max_result_bytes is not None:
        if args.max_result_bytes < 1:
            raise _UsageError("--max-result-bytes: must be >= 1")
        config_fields["result_hard_limit"] = args.max_result_bytes
        config_fields["inline_result_max"] = min(256 * 1024, args.max_result_bytes)
    if args.retry_initial is not None:
        config_fields["retry_initial"] = parse_duration(
            _duration_arg("--retry-initial", args.retry_initial) or "1s")
    store = _open(args)
    if args.input is not None:
        input_value = _json_arg("--input", args.input)
    else:
        rs = store.run_store(ref)
        try:
            store.check()
            manifest = rs.read_manifest()
        finally:
            rs.close()
        input_value = manifest.get("input", {}) if manifest else {}
    sinks: list[ProgressSink] = []
    if not args.quiet:
        sinks.append(TtyProgress() if sys.stderr.isatty() else PlainProgress())
    if args.json_log:
        sinks.append(JsonLinesSink(None if args.json_log == "-" else args.json_log))
    sys.path.insert(0, os.getcwd())
    run = Run(store=store, run=ref, workflow=args.workflow, input=input_value, policy=policy,
              sinks=sinks, config=EngineConfig(**config_fields))

    def on_signal(signum: int, _frame: Any) -> None:
        # A raw write: the display may be inside a buffered write to stderr right now,
        # and re-entering a buffered stream from a signal handler raises.
        with contextlib.suppress(OSError):
            os.write(2, f"\ndurablerun: {signal.Signals(signum).name}: stopping at the next "
                        "step boundary (send it again to stop at once)\n".encode())
        run.request_stop()
        signal.signal(signum, signal.SIG_DFL)

    previous = {sig: signal.signal(sig, on_signal) for sig in (signal.SIGTERM, signal.SIGINT)}
    try:
        result = run.run_attempt()
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    label = result.outcome.value
    if result.abort_reason is not None:
        label += f" ({result.abort_reason.value})"
    print(f"durablerun: {label}: {result.message}", file=sys.stderr)
    if result.outcome == Outcome.COMPLETED:
        print(json.dumps(result.result, indent=2, default=str))
    elif result.outcome == Outcome.WAITING:
        w = result.waiting
        if w and w.event:
            print(f"durablerun: send it with: durablerun send-event --run-id {args.run_id} "
                  f"--store {args.store} {w.event} '<json>'  and run this command again",
                  file=sys.stderr)
        elif w and w.wake_time:
            print(f"durablerun: run this command again after {w.wake_time.isoformat()}",
                  file=sys.stderr)
    elif result.outcome in (Outcome.ABORTED, Outcome.SUSPENDED):
        print("durablerun: run this command again to resume", file=sys.stderr)
    return result.exit_code


def cmd_send_event(args: argparse.Namespace) -> int:
    ref = layout.RunRef.local(args.run_id)
    layout.check_event_name(args.name)
    payload = _json_arg("payload", args.payload)
    store = _open(args)
    store.check()
    won = store.put_event(run=ref, name=args.name, payload=payload)
    info = store.read_run(run=ref)
    if won:
        print(f"event {args.name!r} stored for run {ref}")
    else:
        print(f"event {args.name!r} was already sent to run {ref}; this payload was ignored "
              "(first write wins)")
    waiting = (info.status or {}).get("waitingFor") or {}
    if (info.status or {}).get("outcome") == "Waiting" and waiting.get("event") == args.name:
        print(f"run {ref} is waiting for it: run it again to deliver it")
    elif not info.exists:
        print(f"no run {ref} has started yet; it will get the event when it waits for it")
    return 0


def _fmt_time(at: Any) -> str:
    if not at:
        return "-"
    from datetime import UTC, datetime

    return datetime.fromtimestamp(float(at), UTC).strftime("%H:%M:%S.%f")[:-3]


def cmd_inspect(args: argparse.Namespace) -> int:
    return inspect_run(_open(args), layout.RunRef.local(args.run_id), as_json=args.json, show_all=args.all)


def inspect_run(store: Store, ref: layout.RunRef, *, as_json: bool = False, show_all: bool = False) -> int:
    """Print a run's journal as `durablerun inspect` does (also `kubectl durablerun journal`)."""
    store.check()
    info = store.read_run(run=ref)
    if not info.exists:
        print(f"no run {ref} in {store.uri}", file=sys.stderr)
        return 1
    rs = store.run_store(ref)
    try:
        loaded = rs.load()
        records = rs.read_all() if show_all else loaded.records
    finally:
        rs.close()
    cont = loaded.continuation
    generation = int(cont.data.get("gen", 0)) if cont is not None else 0
    rows = []
    for r in records:
        d = r.data
        cost = d.get("cost") or {}
        row: dict[str, Any] = {"seq": r.seq, "position": d.get("pos"), "kind": d.get("kind"),
               "name": d.get("name"), "ok": d.get("ok"), "attempts": d.get("attempts"),
               "duration": d.get("dur"), "at": d.get("at"), "usd": cost.get("usd"),
               "tokens": cost.get("tokens"), "ref": d.get("ref"),
               "error": (d.get("error") or {}).get("message")}
        if r.kind == "continue":
            row["generation"] = d.get("gen")
        rows.append(row)
    status = info.status or {}
    if as_json:
        print(json.dumps({
            "run": info.run, "store": store.describe(), "manifest": info.manifest,
            "totals": info.totals.to_json(), "journalRecords": info.journal_records,
            "snapshotSeq": info.snapshot_seq, "completed": info.completed,
            "generation": generation, "generationStart": loaded.base,
            "status": status, "events": info.events, "records": rows,
        }, indent=2, default=str))
        return 0
    m = info.manifest
    print(f"run       {info.run}   ({store.uri})")
    print(f"workflow  {m.get('workflow')}   code {m.get('code_version')}   "
          f"started {m.get('created')}")
    print(f"outcome   {status.get('outcome', '-')}: {status.get('message', '')}")
    w = status.get("waitingFor")
    if status.get("outcome") == "Waiting" and w:
        if w.get("event"):
            print(f"waiting   for event {w['event']!r} since {w.get('since')} "
                  f"(deadline {w.get('deadline') or 'none'})")
        else:
            print(f"waiting   until {w.get('wakeTime')}")
    t = info.totals
    print(f"totals    ${t.usd}   {t.tokens} tokens   {t.steps} steps   "
          f"{info.journal_records} journal records   snapshot at "
          f"{info.snapshot_seq if info.snapshot_seq is not None else '-'}")
    if generation:
        shown = ("all records below" if show_all else
                 f"records {loaded.base}.. below; --all shows the earlier ones")
        print(f"generation {generation} (ctx.continue_as_new {generation} time(s)); it starts "
              f"at record {loaded.base}: {shown}")
    if info.events:
        print(f"events    {', '.join(info.events)}")
    print()
    names = []
    for row in rows:
        name = str(row["name"] or "")
        if row.get("generation"):
            name += f" -> generation {row['generation']}"
        if row["ref"]:
            name += f" [ref {row['ref']['size']:,}B]"
        names.append(name if len(name) <= 60 else name[:57] + "...")
    width = max([4, *map(len, names)])
    pos_width = max([3, *(len(str(row["position"])) for row in rows)])
    header = (f"{'seq':>5} {'pos':<{pos_width}} {'kind':<8} {'name':<{width}} {'ok':<4} "
              f"{'tries':>5} {'secs':>8} {'usd':>9} {'at (UTC)':<12}")
    print(header)
    print("-" * len(header))
    for row, name in zip(rows, names, strict=True):
        ok = {True: "yes", False: "NO", None: ""}[row["ok"]]
        dur = f"{row['duration']:.3f}" if isinstance(row["duration"], int | float) else ""
        print(f"{row['seq']:>5} {row['position']!s:<{pos_width}} {row['kind']!s:<8} "
              f"{name:<{width}} {ok:<4} {row['attempts'] or '':>5} {dur:>8} "
              f"{row['usd'] or '':>9} {_fmt_time(row['at']):<12}")
        if row["error"]:
            print(f"{'':>15}error: {row['error'][:100]}")
    return 0


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv and argv[0] == "pod":
        try:
            from durablerun import pod  # type: ignore[attr-defined,unused-ignore]
        except ImportError as e:
            print(f"durablerun pod: the in-pod runner (durablerun.pod) is not available in "
                  f"this installation: {e}", file=sys.stderr)
            return 2
        return int(pod.main(argv[1:]))
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
        handler = {"run": cmd_run, "send-event": cmd_send_event,
                   "inspect": cmd_inspect}[args.command]
        return handler(args)
    except _UsageError as e:
        print(f"durablerun: error: {e}", file=sys.stderr)
        return Outcome.USAGE_ERROR.exit_code
    except errors.ConfigError as e:
        print(f"durablerun: error: {e}", file=sys.stderr)
        return Outcome.USAGE_ERROR.exit_code
    except errors.StoreUnavailableError as e:
        print(f"durablerun: the store is unavailable, try again: {e}", file=sys.stderr)
        return EXIT_STORE_UNAVAILABLE
    except errors.StoreError as e:
        print(f"durablerun: store error: {e}", file=sys.stderr)
        return Outcome.FAILED.exit_code


if __name__ == "__main__":
    sys.exit(main())
