"""The runner pod's lease, held through its DurableRun's status: the only Kubernetes calls the runner makes.

Every write is a JSON patch whose ``test`` ops require ``status.epoch`` to be this pod's epoch (and, to acquire,
``status.pod`` to be this pod): a newer attempt makes the test fail and this pod is Fenced. The lease is
renewed every ``leaseDuration/3`` on a thread of its own, carrying the progress, cost and checkpoint position
the engine's events collect (``StatusSink``); a refused renewal fences the attempt at once, and one that
cannot reach the API server is retried until the lease would lapse. docs/design.md has the contract.
"""

from __future__ import annotations

import logging
import threading
import time
from datetime import timedelta
from decimal import Decimal
from pathlib import Path
from typing import Any

from durablerun import api, errors
from durablerun._private.engine.run import Run
from durablerun._private.engine.sinks import EventKind, ProgressEvent, ProgressSink
from durablerun._private.storage import extras
from durablerun._private.storage.owner import OwnerLease

log = logging.getLogger("durablerun.pod")

JSON_PATCH = "application/json-patch+json"
# Progress rides on the renewals (every leaseDuration/3): no write of its own (docs/design.md, write budget).
# Between renewals the runner reads its run this often, so that spec.suspend, new events and an abort reach it.
READ_SECONDS = 20.0


def _now() -> str:
    return api.format_time(api.now())


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
                    # What the operator names when the attempt ends mid-step (a crash, a fence, an abort).
                    progress.update(stepName=f["name"], inFlight={
                        "name": f["name"], "position": f["position"], "attempt": f["attempt"], "startTime": _now()})
                elif event.kind is EventKind.STEP_COMPLETED:
                    progress.update(step=f["seq"], stepName=f["name"], lastProgressTime=_now(), inFlight=None)
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
        merged = ({k: v for k, v in {**(current.get(key) or {}), **value}.items() if v is not None}
                  if isinstance(value, dict) else value)  # None clears a field (progress.inFlight)
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
