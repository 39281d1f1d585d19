"""The runner inside a DurableRun's pod: ``durablerun pod``.

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
status (a per-run Role the operator creates).
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
import time
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from pathlib import Path
from typing import Any

from durablerun import api, errors
from durablerun._private import extras
from durablerun._private.children import PodBroker
from durablerun._private.owner import HeldElsewhere, Holder, OwnerLease
from durablerun.engine import AttemptResult, EngineConfig, Run
from durablerun.sinks import EventKind, JsonLinesSink, ProgressEvent, ProgressSink
from durablerun.stores import RunRef, Store, store_from_checkpoint

log = logging.getLogger("durablerun.pod")

JSON_PATCH = "application/json-patch+json"
CRASH_EXIT = 70  # not an outcome: the operator counts it as a crash and restarts with backoff
# Progress rides on the renewals (every leaseDuration/3): no write of its own (docs/design.md, write budget).
# Between renewals the runner reads its run this often, so that spec.suspend, new events and an abort reach it.
READ_SECONDS = 20.0


def _now() -> str:
    return api.format_time(datetime.now(UTC))


class Fenced(Exception):
    """A newer attempt owns the run: this pod must stop without writing anything."""


class Identity:
    def __init__(self, env: dict[str, str]) -> None:
        missing = [v for v in (api.Env.NAMESPACE, api.Env.NAME, api.Env.UID, api.Env.EPOCH, api.Env.POD_NAME)
                   if not env.get(v)]
        if missing:
            raise errors.ConfigError(
                f"missing environment {', '.join(missing)}: `durablerun pod` runs inside a pod the "
                "durable-run operator created; locally, use `durablerun run`")
        self.namespace = env[api.Env.NAMESPACE]
        self.name = env[api.Env.NAME]
        self.uid = env[api.Env.UID]
        self.pod = env[api.Env.POD_NAME]
        try:
            self.epoch = int(env[api.Env.EPOCH])
        except ValueError:
            raise errors.ConfigError(f"{api.Env.EPOCH}={env[api.Env.EPOCH]!r} is not a whole number") from None
        self.termination_path = Path(env.get(api.Env.TERMINATION_MESSAGE_PATH) or api.TERMINATION_MESSAGE_PATH)


class StatusClient:
    """Guarded reads and writes of this run's DurableRun; the only Kubernetes calls the runner makes."""

    def __init__(self, identity: Identity) -> None:
        extras.require("pod", "durablerun pod (the runner in a DurableRun's pod)", "kubernetes")
        from kubernetes import client, config

        try:
            config.load_incluster_config()
        except config.ConfigException:
            config.load_kube_config()
        self.identity = identity
        self.custom = client.CustomObjectsApi()

    def get(self) -> dict[str, Any]:
        from kubernetes.client.rest import ApiException

        i = self.identity
        try:
            return dict(self.custom.get_namespaced_custom_object(
                api.GROUP, api.VERSION, i.namespace, api.PLURAL, i.name))
        except ApiException as error:
            _fenced_if_gone(error, i, before_lease=True)
            raise

    def patch(self, ops: list[dict[str, Any]], *, before_lease: bool = False) -> dict[str, Any]:
        """A JSON patch of the status guarded by this pod's epoch; Fenced when the guard fails."""
        from kubernetes.client.rest import ApiException

        i = self.identity
        guarded = [{"op": "test", "path": "/status/epoch", "value": i.epoch}, *ops]
        try:
            return dict(self.custom.patch_namespaced_custom_object_status(
                api.GROUP, api.VERSION, i.namespace, api.PLURAL, i.name, guarded, _content_type=JSON_PATCH))
        except ApiException as error:
            if error.status in (409, 422):
                raise Fenced(f"status.epoch is no longer {i.epoch}: a newer attempt owns the run") from None
            _fenced_if_gone(error, i, before_lease=before_lease)
            raise


