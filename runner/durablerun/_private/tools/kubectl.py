"""``kubectl durablerun``: day-two commands for DurableRuns, as a kubectl plugin (entry point: ``durablerun.kubectl``).

Installed with the package as the ``kubectl-durablerun`` console script; kubectl
finds it on ``PATH``. Every change is the plain Kubernetes operation the docs
describe, made through ``kubectl`` itself (your kubeconfig, context and RBAC)::

    kubectl durablerun approve RUN EVENT [--by WHO] [--message M]   # merge patch spec.events.EVENT
    kubectl durablerun reject RUN EVENT [--by WHO] [--message M]
    kubectl durablerun event RUN EVENT [JSON|@file]                 # any payload
    kubectl durablerun suspend RUN | resume RUN                     # spec.suspend
    kubectl durablerun abort RUN [--reason R]                       # annotation durablerun.dev/abort
    kubectl durablerun retry RUN                                    # annotation durablerun.dev/retry (lifts abort)
    kubectl durablerun wait RUN [--for PHASE,...] [--timeout 10m]
    kubectl durablerun status RUN                                   # phase, message, Kueue queue and position
    kubectl durablerun logs RUN [-f] [--attempt N]                  # every attempt's pod, in order; N's from the store
    kubectl durablerun journal RUN [--json] [--all] [--credentials-from-secret]
    kubectl durablerun stream RUN [NAME] [-f] [--from N] [--final] [--json]  # the run's output stream
    kubectl durablerun tree RUN                                     # child runs (label durablerun.dev/parent)
    kubectl durablerun rerun RUN --from STEP                        # cut the journal back, then a new attempt
    kubectl durablerun fork RUN --from STEP --to NEW                # a new DurableRun with RUN's history before STEP
    kubectl durablerun upgrade (RUN | -l SELECTOR) --image IMAGE [--check]  # replay check in a pod, then re-pin
    kubectl durablerun ui [-A] [--port 8765] [--trace-url T]          # the run browser on 127.0.0.1 (docs/web.md)
    kubectl durablerun completion bash

``-n/--namespace``, ``--context`` and ``--kubeconfig`` go to every kubectl
call. ``kubectl`` is the one on ``PATH`` (or ``$KUBECTL``).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from typing import Any

from durablerun import api, errors, resource
from durablerun._private.tools import (
    arguments,
    browser,
    inspection,
    kubeapi,
    logview,
    streamview,
    timeline,
    upgrades,
)
from durablerun._private.tools.kubeapi import KIND_REF, Kubectl, PluginError
from durablerun._version import __version__

RESOURCE = kubeapi.RESOURCE
# `wait` with no --for waits for a finished run; its exit code is the run's outcome's.
FINISHED = {api.Phase.SUCCEEDED: 0, api.Phase.FAILED: 1, api.Phase.ABORTED: api.Outcome.ABORTED.exit_code}
EXIT_TIMEOUT = 124  # as timeout(1)


def _json_arg(text: str) -> Any:
    if text.startswith("@"):
        with open(text[1:], encoding="utf-8") as f:
            text = f.read()
    try:
        return json.loads(text)
    except json.JSONDecodeError as e:
        raise arguments.UsageError(f"the event payload is not JSON ({e}): "
                                   "pass e.g. '{\"approved\": true}' or @file.json") from None


def cmd_approve(kube: Kubectl, args: argparse.Namespace) -> int:
    payload: dict[str, Any] = {"approved": args.command == "approve",
                               "by": args.by or os.environ.get("USER") or "kubectl-durablerun"}
    if args.message:
        payload["message"] = args.message
    print(kubeapi.send_event(kube, args.run, args.event, payload))
    return 0


def cmd_event(kube: Kubectl, args: argparse.Namespace) -> int:
    print(kubeapi.send_event(kube, args.run, args.event, _json_arg(args.payload)))
    return 0


def cmd_suspend(kube: Kubectl, args: argparse.Namespace) -> int:
    print(kubeapi.suspend(kube, args.run, args.command == "suspend"))
    return 0


def cmd_budget(kube: Kubectl, args: argparse.Namespace) -> int:
    values = {key: getattr(args, key) for key in kubeapi.BUDGET_FLAGS if getattr(args, key) is not None}
    print(kubeapi.budget(kube, args.run, values))
    return 0


def cmd_abort(kube: Kubectl, args: argparse.Namespace) -> int:
    print(kubeapi.abort(kube, args.run, args.reason))
    return 0


def cmd_retry(kube: Kubectl, args: argparse.Namespace) -> int:
    print(kubeapi.retry(kube, args.run))
    return 0


def cmd_wait(kube: Kubectl, args: argparse.Namespace) -> int:
    wanted = set(FINISHED)
    if args.for_phases:
        try:
            wanted = {api.Phase(p.strip()) for p in args.for_phases.split(",") if p.strip()}
        except ValueError:
            raise arguments.UsageError(f"--for {args.for_phases!r}: use phases among "
                                       f"{', '.join(p.value for p in api.Phase)}") from None
    try:
        timeout = api.parse_duration(args.timeout).total_seconds()
    except ValueError as e:
        raise arguments.UsageError(f"--timeout: {e}") from None
    deadline = time.monotonic() + timeout
    while True:
        run = kube.run(args.run)
        status = run.get("status") or {}
        phase = status.get("phase")
        if phase in wanted and not _retry_pending(run):
            message = f": {status['message']}" if status.get("message") else ""
            print(f"{KIND_REF}/{args.run} {phase}{message}")
            return 0 if args.for_phases else FINISHED[api.Phase(phase)]
        if time.monotonic() >= deadline:
            print(f"timed out after {args.timeout} waiting for {args.run} to be "
                  f"{' or '.join(sorted(wanted))} (it is {phase or 'not started'})", file=sys.stderr)
            return EXIT_TIMEOUT
        time.sleep(min(1.0, max(0.0, deadline - time.monotonic())))


def cmd_status(kube: Kubectl, args: argparse.Namespace) -> int:
    run = kube.run(args.run)
    for line in describe_status(run, api.now()):
        print(line)
    queue = (run["metadata"].get("labels") or {}).get(api.LABEL_QUEUE_NAME)
    if queue:
        position = kubeapi.queue_position(kube, run)
        print(f"queue: {position.describe() if position else queue}")
    return 0


def describe_status(run: dict[str, Any], now: Any) -> list[str]:
    """What `kubectl durablerun status` says of a run: its phase and message, then where it is (steps journaled,
    the step in flight), what it spent, the attempt and its lease, and what a waiting run waits for."""
    status = resource.DurableRunStatus.model_validate(run.get("status") or {})
    message = f": {status.message}" if status.message else ""
    lines = [f"{KIND_REF}/{run['metadata']['name']} {status.phase or 'not started'}{message}"]
    progress = status.progress
    if progress.completedSteps or progress.totalSteps or progress.inFlight:
        of = f" of {progress.totalSteps}" if progress.totalSteps else ""
        line = f"progress: {progress.completedSteps}{of} steps journaled"
        flight = progress.inFlight
        if flight is not None and status.phase == api.Phase.RUNNING:
            retry = f", retry {flight.attempt - 1}" if flight.attempt > 1 else ""
            line += f"; in flight: step {flight.name!r} (at {flight.position}{retry}) for " \
                    f"{_elapsed(now, flight.startTime)}"
        lines.append(line)
    if status.cost.usd != "0" or status.cost.tokens:
        lines.append(f"cost: ${status.cost.usd}, {status.cost.tokens} tokens")
    lease = status.lease
    if status.phase == api.Phase.RUNNING and status.pod:
        renewed = (f"lease renewed {_elapsed(now, lease.renewTime)} ago"
                   if lease.renewTime and lease.holder == status.pod else "lease not held yet")
        lines.append(f"attempt {status.attempt} in pod {status.pod}, {renewed}")
    waiting = status.waitingFor
    if status.phase == api.Phase.WAITING and waiting is not None:
        what = (f"event {waiting.event!r}" if waiting.event else
                f"a person to raise policy.askAt.{waiting.budget} (kubectl durablerun budget)" if waiting.budget else
                f"room in model quota {waiting.quota!r} until {waiting.wakeTime} (kubectl get modelquota "
                f"{waiting.quota})" if waiting.quota else
                f"a durable sleep until {waiting.wakeTime}" if waiting.wakeTime else "its turn")
        since = f" since {waiting.since}" if waiting.since else ""
        lines.append(f"waiting for {what}{since} (no pod)")
    return lines


def _elapsed(now: Any, since: str) -> str:
    seconds = max(0, round((now - api.parse_time(since)).total_seconds()))
    return f"{seconds}s" if seconds < 120 else f"{seconds // 60}m{seconds % 60:02d}s"


def _retry_pending(run: dict[str, Any]) -> bool:
    """A finished run asked to retry that the operator has not started again yet: `retry` then `wait` waits for
    the new attempt's end, not the old one's."""
    annotations, status = run["metadata"].get("annotations") or {}, run.get("status") or {}
    value = annotations.get(api.ANNOTATION_RETRY)
    return (value is not None and value != status.get("retry") and api.ANNOTATION_ABORT not in annotations
            and status.get("phase") in FINISHED)


def attempt_pods(kube: Kubectl, run: str) -> list[dict[str, Any]]:
    """The run's pods, oldest attempt first (the epoch label orders them)."""
    pods = kube.json("get", "pods", "-l", f"{api.LABEL_RUN}={run}")["items"]
    return sorted(pods, key=lambda p: int((p["metadata"].get("labels") or {}).get(api.LABEL_EPOCH) or 0))


