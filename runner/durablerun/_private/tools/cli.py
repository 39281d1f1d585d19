"""The ``durablerun`` command: its subcommands (arguments: ``arguments``; showing a run: ``inspection``).

::

    durablerun run MODULE:FUNC --run-id ID [--store URI] [--input JSON|@file] [--max-cost USD] ...
    durablerun resume [MODULE:FUNC] --run-id ID [--store URI] [--max-cost USD] ...
    durablerun retry [MODULE:FUNC] --run-id ID [--store URI] ...   # a Failed run: its failed steps run again
    durablerun send-event --run-id ID [--store URI] NAME [JSON|@file]
    durablerun inspect (--run-id ID | --kubernetes NAMESPACE/NAME) [--store URI] [--json] [--all] [--result]
    durablerun list [--store URI] [--json]
    durablerun delete --run-id ID [--store URI]
    durablerun timeline --run-id ID [--store URI] [--output json]
    durablerun stream [NAME] (--run-id ID | --kubernetes NAMESPACE/NAME) [--store URI] [-f] [--from N] [--final]
    durablerun logs (--run-id ID | --kubernetes NAMESPACE/NAME) [--store URI] [--attempt N]  # pods' stored logs
    durablerun rerun --run-id ID --from STEP [--store URI] [run flags]
    durablerun fork --run-id ID --from STEP --to NEW_ID [--store URI] [--input JSON|@file] [run flags]
    durablerun replay MODULE:FUNC (--run-id ID | --kubernetes NAMESPACE/NAME) [--store URI] [--json]
    durablerun pod [...]          # the in-pod entrypoint (durablerun._private.pod.attempt)

``run`` runs the workflow locally until it completes, fails, is aborted or
has to wait; re-running the same command resumes it. Child runs it asks for
run in this process too, each a run id of its own (``durablerun._private.engine.family``). ``resume`` does the
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
import time
from collections.abc import Callable
from datetime import timedelta
from typing import Any

from durablerun import api, errors, relations, resource
from durablerun._private.engine.family import FamilyRun, LocalFamily
from durablerun._private.engine.run import EngineConfig, Run, tuned_from_env
from durablerun._private.engine.sinks import JsonLinesSink, ProgressSink
from durablerun._private.records import layout
from durablerun._private.records.model import AttemptResult, WaitingFor
from durablerun._private.storage.journal import RunStore
from durablerun._private.storage.owner import HeldElsewhere, Holder, OwnerLease, read_owner
from durablerun._private.storage.stores import Store, open_store, store_from_checkpoint
from durablerun._private.telemetry import tracing
from durablerun._private.tools import arguments, inspection, logview, replayer, reruns, streamview, timeline
from durablerun._private.tools.display import PlainProgress, TtyProgress
from durablerun.api import AbortReason, Outcome, parse_duration, parse_time
from durablerun.resource import Policy

EXIT_STORE_UNAVAILABLE = 75
LOCAL_LEASE_SECONDS = 60.0  # the local CLI's hold on a run's owner record (cmd_run)
EXIT_BROKEN_PIPE = 141  # 128 + SIGPIPE, what a shell reports for a command whose reader left
FOLLOW_POLL_SECONDS = 1.0  # run --follow: how often a wait reads the store


def _open(args: argparse.Namespace) -> Store:
    store = open_store(args.store, endpoint_url=args.endpoint_url, region=args.region)
    return store


def _run_policy(args: argparse.Namespace, rs: RunStore) -> Policy:
    """The run's policy: recorded at its first attempt, kept on every resume, changed only by
    a flag given on purpose (which says so and is recorded for the resumes after it)."""
    flags = arguments.policy_flags(args)
    stored = rs.read_policy()
    if stored is None:
        policy = _with(Policy(), flags)
    else:
        policy = Policy.model_validate(stored)
        changes = {k: v for k, v in flags.items() if _field(policy, k) != v}
        if changes:
            def shown(value: Any) -> str:
                return arguments.NO_LIMIT if value is None else str(value)

            said = ", ".join(f"{arguments.POLICY_FLAGS[k]} {shown(_field(policy, k))} -> {shown(v)}"
                             for k, v in changes.items())
            print(f"durablerun: changing the policy of run {rs.ref}: {said} (recorded: later "
                  "resumes keep it)", file=sys.stderr)
            policy = _with(policy, changes)
    if stored != policy.model_dump(mode="json"):
        rs.write_policy(policy.model_dump(mode="json"))
    return policy


def _field(policy: Policy, key: str) -> Any:
    """A policy field by its dotted name (``askAt.costUSD``); None when a part is unset."""
    value: Any = policy
    for part in key.split("."):
        value = getattr(value, part) if value is not None else None
    return value


def _with(policy: Policy, fields: dict[str, Any]) -> Policy:
    """``policy`` with ``fields`` (dotted names) set."""
    doc = policy.model_dump(mode="json")
    for key, value in fields.items():
        *parents, last = key.split(".")
        node = doc
        for part in parents:
            if not isinstance(node.get(part), dict):
                node[part] = {}
            node = node[part]
        node[last] = value
    return Policy.model_validate(doc)


def _cli_advice(args: argparse.Namespace) -> Callable[[str], str]:
    def advice(field: str) -> str:
        flag = arguments.POLICY_FLAGS.get(field, f"policy.{field}")
        return (f"raise it and resume: {_resume_command(args)} {flag} <higher> (the run keeps "
                "its limits: resuming without the flag stops here again)")
    return advice


def cmd_run(args: argparse.Namespace) -> int:
    """Attempts until the run stops waiting for its child runs; with ``--follow``, until it stops waiting
    (waits polled in this process)."""
    while True:
        code, waiting, family = _attempt(args)
        if waiting is None or family is None:
            return code
        arrived = waiting.event is not None and family.store.get_event(run=family.root.ref, name=waiting.event)
        if not (arrived or (args.follow and _follow(args, waiting, family))):
            return code
        args.command = "resume"


def _follow(args: argparse.Namespace, w: WaitingFor, family: LocalFamily) -> bool:
    """Wait here for what the run waits for, polling the store and moving its child runs when they can
    move; True once it is there (False: Ctrl-C, or a child run was stopped)."""
    rs = family.store.run_store(family.root.ref)
    what = f"event {w.event!r}" if w.event else f"its wake time {w.wake_time.isoformat() if w.wake_time else '?'}"
    print(f"durablerun: following: waiting here for {what}, polling the store (Ctrl-C stops; the run stays "
          "Waiting)", file=sys.stderr)
    try:
        while True:
            if family.ready():
                family.settle()  # a child's event came, or its wake time passed
            now = api.now()
            if w.event and rs.get_event(w.event) is not None:
                return True
            due = [t for t in (w.deadline, w.wake_time) if t is not None]
            if due and now >= min(due):
                return True
            wait = min([FOLLOW_POLL_SECONDS, *((t - now).total_seconds() for t in due)])
            time.sleep(max(0.0, wait))  # a durable wait: minutes or days, one store read a second
    except (KeyboardInterrupt, _Stopped):
        return False
    finally:
        rs.close()


class _Stopped(Exception):
    """SIGINT or SIGTERM stopped an attempt of the family: no further attempt starts."""


class _Attempts:
    """Each attempt of a run of the family, as the CLI makes it: under the run's owner record (taken
    before anything is written, released after), with the CLI's progress, stopped by SIGINT or SIGTERM."""

    def __init__(self, args: argparse.Namespace, store: Store, root: layout.RunRef, owner: OwnerLease) -> None:
        self.args, self.store, self.root, self.root_owner = args, store, root, owner
        self.stopped = False

    def __call__(self, member: FamilyRun, start: Callable[..., Run]) -> AttemptResult:
        if self.stopped:
            raise _Stopped
        more: dict[str, Any] = {}
        owner: OwnerLease | None = self.root_owner
        if member.ref != self.root:  # a child run: its own journal, owner record and policy
            rs = self.store.run_store(member.ref)
            try:
                status = rs.read_status() or {}
                owner = _hold(self.store, member.ref, LOCAL_LEASE_SECONDS)
                if owner is None:
                    return AttemptResult(Outcome.WAITING, f"the journal of {member.ref} is held elsewhere")
                if rs.read_policy() is None:  # what `durablerun resume --run-id <child>` applies
                    rs.write_policy(member.policy.model_dump(mode="json"))
            finally:
                rs.close()
            more = {"sinks": _progress(self.args),
                    "active_before": timedelta(seconds=float(status.get("activeSeconds") or 0))}
        assert owner is not None
        held = owner
        run = start(write_guard=lambda: None if held.valid() else (
            held.lost or f"store lease of {held.duration:g}s lapsed without renewal"), **more)
        owner.start(on_lost=run.fence)

        def on_signal(signum: int, _frame: Any) -> None:
            # A raw write: the display may be inside a buffered write to stderr right now,
            # and re-entering a buffered stream from a signal handler raises.
            with contextlib.suppress(OSError):
                os.write(2, f"\ndurablerun: {signal.Signals(signum).name}: stopping at the next "
                            "step boundary (send it again to stop at once)\n".encode())
            self.stopped = True
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
        if member.ref != self.root:
            print(f"durablerun: child run {member.ref}: {_label(result)}: {result.message}", file=sys.stderr)
        return result