def _fenced_if_gone(error: Any, identity: Identity, *, before_lease: bool) -> None:
    """The run or this pod no longer exists for the API server: a newer attempt (or nobody) owns the run."""
    if error.status == 404:
        raise Fenced(f"DurableRun {identity.namespace}/{identity.name} is gone") from None
    if error.status == 401 and before_lease:
        # A pod-bound token is refused once its pod has been deleted (a runner paused past its lease and woken
        # before it got this far). Holding a lease, a 401 is retried like an unreachable server until the lease
        # would lapse: an API server that is restarting may refuse tokens for a moment.
        raise Fenced("the API server does not accept this pod's token: its pod was deleted, a newer attempt "
                     "owns the run") from None


class StatusSink(ProgressSink):
    """Collects progress for the status; the lease thread ships it with its next renewal."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.fields: dict[str, Any] = {}
        self.completed = 0
        self.steps = 0
        self.total: int | None = None

    def update(self, **fields: Any) -> None:
        """Merge into what is waiting to be shipped: a final update keeps the last step's name and time."""
        with self.lock:
            for key, value in fields.items():
                pending = self.fields.get(key)
                self.fields[key] = {**pending, **value} if isinstance(pending, dict) and isinstance(value, dict) \
                    else value

    def emit(self, event: ProgressEvent) -> None:
        f = event.fields
        if event.kind is EventKind.RUN_STARTED:
            self.completed = f["info"].journal_records
        elif event.kind is EventKind.CHECKPOINT_SAVED:
            self.update(checkpoint={"position": f["seq"], "key": f["key"], "time": _now()})
        elif event.kind in (EventKind.STEP_STARTED, EventKind.STEP_COMPLETED,
                            EventKind.COST_UPDATED, EventKind.TOTAL_STEPS_UPDATED):
            with self.lock:
                progress = dict(self.fields.get("progress") or {})
                if event.kind is EventKind.STEP_STARTED:
                    progress.update(stepName=f["name"])
                elif event.kind is EventKind.STEP_COMPLETED:
                    progress.update(step=f["seq"], stepName=f["name"], lastProgressTime=_now())
                else:
                    if event.kind is EventKind.COST_UPDATED:
                        self.fields["cost"] = {"usd": str(f["usd"]), "tokens": f["tokens"]}
                    else:
                        self.total = f["total"]
                    self.steps = f["steps"]
                    progress.update(progress_of(self.steps, self.total))
                self.fields["progress"] = progress

    def take(self) -> dict[str, Any]:
        with self.lock:
            fields, self.fields = self.fields, {}
        return fields


def progress_of(steps: int, total: int | None) -> dict[str, Any]:
    """status.progress for ``steps`` done of ``total`` expected: "12/40" and 0.3, or "12 steps"."""
    if not total:
        return {"completedSteps": steps, "summary": f"{steps} steps"}
    fraction = min(Decimal(steps) / Decimal(total), Decimal(1)).quantize(Decimal("0.0001")).normalize()
    return {"completedSteps": steps, "totalSteps": total, "fraction": f"{fraction:f}", "summary": f"{steps}/{total}"}


def _status_ops(fields: dict[str, Any], current: dict[str, Any]) -> list[dict[str, Any]]:
    """Merge collected progress into the status objects they belong to."""
    ops = []
    for key, value in fields.items():
        merged = {**(current.get(key) or {}), **value} if isinstance(value, dict) else value
        ops.append({"op": "add", "path": f"/status/{key}", "value": merged})
    return ops


