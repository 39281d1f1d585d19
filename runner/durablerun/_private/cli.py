"""The ``durablerun`` command: argument parsing and the local subcommands.

::

    durablerun run MODULE:FUNC --run-id ID [--store URI] [--input JSON|@file] [--max-cost USD] ...
    durablerun resume [MODULE:FUNC] --run-id ID [--store URI] [--max-cost USD] ...
    durablerun send-event --run-id ID [--store URI] NAME [JSON|@file]
    durablerun inspect (--run-id ID | --kubernetes NAMESPACE/NAME) [--store URI] [--json] [--all] [--result]
    durablerun list [--store URI] [--json]
    durablerun delete --run-id ID [--store URI]
    durablerun timeline --run-id ID [--store URI] [--output json]
    durablerun pod [...]          # the in-pod entrypoint (durablerun.pod)

``run`` runs the workflow locally until it completes, fails, is aborted or
has to wait; re-running the same command resumes it. ``resume`` does the
same for a run that exists and refuses an unknown run id. Exit codes follow
docs/design.md: 0 Completed, 1 Failed, 2 usage error, 3 Aborted, 4 Waiting or
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
from collections.abc import Callable
from datetime import UTC, datetime
from decimal import Decimal, InvalidOperation
from typing import Any, NoReturn

from durablerun import api, errors
from durablerun._private import layout, timeline, tracing
from durablerun._private.display import PlainProgress, TtyProgress
from durablerun._private.engine import EngineConfig, Run
from durablerun._private.journal import RunStore
from durablerun._private.model import (
    CompleteRecord,
    ContinueRecord,
    EventRecord,
    ResultRecord,
    StepRecord,
)
from durablerun._private.owner import HeldElsewhere, Holder, OwnerLease, read_owner
from durablerun._private.sinks import JsonLinesSink, ProgressSink
from durablerun._private.stores import RunInfo, Store, open_store, store_from_checkpoint
from durablerun._version import __version__
from durablerun.api import AbortReason, Outcome, Policy, parse_duration, parse_time

EXIT_STORE_UNAVAILABLE = 75
_FROM_RUN = "<from the run>"
EXIT_BROKEN_PIPE = 141  # 128 + SIGPIPE, what a shell reports for a command whose reader left
DEFAULT_STORE = "file://./.durablerun"


class _UsageError(Exception):
    pass


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:
        self.print_usage(sys.stderr)
        raise _UsageError(message)


def _store_args(p: argparse.ArgumentParser, *, run_id: bool = True,
                default_store: str | None = None) -> None:
    if run_id:
        p.add_argument("--run-id", required=True,
                       help="the run's id; the run lives under <store>/_local/<run-id>/")
    p.add_argument("--store", default=default_store or os.environ.get("DURABLERUN_STORE", DEFAULT_STORE),
                   help="s3://bucket/prefix, file:///path or memory://name "
                        f"(default $DURABLERUN_STORE or {DEFAULT_STORE})")
    p.add_argument("--endpoint-url", help="S3-compatible endpoint, e.g. http://127.0.0.1:9000")
    p.add_argument("--region", help="S3 region")


def _run_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--input", help="JSON input, or @file.json (default: the stored input "
                                   "of an existing run, else {})")
    p.add_argument("--max-cost", metavar="USD",
                   help="cost ceiling in US dollars, e.g. 5.00 ('none': no ceiling)")
    p.add_argument("--max-tokens", metavar="N", help="token budget ('none': no limit)")
    p.add_argument("--max-steps", metavar="N", help="step budget ('none': no limit)")
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


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="durablerun", description="Run durable workflows locally.")
    parser.add_argument("--version", action="version", version=f"durablerun {__version__}")
    sub = parser.add_subparsers(dest="command", required=True, parser_class=_Parser)

    run = sub.add_parser("run", help="run a workflow: start the run, or resume it if it exists")
    run.add_argument("workflow", metavar="MODULE:FUNC", help="the async workflow function")
    _store_args(run)
    _run_args(run)

    resume = sub.add_parser("resume", help="resume an existing run (an unknown run id is an error)")
    resume.add_argument("workflow", metavar="MODULE:FUNC", nargs="?",
                        help="the async workflow function (default: the one the run started with)")
    _store_args(resume)
    _run_args(resume)

    send = sub.add_parser("send-event", help="send an event to a run (first write wins)")
    _store_args(send)
    send.add_argument("name", help="event name")
    send.add_argument("payload", nargs="?", default="null", help="JSON payload or @file")

    inspect = sub.add_parser("inspect", help="show a run's journal, cost, state and result")
    which = inspect.add_mutually_exclusive_group(required=True)
    which.add_argument("--run-id", help="a local run: <store>/_local/<run-id>/")
    which.add_argument("--kubernetes", metavar="NAMESPACE/NAME",
                       help="a DurableRun: its store and uid are read through your kubeconfig; the "
                            "store is read with your own credentials (AWS_* or --store/--endpoint-url)")
    # No default: a DurableRun's store is its spec.checkpoint.uri unless --store overrides it.
    _store_args(inspect, run_id=False, default_store=_FROM_RUN)
    inspect.add_argument("--context", help="kubeconfig context (with --kubernetes)")
    inspect.add_argument("--result", action="store_true",
                         help="print the completed run's result (its full JSON) and nothing else")
    inspect.add_argument("--json", action="store_true", help="machine-readable output")
    inspect.add_argument("--all", action="store_true",
                         help="every generation's records, not only the current one's (reads "
                              "the whole journal: one object per record on S3)")

    runs = sub.add_parser("list", help="list the local runs in a store")
    _store_args(runs, run_id=False)
    runs.add_argument("--json", action="store_true", help="machine-readable output")

    delete = sub.add_parser("delete", help="delete a local run and everything it stored")
    _store_args(delete)

    sub.add_parser("pod", help="the in-pod runner entrypoint", add_help=False)
    _timeline_args(sub)
    return parser


# --- timeline: the rendering is timeline.py's ----------------------------------------------
def _timeline_args(sub: Any) -> None:
    p = sub.add_parser("timeline", help="draw a local run's steps, waits and restarts over time from its journal")
    _store_args(p)
    p.add_argument("-o", "--output", choices=["text", "json"], default="text", help="json: for scripts")


def cmd_timeline(args: argparse.Namespace) -> int:
    return timeline.show(_open(args), layout.RunRef.local(args.run_id), as_json=args.output == "json")


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


#: The flag that sets each policy field.
_POLICY_FLAGS = {"costCeilingUSD": "--max-cost", "maxTokens": "--max-tokens",
                 "maxSteps": "--max-steps", "maxDuration": "--max-duration",
                 "progressTimeout": "--progress-timeout", "maxRetries": "--max-retries"}
_NO_LIMIT = "none"


def _policy_flags(args: argparse.Namespace) -> dict[str, Any]:
    """The policy fields the command line sets (``none`` lifts a budget)."""
    fields: dict[str, Any] = {}
    if args.max_cost is not None:
        if args.max_cost == _NO_LIMIT:
            fields["costCeilingUSD"] = None
        else:
            try:
                if Decimal(args.max_cost) < 0:
                    raise InvalidOperation
            except InvalidOperation:
                raise _UsageError(f"--max-cost: {args.max_cost!r} is not an amount in USD, "
                                  "e.g. --max-cost 5.00 (or 'none': no ceiling)") from None
            fields["costCeilingUSD"] = str(Decimal(args.max_cost))
    for flag, name, value, low in (("--max-tokens", "maxTokens", args.max_tokens, 0),
                                   ("--max-steps", "maxSteps", args.max_steps, 1),
                                   ("--max-retries", "maxRetries", args.max_retries, 0)):
        if value is None:
            continue
        if value == _NO_LIMIT and name != "maxRetries":
            fields[name] = None
            continue
        try:
            number = int(value)
        except ValueError:
            raise _UsageError(f"{flag}: {value!r} is not a whole number"
                              + (" (or 'none': no limit)" if name != "maxRetries" else "")) from None
        if number < low:
            raise _UsageError(f"{flag}: must be >= {low}, got {number}")
        fields[name] = number
    for flag, name, value in (("--max-duration", "maxDuration", args.max_duration),
                              ("--progress-timeout", "progressTimeout", args.progress_timeout)):
        if _duration_arg(flag, value) is not None:
            fields[name] = value
    return fields


def _run_policy(args: argparse.Namespace, rs: RunStore) -> Policy:
    """The run's policy: recorded at its first attempt, kept on every resume, changed only by
    a flag given on purpose (which says so and is recorded for the resumes after it)."""
    flags = _policy_flags(args)
    stored = rs.read_policy()
    if stored is None:
        policy = Policy(**flags)
    else:
        policy = Policy.model_validate(stored)
        changes = {k: v for k, v in flags.items() if getattr(policy, k) != v}
        if changes:
            def shown(value: Any) -> str:
                return _NO_LIMIT if value is None else str(value)

            said = ", ".join(f"{_POLICY_FLAGS[k]} {shown(getattr(policy, k))} -> {shown(v)}"
                             for k, v in changes.items())
            print(f"durablerun: changing the policy of run {rs.ref}: {said} (recorded: later "
                  "resumes keep it)", file=sys.stderr)
            policy = policy.model_copy(update=changes)
    if stored != policy.model_dump(mode="json"):
        rs.write_policy(policy.model_dump(mode="json"))
    return policy


def _cli_advice(args: argparse.Namespace) -> Callable[[str], str]:
    def advice(field: str) -> str:
        flag = _POLICY_FLAGS.get(field, f"policy.{field}")
        return (f"raise it and resume: {_resume_command(args)} {flag} <higher> (the run keeps "
                "its limits: resuming without the flag stops here again)")
    return advice


def cmd_run(args: argparse.Namespace) -> int:
    ref = layout.RunRef.local(args.run_id)
    _policy_flags(args)  # flag errors before anything is touched
    if args.snapshot_every < 1:
        raise _UsageError("--snapshot-every: must be >= 1")
    config_fields: dict[str, Any] = {"snapshot_every": args.snapshot_every,
                                     "policy_advice": _cli_advice(args)}
    if args.max_result_bytes is not None:
        if args.max_result_bytes < 1:
            raise _UsageError("--max-result-bytes: must be >= 1")
        config_fields["result_hard_limit"] = args.max_result_bytes
        config_fields["inline_result_max"] = min(256 * 1024, args.max_result_bytes)
    if args.retry_initial is not None:
        config_fields["retry_initial"] = parse_duration(
            _duration_arg("--retry-initial", args.retry_initial) or "1s")
    input_value = _json_arg("--input", args.input) if args.input is not None else {}
    store = _open(args)
    rs = store.run_store(ref)
    try:
        store.check()
        manifest = rs.read_manifest()
        if manifest is None and args.command == "resume":
            raise _UsageError(
                f"no run {ref} in {args.store}: nothing to resume. Check --run-id and --store "
                f"(`durablerun list --store {args.store}` shows the runs there), or start a new "
                f"run with `durablerun run MODULE:FUNC --run-id {args.run_id}`")
        stored_policy = rs.read_policy()
        owner = _hold(store, ref, api.parse_duration(Policy.model_validate(stored_policy or {}).leaseDuration)
                      .total_seconds())
        if owner is None:
            return Outcome.WAITING.exit_code
        policy = _run_policy(args, rs)
    finally:
        rs.close()
    workflow = args.workflow or str((manifest or {}).get("workflow"))
    if args.input is None and manifest:
        input_value = manifest.get("input", {})
    sinks: list[ProgressSink] = []
    if not args.quiet:
        sinks.append(TtyProgress() if sys.stderr.isatty() else PlainProgress())
    if args.json_log:
        sinks.append(JsonLinesSink(None if args.json_log == "-" else args.json_log))
    sinks += tracing.sinks_for(store, ref)  # OpenTelemetry, when OTEL_EXPORTER_OTLP_*ENDPOINT is set
    sys.path.insert(0, os.getcwd())
    config_fields["write_guard"] = lambda: None if owner.valid() else (
        owner.lost or f"store lease of {owner.duration:g}s lapsed without renewal")
    run = Run(store=store, run=ref, workflow=workflow, input=input_value, policy=policy,
              sinks=sinks, config=EngineConfig(**config_fields))
    owner.start(on_lost=run.fence)

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
        owner.stop()
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    if result.outcome != Outcome.FENCED:
        owner.release()  # the next `durablerun run`, or a DurableRun with this runId, takes it at once
    label = result.outcome.value
    if result.abort_reason is not None:
        label += f" ({result.abort_reason.value})"
    print(f"durablerun: {label}: {result.message}", file=sys.stderr)
    resume = _resume_command(args)
    if result.outcome == Outcome.COMPLETED:
        print(json.dumps(result.result, indent=2, default=str))
    elif result.outcome == Outcome.WAITING:
        w = result.waiting
        if w and w.event:
            print(f"durablerun: send it with: durablerun send-event --run-id {args.run_id} "
                  f"--store {args.store} {w.event} '<json>'  then: {resume}", file=sys.stderr)
        elif w and w.wake_time:
            print(f"durablerun: resume it after {w.wake_time.isoformat()}: {resume}",
                  file=sys.stderr)
    elif result.outcome == Outcome.SUSPENDED or result.abort_reason == AbortReason.USER_REQUESTED:
        print(f"durablerun: to resume: {resume}", file=sys.stderr)
    return result.exit_code


def _hold(store: Store, ref: layout.RunRef, lease_seconds: float) -> OwnerLease | None:
    """Take the run id's owner record before writing anything: the same record a DurableRun with this
    spec.checkpoint.runId holds, so a pod and this process never both write. None (said why): held elsewhere."""
    owner = OwnerLease(store.backend, ref, Holder.local(), lease_seconds)
    record = read_owner(store.backend, ref)
    if record and not record.get("released") and Holder.local().supersedes(
            Holder.from_json(record.get("holder"))) is None:
        print(f"durablerun: run {ref} was last held by {Holder.from_json(record.get('holder')).describe()}: "
              f"taking it over once its store lease ({record.get('durationSeconds')}s) has lapsed",
              file=sys.stderr)
    try:
        owner.acquire()
    except HeldElsewhere as held:
        print(f"durablerun: {held}. Stop it there first (on Kubernetes: kubectl durablerun suspend NAME, "
              "whose runner releases the journal at its next step boundary), then run this again",
              file=sys.stderr)
        return None
    return owner


def _resume_command(args: argparse.Namespace) -> str:
    return f"durablerun resume --run-id {args.run_id} --store {args.store}"


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
    status = info.status or {}
    waiting = status.get("waitingFor") or {}
    if not info.exists:
        print(f"no run {ref} has started yet; it will get the event when it waits for it")
    elif status.get("outcome") == "Waiting" and waiting.get("event") == args.name:
        until = status.get("pollingUntil")
        if until and parse_time(str(until)) > datetime.now(UTC):
            print(f"run {ref} is waiting for it and its attempt is still polling for it (until "
                  f"{until}): it picks the event up by itself")
        else:
            print(f"run {ref} is waiting for it and its last attempt has ended: deliver it with "
                  f"{_resume_command(args)}")
    else:
        print(f"run {ref} gets it when it waits for it: an attempt that is running picks it up "
              f"by itself; a stopped run gets it on its next attempt ({_resume_command(args)})")
    return 0


def _last_outcome(info: RunInfo) -> tuple[str, str]:
    """The run's last recorded outcome: a short label and a sentence."""
    status = info.status or {}
    outcome = status.get("outcome")
    if not outcome:
        return ("-", "none recorded: an attempt is running now, or was killed before it ended "
                     "(resume it to carry on)")
    label = str(outcome)
    if status.get("abortReason"):
        label += f" ({status['abortReason']})"
    text = f"{label}: {status.get('message', '')}"
    recorded = status.get("journalRecords")
    if isinstance(recorded, int) and recorded < info.journal_records:
        return ("-", f"none recorded for the latest attempt (it journaled records {recorded}.."
                     f"{info.journal_records - 1}, so it is running now or was killed); the "
                     f"attempt before it ended {text}")
    return label, text


