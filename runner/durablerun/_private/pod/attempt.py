"""The runner inside a DurableRun's pod: ``durablerun pod`` (entry point: ``durablerun.pod``).

One attempt of the run, fenced by a lease held through the DurableRun's status:

1. read identity from the env the operator sets (namespace, name, uid, epoch, pod);
2. acquire the lease with a JSON patch whose ``test`` ops require ``status.epoch``
   to be this pod's epoch and ``status.pod`` to be this pod: a newer attempt
   makes the test fail, and this pod exits Fenced (5) without writing anything;
3. copy ``spec.events`` into the store (first write wins), then run the attempt;
4. renew every ``leaseDuration/3`` in the same guarded way, carrying progress,
   cost and checkpoint position; a refused renewal fences the attempt at once;
   a renewal that cannot reach the API server is retried until the lease would
   lapse, then the attempt is fenced too. Each renewal's reply is the whole
   DurableRun, so ``spec.suspend``, new ``spec.events`` and the operator's abort
   (``status.aborting``) reach the runner within a third of the lease;
5. write the outcome to status and to the termination message, and exit with
   the outcome's exit code. SIGTERM stops at the next step boundary (Suspended).

The ServiceAccount this runs as may only get its own DurableRun and patch its
status (a per-run Role the operator creates). The lease and the status writes
are ``durablerun._private.pod.lease``; this module runs the attempt around them.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import logging
import os
import signal
import sys
import threading
from collections.abc import Callable
from datetime import timedelta
from pathlib import Path
from typing import Any

from durablerun import api, errors, resource
from durablerun._private.engine.children import PodBroker
from durablerun._private.engine.run import Run, tuned_from_env
from durablerun._private.engine.sinks import JsonLinesSink
from durablerun._private.pod import logship
from durablerun._private.pod.lease import Fenced, Identity, Lease, StatusClient, StatusSink, progress_of
from durablerun._private.records.layout import LOG_ATTEMPT_BYTES, RunRef
from durablerun._private.records.model import AttemptResult, EngineConfig
from durablerun._private.storage.owner import HeldElsewhere, Holder, OwnerLease
from durablerun._private.storage.stores import Store, runner_store
from durablerun._private.telemetry import tracing

log = logging.getLogger("durablerun.pod")

CRASH_EXIT = 70  # not an outcome: the operator counts it as a crash and restarts with backoff


def _store(spec: resource.DurableRunSpec) -> Store:
    return runner_store(spec.checkpoint)


def _engine_config(spec: resource.DurableRunSpec) -> EngineConfig:
    """Engine tuning from the spec, plus DURABLERUN_INLINE_SLEEP_MAX_SECONDS from the pod template's env and the
    stop grace the operator computed for this pod (an older operator's pod has none: the policy's own)."""
    raw = os.environ.get(api.Env.STOP_GRACE_SECONDS)
    try:
        stop_grace = timedelta(seconds=float(raw)) if raw else None
    except ValueError:
        raise errors.ConfigError(f"{api.Env.STOP_GRACE_SECONDS}={raw!r} is not a number of seconds") from None
    if stop_grace is None:
        stop_grace = spec.policy.stop_grace(resource.DEFAULT_POD_GRACE_SECONDS)
    return tuned_from_env(EngineConfig(snapshot_every=spec.checkpoint.snapshotEvery, stop_grace=stop_grace))


_POLICY_EXAMPLES = {"costCeilingUSD": '"<higher>"', "maxTokens": "<higher>", "maxSteps": "<higher>",
                    "maxDuration": '"<longer>"', "progressTimeout": '"<longer>"'}
_BUDGET_FLAGS = {"askAt.costUSD": "--ask-at-usd", "askAt.tokens": "--ask-at-tokens"}


def kubectl_advice(namespace: str, name: str) -> Callable[[str], str]:
    """Abort messages on Kubernetes: the kubectl patch that raises the limit (an Aborted run then resumes)."""
    def advice(field: str) -> str:
        if field in _BUDGET_FLAGS:  # a soft budget: the plugin's command, the run goes on at once
            return f"raise it and the run goes on: kubectl durablerun budget {name} -n {namespace} " \
                   f"{_BUDGET_FLAGS[field]} <higher>"
        value = _POLICY_EXAMPLES.get(field, "<value>")
        patch = f'{{"spec":{{"policy":{{"{field}":{value}}}}}}}'
        return f"raise it and the run resumes: kubectl patch dr {name} -n {namespace} --type merge -p '{patch}'"
    return advice


_STORE_CONFIG_ERRORS = (errors.StoreAccessError, errors.StoreNotFoundError)


def _name_the_credentials(message: str, spec: resource.DurableRunSpec, identity: Identity) -> str:
    """A store usage error, with where this pod's credentials came from: the user fixes that Secret."""
    secret = spec.checkpoint.credentialsSecret
    if secret:
        return (f"{message}; the runner's credentials come from Secret {identity.namespace}/{secret} "
                "(spec.checkpoint.credentialsSecret)")
    return (f"{message}; spec.checkpoint.credentialsSecret is not set: the runner uses the pod's own "
            "credentials (workload identity or AWS_* env in spec.template)")