class Lease:
    """Acquires and renews the lease; fences the run when it is lost or would lapse."""

    def __init__(self, status: StatusClient, identity: Identity, duration: timedelta, sink: StatusSink) -> None:
        self.status, self.identity, self.duration, self.sink = status, identity, duration, sink
        self.run: Run | None = None
        #: The store's owner record of a run id's journal (spec.checkpoint.runId): held as long as this lease.
        self.owner: OwnerLease | None = None
        self.last_success = time.monotonic()
        self.body: dict[str, Any] = {}
        self.stopped = threading.Event()
        self.lost: str | None = None
        self.on_spec: list[Any] = []
        self._thread: threading.Thread | None = None
        self._renewing = threading.Lock()  # the lease thread and publish() (requests from steps) both renew

    def acquire(self) -> dict[str, Any]:
        i = self.identity
        now = _now()
        lease = {"holder": i.pod, "epoch": i.epoch, "acquireTime": now, "renewTime": now,
                 "durationSeconds": max(1, int(self.duration.total_seconds()))}
        sent = time.monotonic()
        self.body = self.status.patch([
            {"op": "test", "path": "/status/pod", "value": i.pod},
            {"op": "add", "path": "/status/lease", "value": lease},
        ], before_lease=True)
        self.last_success = sent
        return self.body

    def start(self, run: Run | None) -> None:
        """Renew on a thread; ``run`` (set later when None) is fenced when the lease is lost."""
        self.run = run
        self._thread = threading.Thread(target=self._loop, name="lease", daemon=True)
        self._thread.start()

    def valid(self) -> bool:
        """Whether this pod may still write: its last renewal is younger than the lease."""
        return self.lost is None and time.monotonic() - self.last_success < self.duration.total_seconds() \
            and (self.owner is None or self.owner.valid())

    def write_guard(self) -> str | None:
        """For the engine, before every journal write: None while this pod still holds the lease."""
        if self.valid():
            return None
        self._fence(self.lost or f"lease of {self.duration.total_seconds():g}s lapsed without renewal")
        return self.lost

    def fence(self, why: str) -> None:
        """Fence the attempt from another thread (the store's owner record was lost)."""
        self._fence(why)

    def _fence(self, why: str) -> None:
        if self.lost is None:
            self.lost = why
            log.error("lease lost: %s", why)
            if self.run is not None:
                self.run.fence(why)

    def _loop(self) -> None:
        interval = self.duration.total_seconds() / 3
        next_renewal, next_read = time.monotonic() + interval, time.monotonic() + READ_SECONDS
        while not self.stopped.is_set():
            if not self.valid():
                # Paused past the lease (SIGSTOP, a long GC, a partition): stop before anything more is written.
                self._fence(f"lease of {self.duration.total_seconds():g}s lapsed without renewal")
                return
            if time.monotonic() >= next_renewal:
                if self.renew():
                    next_renewal, next_read = time.monotonic() + interval, time.monotonic() + READ_SECONDS
                elif self.lost:
                    return
                else:
                    next_renewal = time.monotonic() + 1.0  # unreachable: retry until the lease would lapse
            elif time.monotonic() >= next_read:
                next_read = time.monotonic() + READ_SECONDS
                self.read()
            self.stopped.wait(0.2)

    def read(self) -> None:
        """Read the run between renewals (a GET, no write) and hand it to the spec callbacks."""
        try:
            body = self.status.get()
        except Exception as error:  # the next renewal reads it anyway
            log.warning("reading the DurableRun failed: %s", error)
            return
        if (body.get("status") or {}).get("epoch") != self.identity.epoch:
            return  # a newer attempt owns the run: the next renewal fences this one
        with self._renewing:
            self.body = body
        for callback in self.on_spec:
            callback(body)

    def publish(self, ops: list[dict[str, Any]]) -> dict[str, Any]:
        """Write ``ops`` with a renewal now (a child or signal request from a step); the run as written."""
        if not self.renew(ops):
            raise RuntimeError(  # the step retries it
                f"could not record the request in the DurableRun's status: {self.lost or 'API server unreachable'}")
        return self.body

    def renew(self, extra: list[dict[str, Any]] | None = None) -> bool:
        with self._renewing:
            return self._renew(extra)

    def _renew(self, extra: list[dict[str, Any]] | None) -> bool:
        fields = self.sink.take()
        ops = [{"op": "test", "path": "/status/lease/holder", "value": self.identity.pod},
               {"op": "add", "path": "/status/lease/renewTime", "value": _now()},
               *_status_ops(fields, self.body.get("status") or {}), *(extra or [])]
        # The lease runs from when the renewal was sent, not from when its reply came
        # back: a process paused in between must not count the pause as time held.
        sent = time.monotonic()
        try:
            self.body = self.status.patch(ops)
        except Fenced as fenced:
            self._fence(str(fenced))
            return False
        except Exception as error:
            with self.sink.lock:  # keep the progress for the next try
                for key, value in fields.items():
                    self.sink.fields.setdefault(key, value)
            log.warning("lease renewal failed (retrying until the lease would lapse): %s", error)
            return False
        self.last_success = sent
        for callback in self.on_spec:
            callback(self.body)
        return True

    def stop(self) -> None:
        self.stopped.set()
        if self._thread is not None:
            self._thread.join(timeout=5)