def cmd_logs(kube: Kubectl, args: argparse.Namespace) -> int:
    body = kube.run(args.run)  # a clear error when the run does not exist
    pods = attempt_pods(kube, args.run)
    if args.attempt is not None:
        pods = [p for p in pods if (p["metadata"].get("labels") or {}).get(api.LABEL_EPOCH) == str(args.attempt)]
        if not pods:  # its pod is gone (the operator deletes an ended attempt's): what the pod stored
            store, ref = kubeapi.open_journal(kube, body, credentials_from_secret=args.credentials_from_secret)
            try:
                print(f"==> attempt {args.attempt} of {args.run}, from its store (the pod is gone) <==", flush=True)
                return logview.show(store, ref, args.attempt)
            finally:
                store.close()
    if not pods:
        print(f"{args.run} has no pods (yet, or any more: finished attempts' pods may have been deleted); "
              f"{_archived(kube, body, args)}", file=sys.stderr)
        return 0
    for i, pod in enumerate(pods):
        name = pod["metadata"]["name"]
        epoch = (pod["metadata"].get("labels") or {}).get(api.LABEL_EPOCH, "?")
        print(f"==> pod {name} (attempt {epoch}, {(pod.get('status') or {}).get('phase', '?')}) <==", flush=True)
        last = i == len(pods) - 1
        if last and args.follow:
            return subprocess.run([kube.binary, *kube.flags, "logs", "-f", name, "-c", api.RUNNER_CONTAINER],
                                  check=False).returncode
        result = kube("logs", name, "-c", api.RUNNER_CONTAINER, check=False)
        sys.stdout.write(result.stdout)
        if result.returncode != 0:
            print(f"(no logs: {result.stderr.strip()})")
        sys.stdout.flush()
    return 0