def _progress(args: argparse.Namespace) -> list[ProgressSink]:
    if args.quiet:
        return []
    return [TtyProgress() if sys.stderr.isatty() else PlainProgress()]


def _label(result: AttemptResult) -> str:
    label = result.outcome.value
    if result.abort_reason is not None:
        label += f" ({result.abort_reason.value})"
    return label


def _attempt(args: argparse.Namespace) -> tuple[int, WaitingFor | None, LocalFamily | None]:
    """One attempt of the run, then of the child runs it asked for until none can move (as the operator
    would run them: durablerun._private.engine.family); its exit code, what it waits for, and its family."""
    ref = layout.RunRef.local(args.run_id)
    arguments.policy_flags(args)  # flag errors before anything is touched
    if args.snapshot_every < 1:
        raise arguments.UsageError("--snapshot-every: must be >= 1")
    family_config: dict[str, Any] = {"snapshot_every": args.snapshot_every}  # the children's too
    config_fields: dict[str, Any] = {"policy_advice": _cli_advice(args)}
    if args.max_result_bytes is not None:
        if args.max_result_bytes < 1:
            raise arguments.UsageError("--max-result-bytes: must be >= 1")
        family_config["result_hard_limit"] = args.max_result_bytes
        family_config["inline_result_max"] = min(256 * 1024, args.max_result_bytes)
    if args.retry_initial is not None:
        family_config["retry_initial"] = parse_duration(
            arguments.duration_arg("--retry-initial", args.retry_initial) or "1s")
    input_value = arguments.json_arg("--input", args.input) if args.input is not None else {}
    config = tuned_from_env(EngineConfig(**family_config))  # DURABLERUN_INLINE_SLEEP_MAX_SECONDS, as in a pod
    store = _open(args)
    rs = store.run_store(ref)
    try:
        store.check()
        manifest = rs.read_manifest()
        if args.command == "retry":
            outcome = (rs.read_status() or {}).get("outcome")
            if manifest is not None and outcome not in (Outcome.FAILED, Outcome.ABORTED):
                raise arguments.UsageError(
                    f"run {ref} is {outcome or 'running or was stopped'}: retry is for a Failed or Aborted run "
                    f"(its failed steps run again); to go on with it: {_resume_command(args)}")
            # Failures journaled before now run again (as on Kubernetes: status.retryTime).
            config_fields["rerun_failed_before"] = api.now()
        if manifest is None and args.command in ("resume", "retry"):
            raise arguments.UsageError(
                f"no run {ref} in {args.store}: nothing to resume. Check --run-id and --store "
                f"(`durablerun list --store {args.store}` shows the runs there), or start a new "
                f"run with `durablerun run MODULE:FUNC --run-id {args.run_id}`")
        stored_policy = rs.read_policy()
        # maxDuration counts the time the run's attempts ran (api.active_time), as on Kubernetes: not the waits,
        # durable sleeps or pauses between `durablerun` commands. Each attempt records the sum in status.json.
        config_fields["active_before"] = timedelta(
            seconds=float((rs.read_status() or {}).get("activeSeconds") or 0))
        # The local store lease stays a minute (renewed every 20 s), whatever the run's leaseDuration: that
        # default grew to 3m for the API server's sake, and a second `durablerun run` would wait a renewal out.
        lease = min(Policy.model_validate(stored_policy or {}).lease_duration.total_seconds(), LOCAL_LEASE_SECONDS)
        owner = _hold(store, ref, lease)
        if owner is None:
            return Outcome.WAITING.exit_code, None, None
        policy = _run_policy(args, rs)
    finally:
        rs.close()
    workflow = args.workflow or str((manifest or {}).get("workflow"))
    if args.input is None and manifest:
        input_value = manifest.get("input", {})
    sinks = _progress(args)
    if args.json_log:
        sinks.append(JsonLinesSink(None if args.json_log == "-" else args.json_log))
    sinks += tracing.sinks_for(store, ref)  # OpenTelemetry, when OTEL_EXPORTER_OTLP_*ENDPOINT is set
    sys.path.insert(0, os.getcwd())
    attempts = _Attempts(args, store, ref, owner)
    family = LocalFamily.restore(store, config, ref, workflow, input_value, policy, attempter=attempts, clocks=True)
    result = family.attempt(ref.name, sinks=sinks, **config_fields)
    if result.outcome != Outcome.FENCED:
        owner.release()  # done by the attempt already, unless it ended without one (an abort the family decided)
    print(f"durablerun: {_label(result)}: {result.message}", file=sys.stderr)
    resume = _resume_command(args)
    if result.outcome == Outcome.COMPLETED:
        print(json.dumps(result.result, indent=2, default=str))
    elif result.outcome == Outcome.WAITING:
        w = result.waiting
        if w and w.event and w.event.startswith(relations.CHILD_EVENT_PREFIX):
            child = relations.child_run_name(ref.name, w.event[len(relations.CHILD_EVENT_PREFIX):])
            print(f"durablerun: waiting for child run {child}", file=sys.stderr)
        elif w and w.event:
            then = "" if args.follow else f"  then: {resume}"
            print(f"durablerun: send it with: durablerun send-event --run-id {args.run_id} "
                  f"--store {args.store} {w.event} '<json>'{then}", file=sys.stderr)
        elif w and w.wake_time:
            print(f"durablerun: resume it after {w.wake_time.isoformat()}: {resume}",
                  file=sys.stderr)
    elif result.outcome == Outcome.SUSPENDED or result.abort_reason == AbortReason.USER_REQUESTED:
        print(f"durablerun: to resume: {resume}", file=sys.stderr)
    try:
        family.settle()  # the children it asked for, until none can move (the operator's part)
    except _Stopped:
        print(f"durablerun: stopped; the run and its child runs go on with: {resume}", file=sys.stderr)
        return Outcome.SUSPENDED.exit_code, None, None
    return result.exit_code, result.waiting if result.outcome == Outcome.WAITING else None, family


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


