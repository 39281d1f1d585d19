"""kopf wiring: watch DurableRuns, their pods and DurableRunSchedules, and hand every change to the reconciler.

Handlers are thin: they only enqueue the run. The decisions live in
``decide``, the API calls in ``kube``. Only ``on.event`` handlers are used, so
kopf writes no progress annotations onto DurableRuns: the run's state lives in
its status alone. The operator's state (settings, the reconciler, its tasks)
lives in kopf's memo, set by ``__main__`` and at startup. docs/operator.md
says why kopf is the event source and the reconcile loop is our own.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Mapping
from typing import Any

import kopf

from durablerun import api
from durablerun_operator import kube, kueue, quotas, reconciler, schedule, shards
from durablerun_operator.config import Settings

log = logging.getLogger("durablerun.operator")


@kopf.on.startup()
async def startup(settings: kopf.OperatorSettings, memo: kopf.Memo, **_: Any) -> None:
    from durablerun_operator import metrics

    own: Settings = memo.settings
    # Watches can go silently stale behind proxies and load balancers: ask the
    # server to close each watch regularly; kopf reconnects from the last resourceVersion it saw (bookmarks keep
    # it fresh), listing again only on 410 Gone (kopf docs, "Networking").
    settings.watching.server_timeout = 300
    settings.watching.client_timeout = 330
    settings.watching.connect_timeout = 30
    # List in pages, as client-go's reflectors do: one unpaged LIST of 100,000 runs is parsed whole (gigabytes of
    # dicts at once), and the allocator keeps that peak as the idle operator's RSS.
    settings.watching.chunk_size = kube.LIST_PAGE
    settings.posting.level = logging.WARNING
    # The operator's RBAC is least privilege: no cluster-wide reads of CRDs or
    # namespaces, so kopf must not scan for them (the resources are fixed).
    settings.scanning.disabled = True
    # A connection for each reconcile worker, and some for the rest (the schedules' workers, the shard keeper).
    kube.load_config(connections=schedule.WORKERS + 8)
    run_metrics = metrics.RunMetrics()
    if own.metrics_port:
        run_metrics.serve(own.metrics_port, "0.0.0.0")
    client = kube.Kube()
    keeper = shards.Keeper(client, own) if own.shards else None
    rec = reconciler.Reconciler(client, own, run_metrics, memo.get("tracer"), keeper)
    # Set before kopf starts watching, so every per-object memo (a shallow copy of this one) holds it.
    memo.reconciler, memo.keeper = rec, keeper
    memo.tasks = [
        asyncio.create_task(rec.run_workers(), name="durablerun-workers"),
        asyncio.create_task(rec.resync_forever(), name="durablerun-resync"),
        asyncio.create_task(rec.schedules.run_workers(), name="durablerun-schedules"),
    ]
    if own.model_quotas:
        writer = quotas.StatusWriter(rec.executor.quota_index, client, own, run_metrics,
                                     lambda name: quotas.writes_status(name, own, keeper, rec.executor.quota_index))
        memo.tasks.append(asyncio.create_task(writer.run_forever(), name="durablerun-quota-status"))
    if keeper is not None:
        keeper.on_change = rec.shards_changed
        memo.tasks.append(asyncio.create_task(keeper.run_forever(), name="durablerun-shards"))
        log.info("replica %s: %d shards, leases of %ss in namespace %s", own.replica_name, own.shards,
                 own.shard_lease_seconds, own.lease_namespace)
    log.info("durablerun operator started (namespaces: %s)", ", ".join(own.namespaces) or "all")


@kopf.on.cleanup()
async def cleanup(memo: kopf.Memo, **_: Any) -> None:
    for task in memo.get("tasks", []):
        task.cancel()
    tracer = memo.get("tracer")
    if tracer is not None:
        await asyncio.to_thread(tracer.shutdown)
    keeper: shards.Keeper | None = memo.get("keeper")
    if keeper is not None:  # hand the shards over now rather than when their Leases run out
        try:
            await keeper.release_all()
        except Exception:
            log.exception("could not hand the shards over; they are taken over when their Leases run out")


@kopf.on.event(api.GROUP, api.VERSION, api.PLURAL)
async def run_changed(body: kopf.Body, type: str | None, memo: kopf.Memo, **_: Any) -> None:
    rec: reconciler.Reconciler | None = memo.get("reconciler")
    if rec is not None:
        rec.run_changed(dict(body), deleted=type == "DELETED")


@kopf.on.event(api.GROUP, api.VERSION, api.SCHEDULE_PLURAL)
async def schedule_changed(body: kopf.Body, type: str | None, memo: kopf.Memo, **_: Any) -> None:
    rec: reconciler.Reconciler | None = memo.get("reconciler")
    if rec is not None:
        rec.schedules.schedule_changed(dict(body), deleted=type == "DELETED")


@kopf.on.event("", "v1", "pods", labels={api.LABEL_RUN: kopf.PRESENT})
async def pod_changed(namespace: str | None, name: str | None, labels: Mapping[str, str], type: str | None,
                      body: kopf.Body, memo: kopf.Memo, **_: Any) -> None:
    rec: reconciler.Reconciler | None = memo.get("reconciler")
    run = labels.get(api.LABEL_RUN)
    if rec is not None and namespace and run and name:
        rec.pod_changed(namespace, run, dict(body), deleted=type == "DELETED")


async def workload_changed(namespace: str | None, labels: Mapping[str, str], memo: kopf.Memo, **_: Any) -> None:
    """Kueue admitted, evicted or deleted a run's Workload: decide the run again."""
    rec: reconciler.Reconciler | None = memo.get("reconciler")
    run = labels.get(api.LABEL_RUN)
    if rec is not None and namespace and run:
        rec.pod_changed(namespace, run)


async def quota_changed(name: str | None, body: kopf.Body, type: str | None, memo: kopf.Memo, **_: Any) -> None:
    rec: reconciler.Reconciler | None = memo.get("reconciler")
    if rec is not None and name:
        rec.executor.quota_index.changed(name, None if type == "DELETED" else dict(body))


def watch_quotas() -> None:
    """Watch the ModelQuotas (settings.model_quotas). Registered only then, so an operator without them needs
    neither their CRD nor RBAC for them."""
    kopf.on.event(api.GROUP, api.VERSION, api.QUOTA_PLURAL)(quota_changed)


def watch_workloads() -> None:
    """Watch the Workloads the operator creates for runs (Kueue on: settings.kueue). Registered only then, so
    an operator without Kueue needs neither its CRDs nor RBAC for them."""
    kopf.on.event(kueue.GROUP, kueue.VERSION, kueue.WORKLOADS, labels={api.LABEL_RUN: kopf.PRESENT})(workload_changed)