def _archived(kube: Kubectl, body: dict[str, Any], args: argparse.Namespace) -> str:
    """Which attempts' logs the run's store keeps; a store this user cannot read says so, and how to."""
    try:
        store, ref = kubeapi.open_journal(kube, body, credentials_from_secret=args.credentials_from_secret)
        try:
            return logview.describe_archived(store, ref)
        finally:
            store.close()
    except (errors.DurableRunError, PluginError) as error:
        return f"the store's logs could not be listed ({error}; --credentials-from-secret reads with the run's " \
               "credentials)"


def cmd_journal(kube: Kubectl, args: argparse.Namespace) -> int:
    run = kube.run(args.run)
    store, ref = kubeapi.open_journal(kube, run, credentials_from_secret=args.credentials_from_secret)
    try:
        if args.command == "timeline":  # the same journal, drawn over time, each restart with its cause
            return timeline.show(store, ref, as_json=args.output == "json",
                                 events=timeline.kubernetes_events(kube.events(run)))
        return inspection.inspect_run(store, ref, as_json=args.json, show_all=args.all)
    finally:
        store.close()


def cmd_stream(kube: Kubectl, args: argparse.Namespace) -> int:
    found = kubeapi.open_journal(kube, kube.run(args.run), credentials_from_secret=args.credentials_from_secret)
    return streamview.show_run(*found, args)


def cmd_rerun(kube: Kubectl, args: argparse.Namespace) -> int:
    print(kubeapi.rerun(kube, args.run, args.from_step, credentials_from_secret=args.credentials_from_secret))
    return 0


def cmd_fork(kube: Kubectl, args: argparse.Namespace) -> int:
    print(kubeapi.fork(kube, args.run, args.from_step, args.to, credentials_from_secret=args.credentials_from_secret))
    return 0