def _store(spec: api.DurableRunSpec) -> Store:
    checkpoint = spec.checkpoint
    if checkpoint.endpoint is None and os.environ.get("AWS_ENDPOINT_URL_S3"):
        # From the credentials Secret's optional AWS_ENDPOINT_URL_S3 key.
        checkpoint = checkpoint.model_copy(update={"endpoint": os.environ["AWS_ENDPOINT_URL_S3"]})
    return store_from_checkpoint(
        checkpoint,
        access_key=os.environ.get("AWS_ACCESS_KEY_ID"),
        secret_key=os.environ.get("AWS_SECRET_ACCESS_KEY"),
    )


def _engine_config(spec: api.DurableRunSpec) -> EngineConfig:
    """Engine tuning from the spec, plus DURABLERUN_INLINE_SLEEP_MAX_SECONDS from the pod template's env."""
    config = EngineConfig(snapshot_every=spec.checkpoint.snapshotEvery)
    raw = os.environ.get("DURABLERUN_INLINE_SLEEP_MAX_SECONDS")
    if raw:
        try:
            seconds = float(raw)
        except ValueError:
            raise errors.ConfigError(
                f"DURABLERUN_INLINE_SLEEP_MAX_SECONDS={raw!r} is not a number of seconds") from None
        config = dataclasses.replace(config, inline_sleep_max=timedelta(seconds=seconds))
    return config


_POLICY_EXAMPLES = {"costCeilingUSD": '"<higher>"', "maxTokens": "<higher>", "maxSteps": "<higher>",
                    "maxDuration": '"<longer>"', "progressTimeout": '"<longer>"'}


def kubectl_advice(namespace: str, name: str) -> Callable[[str], str]:
    """Abort messages on Kubernetes: the kubectl patch that raises the limit (an Aborted run then resumes)."""
    def advice(field: str) -> str:
        value = _POLICY_EXAMPLES.get(field, "<value>")
        patch = f'{{"spec":{{"policy":{{"{field}":{value}}}}}}}'
        return f"raise it and the run resumes: kubectl patch dr {name} -n {namespace} --type merge -p '{patch}'"
    return advice


_STORE_CONFIG_ERRORS = (errors.StoreAccessError, errors.StoreNotFoundError)