def cmd_rerun(args: argparse.Namespace) -> int:
    """Cut the run back to ``--from`` (refused, nothing changed, while an attempt holds it), then resume it."""
    ref = layout.RunRef.local(args.run_id)
    arguments.policy_flags(args)  # flag errors before anything is touched
    store = _open(args)
    store.check()
    if args.command == "fork":
        new = layout.RunRef.local(args.to)
        given = arguments.json_arg("--input", args.input) if args.input is not None else None
        cut = reruns.fork(store, ref, args.from_step, new, reruns.Origin.local(), input=given)
        print(f"durablerun: forked run {ref} to {new}: its journal copies the {cut.kept} records before step "
              f"{args.from_step!r} (position {cut.position}); {new} executes that step on", file=sys.stderr)
        args.run_id = args.to
    else:
        cut = reruns.rerun(store, ref, args.from_step, reruns.Origin.local())
        print(f"durablerun: run {ref}: dropped {cut.dropped} journal records from step {args.from_step!r} "
              f"(position {cut.position}) on, kept {cut.kept}; a copy of the run as it was is in "
              f"{store.uri.rstrip('/')}/{ref.path}/{cut.archive}", file=sys.stderr)
    args.command = "resume"
    return cmd_run(args)


def cmd_send_event(args: argparse.Namespace) -> int:
    ref = layout.RunRef.local(args.run_id)
    api.check_event_name(args.name)
    payload = arguments.json_arg("payload", args.payload)
    store = _open(args)
    store.check()
    if store.run_store(ref).read_manifest() is None:
        raise arguments.UsageError(
            f"no run {ref} in {args.store}: nothing was sent. Check --run-id and --store (`durablerun list "
            f"--store {args.store}` shows the runs there)")
    won = store.put_event(run=ref, name=args.name, payload=payload)
    info = store.read_run(run=ref)
    if won:
        print(f"event {args.name!r} stored for run {ref}")
    else:
        print(f"event {args.name!r} was already sent to run {ref}; this payload was ignored "
              "(first write wins)")
    status = info.status or {}
    waiting = status.get("waitingFor") or {}
    if status.get("outcome") == Outcome.WAITING and waiting.get("event") == args.name:
        until = status.get("pollingUntil")
        if until and parse_time(str(until)) > api.now():
            print(f"run {ref} is waiting for it and its attempt is still polling for it (until "
                  f"{until}): it picks the event up by itself")
        else:
            print(f"run {ref} is waiting for it and its last attempt has ended: deliver it with "
                  f"{_resume_command(args)}")
    else:
        print(f"run {ref} gets it when it waits for it: an attempt that is running picks it up "
              f"by itself; a stopped run gets it on its next attempt ({_resume_command(args)})")
    return 0


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
    rows = [(i.run.split("/", 1)[1], inspection.last_outcome(i)[0], str(i.totals.steps), f"${i.totals.usd}",
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
        raise arguments.UsageError(f"not deleted: {held}") from None
    owner.stop()
    deleted = store.delete_run(run=ref)
    if not deleted:
        print(f"no run {ref} in {store.uri}", file=sys.stderr)
        return 1
    print(f"deleted run {ref} from {store.uri}: {deleted} objects")
    return 0


def _kubernetes_run(args: argparse.Namespace) -> tuple[Store, layout.RunRef] | None:
    """The store and identity of DurableRun NAMESPACE/NAME, read through the user's kubeconfig.

    Read-only: one GET of the DurableRun. The store is opened with the user's own
    credentials (never the run's Secret); --store, --endpoint-url and --region
    override spec.checkpoint (e.g. an endpoint only reachable inside the cluster).
    """
    namespace, sep, name = str(args.kubernetes).partition("/")
    if not sep or not namespace or not name:
        raise arguments.UsageError(f"--kubernetes {args.kubernetes!r}: use NAMESPACE/NAME, e.g. "
                                   "--kubernetes team-a/review-agent")
    import urllib3
    from kubernetes import client, config
    from kubernetes.client.rest import ApiException

    try:
        config.load_kube_config(context=args.context)
    except (config.ConfigException, OSError) as e:
        try:  # in a pod (kubectl durablerun upgrade's replay check): its ServiceAccount may read its own run
            config.load_incluster_config()
        except config.ConfigException:
            raise arguments.UsageError(f"--kubernetes: cannot load a kubeconfig ({e}): set KUBECONFIG or "
                                       "--context") from None
    try:
        body = client.CustomObjectsApi().get_namespaced_custom_object(
            api.GROUP, api.VERSION, namespace, api.PLURAL, name)
    except ApiException as e:
        if e.status == 404:
            print(f"no DurableRun {namespace}/{name} (kubectl get dr -n {namespace})",
                  file=sys.stderr)
            return None
        raise arguments.UsageError(f"--kubernetes: reading DurableRun {namespace}/{name} failed: "
                                   f"{e.status} {e.reason}") from None
    except (urllib3.exceptions.HTTPError, OSError) as e:  # the API server cannot be reached
        raise arguments.UsageError(f"--kubernetes: cannot reach the API server of your kubeconfig: "
                                   f"{type(e).__name__}: {e}") from None
    checkpoint = resource.DurableRunSpec.model_validate(body["spec"]).checkpoint
    overrides = {k: v for k, v in (("uri", None if args.store == arguments.FROM_RUN else args.store),
                                   ("endpoint", args.endpoint_url), ("region", args.region)) if v}
    checkpoint = checkpoint.model_copy(update=overrides)
    args.store = checkpoint.uri
    ref = layout.RunRef.durable_run(namespace, name, str(body["metadata"]["uid"]), checkpoint.runId)
    return store_from_checkpoint(checkpoint), ref


def _local_or_kubernetes_run(args: argparse.Namespace) -> tuple[Store, layout.RunRef] | None:
    """The run ``--run-id`` or ``--kubernetes`` names, and its store; None (said why): no such DurableRun."""
    if args.kubernetes:
        return _kubernetes_run(args)
    if args.store == arguments.FROM_RUN:
        args.store = os.environ.get(api.Env.STORE, arguments.DEFAULT_STORE)
    return _open(args), layout.RunRef.local(args.run_id)


def cmd_inspect(args: argparse.Namespace) -> int:
    found = _local_or_kubernetes_run(args)
    if found is None:
        return 1
    store, ref = found
    return inspection.inspect_run(store, ref, as_json=args.json, show_all=args.all, result=args.result)


def cmd_replay(args: argparse.Namespace) -> int:
    found = _local_or_kubernetes_run(args)
    if found is None:
        return Outcome.USAGE_ERROR.exit_code
    store, ref = found
    sys.path.insert(0, os.getcwd())
    return replayer.show(replayer.replay_run(store, ref, args.workflow), as_json=args.json)


def cmd_logs(args: argparse.Namespace) -> int:
    found = _local_or_kubernetes_run(args)
    if found is None:
        return 1
    store, ref = found
    try:
        if args.attempt is None:
            print(logview.describe_archived(store, ref))
            return 0
        return logview.show(store, ref, args.attempt)
    finally:
        store.close()


def cmd_timeline(args: argparse.Namespace) -> int:
    return timeline.show(_open(args), layout.RunRef.local(args.run_id), as_json=args.output == "json")


def cmd_stream(args: argparse.Namespace) -> int:
    found = _local_or_kubernetes_run(args)
    if found is None:
        return 1
    return streamview.show_run(*found, args)


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv and argv[0] == "pod":
        try:
            from durablerun._private.pod import attempt as pod
        except ImportError as e:
            print(f"durablerun pod: the in-pod runner (durablerun._private.pod.attempt) is not available in "
                  f"this installation: {e}", file=sys.stderr)
            return 2
        return int(pod.main(argv[1:]))
    parser = arguments.build_parser()
    try:
        args = parser.parse_args(argv)
        handler = {"run": cmd_run, "resume": cmd_run, "retry": cmd_run, "send-event": cmd_send_event,
                   "inspect": cmd_inspect, "list": cmd_list, "delete": cmd_delete,
                   "timeline": cmd_timeline, "replay": cmd_replay, "stream": cmd_stream, "logs": cmd_logs,
                   "rerun": cmd_rerun, "fork": cmd_rerun}[args.command]
        return handler(args)
    except BrokenPipeError:
        # The reader went away (`durablerun inspect ... | head`): stop quietly, as a
        # command killed by SIGPIPE does, and keep Python from complaining at exit.
        with contextlib.suppress(OSError, ValueError):
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return EXIT_BROKEN_PIPE
    except arguments.UsageError as e:
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