def cmd_upgrade(kube: Kubectl, args: argparse.Namespace) -> int:
    """Move a run (or each run -l selects) to IMAGE if IMAGE's code replays its journal (upgrades.upgrade)."""
    if bool(args.run) == bool(args.selector):
        raise arguments.UsageError("upgrade: name one run, or select runs with -l SELECTOR (not both)")
    timeout = api.parse_duration(args.timeout).total_seconds()
    if args.run:
        print(upgrades.upgrade(kube, args.run, args.image, check_only=args.check, timeout=timeout))
        return 0
    refused, report = upgrades.upgrade_selected(kube, args.selector, args.image, check_only=args.check,
                                                timeout=timeout)
    print(report)
    return 1 if refused else 0


def cmd_tree(kube: Kubectl, args: argparse.Namespace) -> int:
    root = kube.run(args.run)

    def line(run: dict[str, Any]) -> str:
        status = run.get("status") or {}
        cost = f"${(status.get('cost') or {}).get('usd') or '0'}"
        family = status.get("childrenTotal")
        if family:  # a parent: its children's count and cost, which count toward its ceiling
            cost += f" (children {family.get('summary')}: ${family.get('usd')})"
        phase, message = status.get("phase") or "-", status.get("message") or ""
        return f"{run['metadata']['name']}  {phase}  {cost}  {message}".rstrip()

    def children(name: str, prefix: str, seen: set[str]) -> None:
        found = kube.json("get", RESOURCE, "-l", f"{api.LABEL_PARENT}={name}")["items"]
        found.sort(key=lambda r: r["metadata"].get("creationTimestamp") or "")
        for i, child in enumerate(found):
            last = i == len(found) - 1
            print(f"{prefix}{'└── ' if last else '├── '}{line(child)}")
            if child["metadata"]["name"] not in seen:
                children(child["metadata"]["name"], prefix + ("    " if last else "│   "),
                         seen | {child["metadata"]["name"]})

    print(line(root))
    children(args.run, "", {args.run})
    return 0


COMMANDS = ["approve", "reject", "event", "suspend", "resume", "abort", "retry", "wait", "status", "logs", "journal",
            "tree", "completion", "timeline", "rerun", "fork", "ui", "upgrade", "budget", "stream"]
# Commands whose first argument is a DurableRun's name (completed from the cluster).
TAKES_RUN = set(COMMANDS) - {"completion", "ui", "upgrade"}

BASH_COMPLETION = """\
# bash completion of kubectl-durablerun: eval "$(kubectl-durablerun completion bash)"
# (`kubectl durablerun <TAB>` completes through kubectl_complete-durablerun, which kubectl finds on PATH.)
_kubectl_durablerun() {
    local out
    out=$(kubectl-durablerun __complete "${COMP_WORDS[@]:1:COMP_CWORD}" 2>/dev/null) || return
    COMPREPLY=($(printf '%s\\n' "$out" | grep -v '^:'))
}
complete -F _kubectl_durablerun kubectl-durablerun
"""


def cmd_completion(kube: Kubectl, args: argparse.Namespace) -> int:
    print(BASH_COMPLETION, end="")
    return 0


def complete(argv: list[str]) -> int:
    """Cobra's ``__complete`` protocol (what kubectl's plugin completion calls): candidates, then ``:4``."""
    words = argv[:-1]  # the last word is the one being completed
    prefix = argv[-1] if argv else ""
    global_flags = {"-n", "--namespace", "--context", "--kubeconfig"}
    positional, flags, skip = [], [], False
    for word in words:
        if skip:
            flags.append(word)
            skip = False
        elif word in global_flags:
            flags.append(word)
            skip = True
        elif word.startswith("-"):
            flags.append(word)
        else:
            positional.append(word)
    candidates: list[str] = []
    if not positional:
        candidates = COMMANDS
    elif positional[0] == "completion" and len(positional) == 1:
        candidates = ["bash"]
    elif positional[0] in TAKES_RUN and len(positional) == 1:
        parsed, _ = _global_parser().parse_known_args(flags)
        result = Kubectl(parsed)("get", RESOURCE, "-o", "jsonpath={.items[*].metadata.name}", check=False)
        candidates = result.stdout.split() if result.returncode == 0 else []
    for candidate in candidates:
        if candidate.startswith(prefix):
            print(candidate)
    print(":4")  # ShellCompDirectiveNoFileComp
    return 0