def _name_the_credentials(message: str, spec: api.DurableRunSpec, identity: Identity) -> str:
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
    logging.basicConfig(level=os.environ.get("DURABLERUN_LOG_LEVEL", "INFO").upper(),
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    # Until the attempt takes SIGTERM over (stop at the next step boundary), a SIGTERM is remembered
    # rather than fatal: a runner fenced at start-up must not die halfway through reporting it.
    signal.signal(signal.SIGTERM, _early_sigterm)
    identity: Identity | None = None
    try:
        identity = Identity(dict(os.environ))
        if os.environ.get(api.Env.MODE) == "purge":
            return _purge(identity)
        return _attempt(identity)
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
    spec = api.DurableRunSpec.model_validate(body["spec"])
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


def _run_ref(spec: api.DurableRunSpec, identity: Identity) -> RunRef:
    """The journal this run continues: its run id's, or by default the DurableRun's own (uid in the key)."""
    return RunRef.durable_run(identity.namespace, identity.name, identity.uid, spec.checkpoint.runId)


def _owner(store: Store, ref: RunRef, identity: Identity, spec: api.DurableRunSpec) -> OwnerLease:
    holder = Holder(cluster=os.environ.get(api.Env.CLUSTER) or None, namespace=identity.namespace,
                    name=identity.name, uid=identity.uid, pod=identity.pod, epoch=identity.epoch)
    return OwnerLease(store.backend, ref, holder, api.parse_duration(spec.policy.leaseDuration).total_seconds())


def _wait_for_holder(identity: Identity, lease: Lease, held: HeldElsewhere) -> int:
    """Another runner writes this run id's journal: end as Waiting, naming it; the operator tries again later."""
    now = datetime.now(UTC)
    waiting = {"wakeTime": api.format_time(now + timedelta(seconds=held.retry_after)), "since": api.format_time(now),
               "holder": held.holder.describe()}
    message = f"{held}; trying again at {waiting['wakeTime']}"
    log.warning("%s", message)
    lease.stop()
    if not lease.renew([{"op": "add", "path": "/status/outcome", "value": api.Outcome.WAITING.value}]) and lease.lost:
        return _terminate(identity, _report(api.Outcome.FENCED, lease.lost), api.Outcome.FENCED.exit_code)
    report = json.dumps({"outcome": api.Outcome.WAITING.value, "message": message, "waitingFor": waiting})
    return _terminate(identity, report, api.Outcome.WAITING.exit_code)


def _attempt(identity: Identity) -> int:
    status = StatusClient(identity)
    body = status.get()
    if body["metadata"]["uid"] != identity.uid:
        raise Fenced(f"DurableRun {identity.name} was recreated (uid {body['metadata']['uid']}): "
                     "this pod belongs to the old one")
    spec = api.DurableRunSpec.model_validate(body["spec"])
    sink = StatusSink()
    lease = Lease(status, identity, api.parse_duration(spec.policy.leaseDuration), sink)
    body = lease.acquire()
    log.info("lease acquired: %s/%s epoch %d", identity.namespace, identity.name, identity.epoch)

    store = _store(spec)
    ref = _run_ref(spec, identity)
    if spec.checkpoint.runId:
        # Hold the store's owner record before anything is written; renew the status lease meanwhile.
        owner = _owner(store, ref, identity, spec)
        lease.start(None)
        try:
            owner.acquire()
        except HeldElsewhere as held:
            return _wait_for_holder(identity, lease, held)
        except errors.FencedError as error:  # a newer attempt of this run holds it
            lease.stop()
            raise Fenced(str(error)) from None
        except _STORE_CONFIG_ERRORS as error:
            lease.stop()
            raise errors.ConfigError(_name_the_credentials(str(error), spec, identity)) from error
        except BaseException:
            lease.stop()
            raise
        lease.owner = owner  # from now on, this pod writes only while it holds both leases
        owner.start(on_lost=lease.fence)
        if lease.lost:  # a newer attempt took the run over while this one waited for the record
            owner.release()
            raise Fenced(lease.lost)
        log.info("store lease acquired: %s", owner.key)
    delivered: set[str] = set()
    try:
        _deliver_events(store, ref, spec.events, delivered)
    except _STORE_CONFIG_ERRORS as error:
        raise errors.ConfigError(_name_the_credentials(str(error), spec, identity)) from error
    # maxDuration counts the time the run had a pod (the operator sums it), not waits between attempts.
    status_now = api.DurableRunStatus.model_validate(body.get("status") or {})
    active = timedelta(seconds=status_now.activeSeconds)
    run = Run(
        store=store, run=ref, workflow=spec.workflow, input=spec.input, policy=spec.policy,
        sinks=[sink, JsonLinesSink(sys.stderr)],
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
            abort = api.Aborting.model_validate(aborting)
            run.request_abort(abort.reason, abort.message)

    lease.on_spec.append(on_spec)
    on_spec(body)
    signal.signal(signal.SIGTERM, lambda *_: run.request_stop())
    if _SIGTERM_BEFORE_RUN.is_set():
        run.request_stop()
    if not spec.checkpoint.runId:
        lease.start(run)
    else:
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