def cmd_list(args: argparse.Namespace) -> int:
    store = _open(args)
    store.check()
    infos = [store.read_run(run=layout.RunRef.local(run_id)) for run_id in store.list_local_runs()]
    if args.json:
        print(json.dumps([{"run": i.run, "workflow": i.workflow, "outcome": (i.status or {}).get(
            "outcome"), "totals": i.totals.to_json(), "journalRecords": i.journal_records,
            "created": i.manifest.get("created")} for i in infos], indent=2))
        return 0
    if not infos:
        print(f"no runs in {store.uri}", file=sys.stderr)
        return 0
    rows = [(i.run.split("/", 1)[1], _last_outcome(i)[0], str(i.totals.steps), f"${i.totals.usd}",
             str(i.workflow), str(i.manifest.get("created", "-"))) for i in infos]
    header = ("RUN ID", "OUTCOME", "STEPS", "COST", "WORKFLOW", "STARTED")
    widths = [max(len(r[k]) for r in [header, *rows]) for k in range(len(header))]
    for row in [header, *rows]:
        print("  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)).rstrip())
    return 0


def cmd_delete(args: argparse.Namespace) -> int:
    ref = layout.RunRef.local(args.run_id)
    store = _open(args)
    store.check()
    if not store.backend.list_keys(f"{ref.path}/"):
        print(f"no run {ref} in {store.uri}", file=sys.stderr)
        return 1
    owner = OwnerLease(store.backend, ref, Holder.local(), 1.0)
    try:
        owner.acquire(patience=0)
    except HeldElsewhere as held:
        raise _UsageError(f"not deleted: {held}") from None
    owner.stop()
    deleted = store.delete_run(run=ref)
    if not deleted:
        print(f"no run {ref} in {store.uri}", file=sys.stderr)
        return 1
    print(f"deleted run {ref} from {store.uri}: {deleted} objects")
    return 0


def _fmt_time(at: Any) -> str:
    if not at:
        return "-"
    return datetime.fromtimestamp(float(at), UTC).strftime("%H:%M:%S.%f")[:-3]


def _kubernetes_run(args: argparse.Namespace) -> tuple[Store, layout.RunRef] | None:
    """The store and identity of DurableRun NAMESPACE/NAME, read through the user's kubeconfig.

    Read-only: one GET of the DurableRun. The store is opened with the user's own
    credentials (never the run's Secret); --store, --endpoint-url and --region
    override spec.checkpoint (e.g. an endpoint only reachable inside the cluster).
    """
    namespace, sep, name = str(args.kubernetes).partition("/")
    if not sep or not namespace or not name:
        raise _UsageError(f"--kubernetes {args.kubernetes!r}: use NAMESPACE/NAME, e.g. "
                          "--kubernetes team-a/review-agent")
    import urllib3
    from kubernetes import client, config
    from kubernetes.client.rest import ApiException

    try:
        config.load_kube_config(context=args.context)
    except (config.ConfigException, OSError) as e:
        raise _UsageError(f"--kubernetes: cannot load a kubeconfig ({e}): set KUBECONFIG or "
                          "--context") from None
    try:
        body = client.CustomObjectsApi().get_namespaced_custom_object(
            api.GROUP, api.VERSION, namespace, api.PLURAL, name)
    except ApiException as e:
        if e.status == 404:
            print(f"no DurableRun {namespace}/{name} (kubectl get dr -n {namespace})",
                  file=sys.stderr)
            return None
        raise _UsageError(f"--kubernetes: reading DurableRun {namespace}/{name} failed: "
                          f"{e.status} {e.reason}") from None
    except (urllib3.exceptions.HTTPError, OSError) as e:  # the API server cannot be reached
        raise _UsageError(f"--kubernetes: cannot reach the API server of your kubeconfig: "
                          f"{type(e).__name__}: {e}") from None
    checkpoint = api.DurableRunSpec.model_validate(body["spec"]).checkpoint
    overrides = {k: v for k, v in (("uri", None if args.store == _FROM_RUN else args.store),
                                   ("endpoint", args.endpoint_url), ("region", args.region)) if v}
    checkpoint = checkpoint.model_copy(update=overrides)
    args.store = checkpoint.uri
    ref = layout.RunRef.durable_run(namespace, name, str(body["metadata"]["uid"]), checkpoint.runId)
    return store_from_checkpoint(checkpoint), ref


def _print_result(store: Store, ref: layout.RunRef) -> int:
    rs = store.run_store(ref)
    try:
        records = rs.load().records
        done = records[-1] if records and isinstance(records[-1], CompleteRecord) else None
        if done is None:
            print(f"run {ref} has no result: it has not completed", file=sys.stderr)
            return 1
        body = rs.get_blob(done.ref) if done.ref is not None else done.inline_json()
    finally:
        rs.close()
    print(json.dumps(json.loads(body), indent=2, ensure_ascii=False))
    return 0


def cmd_inspect(args: argparse.Namespace) -> int:
    if args.kubernetes:
        found = _kubernetes_run(args)
        if found is None:
            return 1
        store, ref = found
    else:
        ref = layout.RunRef.local(args.run_id)
        if args.store == _FROM_RUN:
            args.store = os.environ.get("DURABLERUN_STORE", DEFAULT_STORE)
        store = _open(args)
    return inspect_run(store, ref, as_json=args.json, show_all=args.all, result=args.result)


def inspect_run(store: Store, ref: layout.RunRef, *, as_json: bool = False, show_all: bool = False,
                result: bool = False) -> int:
    """Print a run's journal (or with ``result``, its result) as `durablerun inspect` does (also
    `kubectl durablerun journal`)."""
    store.check()
    info = store.read_run(run=ref)
    if not info.exists:
        print(f"no run {ref} in {store.uri}", file=sys.stderr)
        return 1
    if result:
        return _print_result(store, ref)
    rs = store.run_store(ref)
    try:
        loaded = rs.load()
        records = rs.read_all() if show_all else loaded.records
    finally:
        rs.close()
    cont = loaded.continuation
    generation = cont.gen if cont is not None else 0
    rows = []
    for r in records:
        step = r if isinstance(r, StepRecord) else None
        row: dict[str, Any] = {
            "seq": r.seq, "position": r.pos, "kind": r.kind, "name": r.name,
            "ok": r.ok if isinstance(r, StepRecord | EventRecord) else None,
            "attempts": step.attempts if step else None, "duration": step.dur if step else None,
            "at": r.at, "usd": str(r.cost.usd) if r.cost else None,
            "tokens": r.cost.tokens if r.cost else None,
            "ref": r.ref if isinstance(r, ResultRecord) else None,
            "error": (step.error or {}).get("message") if step else None}
        if isinstance(r, ContinueRecord):
            row["generation"] = r.gen
        rows.append(row)
    status = info.status or {}
    owner = read_owner(store.backend, ref)
    if as_json:
        print(json.dumps({
            "run": info.run, "store": store.describe(), "manifest": info.manifest,
            "totals": info.totals.to_json(), "journalRecords": info.journal_records,
            "snapshotSeq": info.snapshot_seq, "completed": info.completed,
            "generation": generation, "generationStart": loaded.base,
            "status": status, "events": info.events, "records": rows, "owner": owner,
        }, indent=2, default=str))
        return 0
    m = info.manifest
    print(f"run       {info.run}   ({store.uri})")
    print(f"workflow  {m.get('workflow')}   code {m.get('code_version')}   "
          f"started {m.get('created')}")
    print(f"outcome   {_last_outcome(info)[1]}")
    if owner:
        who = Holder.from_json(owner.get("holder")).describe()
        print(f"owner     {'released by' if owner.get('released') else 'held by'} {who}, last renewed "
              f"{owner.get('renewTime')} (store lease {owner.get('durationSeconds')}s)")
    w = status.get("waitingFor")
    if status.get("outcome") == "Waiting" and w:
        if w.get("event"):
            print(f"waiting   for event {w['event']!r} since {w.get('since')} "
                  f"(deadline {w.get('deadline') or 'none'})")
        else:
            print(f"waiting   until {w.get('wakeTime')}")
    t = info.totals
    total = status.get("totalSteps")
    steps = f"{t.steps}/{total}" if total else str(t.steps)
    print(f"totals    ${t.usd}   {t.tokens} tokens   {steps} steps   "
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
    gaps, gathers = _unrecorded_positions(rows)
    if gathers:
        print(f"\npositions {', '.join(gathers)}: ctx.gather of coroutines, which journals no "
              "record of its own; branch b's operations are numbered <gather>.b.n")
    if gaps:
        print(f"\npositions {', '.join(gaps)}: no record. A ctx.gather takes a position and "
              "journals nothing itself (the steps it gathers are numbered where they were "
              "called); an operation still running when the attempt ended has no record yet")
    return 0


def _unrecorded_positions(rows: list[dict[str, Any]]) -> tuple[list[str], list[str]]:
    """Positions that hold no record: gaps, and gathers whose branches hold records."""
    taken: dict[tuple[str, tuple[int, ...]], set[int]] = {}
    gathers: list[str] = []
    for row in rows:
        pos = str(row["position"])
        if row["kind"] in ("patch", "continue", "complete") or pos == "end":
            continue
        gen, _, local = pos.rpartition("/")
        try:
            t = tuple(int(p) for p in local.split("."))
        except ValueError:
            continue
        head = f"{gen}/" if gen else ""
        for j in range(0, len(t), 2):
            taken.setdefault((head, t[:j]), set()).add(t[j])
            if j + 1 < len(t):
                gather = head + ".".join(map(str, t[: j + 1]))
                if gather not in gathers:
                    gathers.append(gather)
    gaps = []
    for (head, scope), indices in taken.items():
        for i in range(max(indices) + 1):
            if i not in indices:
                gaps.append(head + ".".join(map(str, (*scope, i))))
    return gaps, gathers


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
        handler = {"run": cmd_run, "resume": cmd_run, "send-event": cmd_send_event,
                   "inspect": cmd_inspect, "list": cmd_list, "delete": cmd_delete,
                   "timeline": cmd_timeline}[args.command]
        return handler(args)
    except BrokenPipeError:
        # The reader went away (`durablerun inspect ... | head`): stop quietly, as a
        # command killed by SIGPIPE does, and keep Python from complaining at exit.
        with contextlib.suppress(OSError, ValueError):
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return EXIT_BROKEN_PIPE
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