def _global_parser(default: Any = None) -> arguments.Parser:
    parser = arguments.Parser(add_help=False)
    parser.add_argument("-n", "--namespace", default=default, help="the runs' namespace (default: the context's)")
    parser.add_argument("--context", default=default, help="the kubeconfig context to use")
    parser.add_argument("--kubeconfig", default=default, help="the kubeconfig file to use")
    return parser


def build_parser() -> argparse.ArgumentParser:
    # The same flags before or after the command; after it they must not reset what came before.
    common = _global_parser(argparse.SUPPRESS)
    parser = arguments.Parser(prog="kubectl durablerun", parents=[_global_parser()],
                              description="Day-two commands for DurableRuns (durable-run's kubectl plugin).")
    parser.add_argument("--version", action="version", version=f"kubectl-durablerun {__version__}")
    sub = parser.add_subparsers(dest="command", required=True, parser_class=arguments.Parser)

    def command(name: str, help: str) -> argparse.ArgumentParser:
        p = sub.add_parser(name, help=help, parents=[common])
        if name in TAKES_RUN:
            p.add_argument("run", help="the DurableRun's name")
        return p

    for name, verdict in (("approve", "approved: true"), ("reject", "approved: false")):
        p = command(name, f"send an event {{{verdict}, by, message}} (merge patch of spec.events.EVENT)")
        p.add_argument("event", help="the event the workflow waits for (ctx.wait_for_event)")
        p.add_argument("--by", help="who decided (default $USER)")
        p.add_argument("--message", help="a note for the workflow")
    p = command("event", "send an event with any JSON payload (merge patch of spec.events.EVENT)")
    p.add_argument("event", help="the event's name")
    p.add_argument("payload", nargs="?", default="{}", help="JSON or @file (default {})")
    command("suspend", "set spec.suspend: the attempt stops at its next step boundary")
    command("resume", "clear spec.suspend")
    p = command("abort", f"abort the run (annotation {api.ANNOTATION_ABORT}=REASON); a running attempt gets "
                         "spec.policy.abortGracePeriod to stop and let its Sagas undo their work")
    p.add_argument("--reason", default="requested with kubectl durablerun", help="why (shown in the status)")
    p = command("budget", "set the run's budgets (spec.policy; none removes one): a run Waiting on its budget "
                          "goes on once the soft limit it reached is past its cost")
    p.add_argument("--ask-at-usd", metavar="USD", help="policy.askAt.costUSD: stop and ask at this cost")
    p.add_argument("--ask-at-tokens", metavar="N", help="policy.askAt.tokens: stop and ask at this many tokens")
    p.add_argument("--max-cost", metavar="USD", help="policy.costCeilingUSD: abort at this cost")
    p.add_argument("--max-tokens", metavar="N", help="policy.maxTokens: abort at this many tokens")
    command("retry", f"retry a Failed or Aborted run from its journal (annotation {api.ANNOTATION_RETRY} set "
                     f"to a new value; lifts {api.ANNOTATION_ABORT})")
    p = command("wait", "wait until the run is finished (exit 0 Succeeded, 1 Failed, 3 Aborted, 124 timeout)")
    p.add_argument("--for", dest="for_phases", metavar="PHASE[,PHASE]",
                   help="wait for any of these phases instead (exit 0 when reached)")
    p.add_argument("--timeout", default="10m", help="give up after this long (e.g. 30s, 10m, 2h; default 10m)")
    command("status", "show the run's phase and message and, for a run in a Kueue queue, the queue and (while "
                      "Queued) its position there, from Kueue's visibility API")
    p = command("logs", "print the logs of every attempt's pod, oldest first; with --attempt, one attempt's, from "
                        "the run's store once its pod is gone")
    p.add_argument("-f", "--follow", action="store_true", help="follow the latest attempt's log")
    p.add_argument("--attempt", type=int, metavar="N",
                   help="attempt N only (the pod's epoch): its pod's log while the pod exists, else what the pod "
                        "stored in the run's store")
    p.add_argument("--credentials-from-secret", action="store_true", help="as for journal (for the stored logs)")
    p = command("journal", "print the run's journal from its store (as `durablerun inspect` does)")
    p.add_argument("--json", action="store_true", help="everything as JSON")
    p.add_argument("--all", action="store_true", help="every generation's records")
    p.add_argument("--credentials-from-secret", action="store_true",
                   help="read S3 credentials from the run's spec.checkpoint.credentialsSecret (needs get on "
                        "that Secret); by default they come from your environment (AWS_ACCESS_KEY_ID, ...)")
    p = command("stream", "print the run's output stream (ctx.stream) from its store, live with -f (store "
                          "credentials as for journal)")
    p.add_argument("name", nargs="?", help="the stream's name (default: the run's only stream)")
    arguments.stream_args(p)
    p.add_argument("--credentials-from-secret", action="store_true", help="as for journal")
    p = command("timeline", "draw the run's steps, waits and restarts over time from its journal (store "
                            "credentials as for journal)")
    p.add_argument("-o", "--output", choices=["text", "json"], default="text", help="json: for scripts")
    p.add_argument("--credentials-from-secret", action="store_true", help="as for journal")
    p = command("rerun", "run a finished run again from a step: drop its journal from the step's first record on "
                         f"(archived first), then start a new attempt ({api.ANNOTATION_RETRY})")
    p.add_argument("--from", dest="from_step", required=True, metavar="STEP", help="the step's name (see journal)")
    p.add_argument("--credentials-from-secret", action="store_true", help="as for journal")
    p = command("fork", "create DurableRun NEW: this run's spec and input, its journal a copy of this run's "
                        "before a step")
    p.add_argument("--from", dest="from_step", required=True, metavar="STEP",
                   help="the first step NEW executes itself (see journal)")
    p.add_argument("--to", required=True, metavar="NEW", help="the new DurableRun's name (must not exist)")
    p.add_argument("--credentials-from-secret", action="store_true", help="as for journal")
    p = command("upgrade", "move the run to IMAGE's code if it replays the run's journal (the operator checks it in "
                           f"a one-off pod of IMAGE); else print the divergence and change nothing "
                           f"({api.ANNOTATION_UPGRADE})")
    p.add_argument("run", nargs="?", help="the DurableRun's name")
    p.add_argument("-l", "--selector", help="upgrade each run this label selector names instead, reporting each")
    p.add_argument("--image", required=True, help="the new runner image (a tag or a digest)")
    p.add_argument("--check", action="store_true", help="only check (a dry run of the same check): change nothing")
    p.add_argument("--timeout", default="11m", help="how long to wait for the operator's verdict (default 11m: it "
                                                    "gives the check pod 10m)")
    command("tree", f"show the run and its child runs (label {api.LABEL_PARENT}), recursively")
    p = command("ui", "serve the run browser on 127.0.0.1 as you (your kubeconfig, your RBAC): the runs, each "
                      "run's timeline, events and children, and these commands as buttons (docs/web.md)")
    p.add_argument("--port", type=int, default=8765, help="the port on 127.0.0.1 (default 8765; 0: any free one)")
    p.add_argument("-A", "--all-namespaces", action="store_true", help="list the runs of every namespace you may "
                   "list (default: the context's or -n's namespace)")
    p.add_argument("--credentials-from-secret", action="store_true", help="as for journal (for the timelines)")
    p.add_argument("--trace-url", metavar="TEMPLATE", type=arguments.trace_url_template,
                   help="link each run's page to its trace: TEMPLATE with {traceID} in it, e.g. "
                        "http://localhost:16686/trace/{traceID} for Jaeger's UI")
    p = command("completion", "print a shell completion script")
    p.add_argument("shell", choices=["bash"])
    return parser