def _deliver_events(store: Store, ref: RunRef, events: dict[str, Any], delivered: set[str]) -> None:
    """spec.events -> the store, first write wins: a later edit of an event is ignored."""
    for name, payload in events.items():
        if name not in delivered:
            store.put_event(run=ref, name=name, payload=payload)
            delivered.add(name)


def _terminate(identity: Identity | None, message: str, code: int) -> int:
    path = identity.termination_path if identity else Path(
        os.environ.get(api.Env.TERMINATION_MESSAGE_PATH) or api.TERMINATION_MESSAGE_PATH)
    with contextlib.suppress(OSError):
        path.write_text(message[:4096])
    # The outcome is final: a late SIGTERM (the pod being deleted) must not turn the exit code into 143
    # while the interpreter shuts down (it resets Python-level handlers, but not SIG_IGN).
    with contextlib.suppress(ValueError):  # not the main thread
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
    return code


def _report(outcome: api.Outcome, message: str) -> str:
    return json.dumps({"outcome": outcome.value, "message": message})


_SIGTERM_BEFORE_RUN = threading.Event()


def _early_sigterm(signum: int, frame: Any) -> None:
    _SIGTERM_BEFORE_RUN.set()


def main(argv: list[str] | None = None) -> int:
    # First, so that everything this process and its steps write passes through it; never in purge mode,
    # which has no attempt to keep logs of. (It starts light and niced: logship.py.)
    off = os.environ.get(api.Env.MODE) == api.Env.MODE_PURGE or os.environ.get(api.Env.SHIP_LOGS, "1") == "0"
    shipper = None if off else logship.start(LOG_ATTEMPT_BYTES)
    try:
        return _main(shipper)
    finally:
        if shipper is not None:
            shipper.close()