HANDLERS = {"approve": cmd_approve, "reject": cmd_approve, "event": cmd_event, "suspend": cmd_suspend,
            "resume": cmd_suspend, "abort": cmd_abort, "retry": cmd_retry, "wait": cmd_wait, "status": cmd_status,
            "logs": cmd_logs, "journal": cmd_journal, "tree": cmd_tree, "completion": cmd_completion,
            "timeline": cmd_journal, "rerun": cmd_rerun, "fork": cmd_fork, "ui": browser.serve, "upgrade": cmd_upgrade,
            "budget": cmd_budget, "stream": cmd_stream}


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["__complete"]:
        return complete(argv[1:])
    try:
        args = build_parser().parse_args(argv)
        return HANDLERS[args.command](Kubectl(args), args)
    except (arguments.UsageError, errors.ConfigError) as e:
        print(f"kubectl durablerun: error: {e}", file=sys.stderr)
        return api.Outcome.USAGE_ERROR.exit_code
    except (PluginError, errors.StoreError) as e:
        print(f"kubectl durablerun: {e}", file=sys.stderr)
        return 1


def complete_main() -> int:
    """``kubectl_complete-durablerun``: kubectl runs it to complete ``kubectl durablerun ...``."""
    return complete(sys.argv[1:])


if __name__ == "__main__":
    sys.exit(main())