def _main(shipper: logship.Shipper | None) -> int:
    logging.basicConfig(level=os.environ.get(api.Env.LOG_LEVEL, "INFO").upper(),
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    # Until the attempt takes SIGTERM over (stop at the next step boundary), a SIGTERM is remembered
    # rather than fatal: a runner fenced at start-up must not die halfway through reporting it.
    signal.signal(signal.SIGTERM, _early_sigterm)
    identity: Identity | None = None
    try:
        identity = Identity(dict(os.environ))
        if os.environ.get(api.Env.MODE) == api.Env.MODE_PURGE:
            return _purge(identity)
        return _attempt(identity, shipper)
    except errors.ConfigError as error:
        log.error("%s", error)
        return _terminate(identity, _report(api.Outcome.USAGE_ERROR, str(error)), api.Outcome.USAGE_ERROR.exit_code)
    except Fenced as fenced:
        log.warning("fenced: %s", fenced)
        return _terminate(identity, _report(api.Outcome.FENCED, str(fenced)), api.Outcome.FENCED.exit_code)
    except Exception as error:  # a crash: the operator restarts the attempt with backoff
        log.exception("runner crashed")
        return _terminate(identity, f"runner crashed: {type(error).__name__}: {error}", CRASH_EXIT)


def _purge(identity: Identity) -> int:
    """Retention Delete: remove every object of the run from its store."""
    body = StatusClient(identity).get()
    spec = resource.DurableRunSpec.model_validate(body["spec"])
    store = _store(spec)
    ref = _run_ref(spec, identity)
    if spec.checkpoint.runId:
        # A run id's journal may have moved on (another cluster, a laptop): delete it only if this DurableRun
        # held it last, and take the record first so that nobody takes it meanwhile.
        keeper = _owner(store, ref, identity, spec).claim_own()
        if keeper is not None:
            return _terminate(identity, _report(api.Outcome.FAILED, f"not deleted: the journal was last held by "
                                                f"{keeper.describe()}"), api.Outcome.FAILED.exit_code)
    deleted = store.delete_run(run=ref)
    message = f"deleted {deleted} objects of the run's journal from {spec.checkpoint.uri}"
    log.info("%s", message)
    return _terminate(identity, _report(api.Outcome.COMPLETED, message), api.Outcome.COMPLETED.exit_code)


def _run_ref(spec: resource.DurableRunSpec, identity: Identity) -> RunRef:
    """The journal this run continues: its run id's, or by default the DurableRun's own (uid in the key)."""
    return RunRef.durable_run(identity.namespace, identity.name, identity.uid, spec.checkpoint.runId)


def _owner(store: Store, ref: RunRef, identity: Identity, spec: resource.DurableRunSpec) -> OwnerLease:
    holder = Holder(cluster=os.environ.get(api.Env.CLUSTER) or None, namespace=identity.namespace,
                    name=identity.name, uid=identity.uid, pod=identity.pod, epoch=identity.epoch)
    return OwnerLease(store.backend, ref, holder, spec.policy.lease_duration.total_seconds())


def _wait_for_holder(identity: Identity, lease: Lease, held: HeldElsewhere) -> int:
    """Another runner writes this run id's journal: end as Waiting, naming it; the operator tries again later."""
    now = api.now()
    waiting = {"wakeTime": api.format_time(now + timedelta(seconds=held.retry_after)), "since": api.format_time(now),
               "holder": held.holder.describe()}
    message = f"{held}; trying again at {waiting['wakeTime']}"
    log.warning("%s", message)
    lease.stop()
    if not lease.renew([{"op": "add", "path": "/status/outcome", "value": api.Outcome.WAITING.value}]) and lease.lost:
        return _terminate(identity, _report(api.Outcome.FENCED, lease.lost), api.Outcome.FENCED.exit_code)
    report = json.dumps({"outcome": api.Outcome.WAITING.value, "message": message, "waitingFor": waiting})
    return _terminate(identity, report, api.Outcome.WAITING.exit_code)


def _attempt(identity: Identity, shipper: logship.Shipper | None) -> int:
    status = StatusClient(identity)
    body = status.get()
    if body["metadata"]["uid"] != identity.uid:
        raise Fenced(f"DurableRun {identity.name} was recreated (uid {body['metadata']['uid']}): "
                     "this pod belongs to the old one")
    spec = resource.DurableRunSpec.model_validate(body["spec"])
    sink = StatusSink()
    lease = Lease(status, identity, spec.policy.lease_duration, sink)
    body = lease.acquire()
    log.info("lease acquired: %s/%s epoch %d", identity.namespace, identity.name, identity.epoch)
    # Renew from now on, through the set-up too (the store's client, the owner record, the events): a runner
    # starved of CPU, twenty starting at once on a small node, must not lose its lease before its first step.
    lease.start(None)
    try:
        store = _store(spec)
        ref = _run_ref(spec, identity)
        if shipper is not None:  # the logs so far and from now on: logs/<epoch>-<uid>/ in the run's root
            shipper.ship_to(spec.checkpoint, ref, identity.epoch, identity.uid)
        if spec.checkpoint.runId:
            # Hold the store's owner record before anything is written.
            owner = _owner(store, ref, identity, spec)
            try:
                owner.acquire()
            except HeldElsewhere as held:
                return _wait_for_holder(identity, lease, held)
            except errors.FencedError as error:  # a newer attempt of this run holds it
                raise Fenced(str(error)) from None
            lease.owner = owner  # from now on, this pod writes only while it holds both leases
            owner.start(on_lost=lease.fence)
            if lease.lost:  # a newer attempt took the run over while this one waited for the record
                owner.release()
                raise Fenced(lease.lost)
            log.info("store lease acquired: %s", owner.key)
        delivered: set[str] = set()
        _deliver_events(store, ref, spec.events, delivered)
    except _STORE_CONFIG_ERRORS as error:
        lease.stop()
        raise errors.ConfigError(_name_the_credentials(str(error), spec, identity)) from error
    except BaseException:
        lease.stop()
        raise
    # maxDuration counts the time the run had a pod (the operator sums it), not waits between attempts.
    status_now = resource.DurableRunStatus.model_validate(body.get("status") or {})
    active = timedelta(seconds=status_now.activeSeconds)
    run = Run(
        store=store, run=ref, workflow=spec.workflow, input=spec.input, policy=spec.policy,
        sinks=[sink, JsonLinesSink(sys.stderr), *tracing.sinks_for(store, ref, attributes={
            "k8s.namespace.name": identity.namespace, "k8s.pod.name": identity.pod,
            "k8s.node.name": os.environ.get(api.Env.NODE_NAME) or None,
            "durablerun.name": identity.name, "durablerun.epoch": identity.epoch})],
        config=dataclasses.replace(_engine_config(spec), write_guard=lease.write_guard, active_before=active,
                                   rerun_failed_before=api.parse_time(status_now.retryTime),
                                   policy_advice=kubectl_advice(identity.namespace, identity.name),
                                   runs=PodBroker(namespace=identity.namespace, name=identity.name, store=store,
                                                  publish=lease.publish, latest=lambda: lease.body)),
    )

    def on_spec(latest: dict[str, Any]) -> None:
        latest_spec = latest.get("spec") or {}
        _deliver_events(store, ref, latest_spec.get("events") or {}, delivered)
        if latest_spec.get("suspend"):
            run.request_stop()
        # The operator's abort (a user's, maxDuration, the children's cost): end Aborted at the next operation,
        # letting Sagas undo their work, before its deadline (policy.abortGracePeriod) fences this attempt.
        aborting = (latest.get("status") or {}).get("aborting")
        if aborting:
            abort = resource.Aborting.model_validate(aborting)
            run.request_abort(abort.reason, abort.message)

    lease.on_spec.append(on_spec)
    on_spec(body)
    signal.signal(signal.SIGTERM, lambda *_: run.request_stop())
    if _SIGTERM_BEFORE_RUN.is_set():
        run.request_stop()
    lease.run = run
    if lease.lost:
        run.fence(lease.lost)
    try:
        result = run.run_attempt()
    finally:
        lease.stop()
        if lease.owner is not None:
            lease.owner.stop()
    if lease.owner is not None and result.outcome != api.Outcome.FENCED and not lease.lost:
        # After the attempt's last write, so that the next holder need not wait for the record to expire.
        lease.owner.release()
    if result.outcome == api.Outcome.USAGE_ERROR and result.error_type in {
            f"{e.__module__}.{e.__qualname__}" for e in _STORE_CONFIG_ERRORS}:
        result = dataclasses.replace(result, message=_name_the_credentials(result.message, spec, identity))
    return _finish(identity, lease, result)


def _finish(identity: Identity, lease: Lease, result: AttemptResult) -> int:
    if result.outcome == api.Outcome.FENCED or lease.lost:
        why = lease.lost or result.message
        return _terminate(identity, _report(api.Outcome.FENCED, why), api.Outcome.FENCED.exit_code)
    final: list[dict[str, Any]] = [{"op": "add", "path": "/status/outcome", "value": result.outcome.value}]
    if result.result_info is not None:
        final.append({"op": "add", "path": "/status/result", "value": result.result_info})
    steps = result.totals.steps
    # A completed run took exactly the steps it took, whatever it expected.
    progress = progress_of(steps, steps if result.outcome == api.Outcome.COMPLETED else lease.sink.total)
    if result.outcome == api.Outcome.COMPLETED:
        progress.update(fraction="1", summary=f"{steps}/{steps}")
    lease.sink.update(progress=progress, cost={"usd": str(result.totals.usd), "tokens": result.totals.tokens})
    if not lease.renew(final):
        if lease.lost:
            return _terminate(identity, _report(api.Outcome.FENCED, lease.lost), api.Outcome.FENCED.exit_code)
        log.warning("could not record the outcome in status; the termination message carries it")
    return _terminate(identity, result.termination_message(), result.exit_code)
