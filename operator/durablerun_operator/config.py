"""Operator settings, grouped by concern, read once from the environment."""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Any

from durablerun import api
from durablerun._version import __version__


def _env_number(name: str, default: float, kind: type[int] | type[float]) -> Any:
    raw = os.environ.get(name)
    if raw is None or raw == "":
        return default
    try:
        return kind(raw)
    except ValueError:
        what = "a whole number" if kind is int else "a number"
        raise SystemExit(f"{name}={raw!r} is not {what}: set it to e.g. {default}") from None


def _positive(name: str, default: float, kind: type[int] | type[float]) -> Any:
    value = _env_number(name, default, kind)
    if value <= 0:
        raise SystemExit(f"{name}={value} must be greater than 0: set it to e.g. {default}")
    return value


def _fraction(name: str, default: float) -> float:
    value = float(_env_number(name, default, float))
    if not 0 <= value <= 1:
        raise SystemExit(f"{name}={value} must be between 0 (off) and 1: set it to e.g. {default}")
    return value


def _flag(name: str) -> bool:
    raw = os.environ.get(name, "").strip().lower()
    if raw not in ("", "true", "false"):
        raise SystemExit(f"{name}={raw!r} must be true or false")
    return raw == "true"


@dataclass(frozen=True)
class Settings:
    #: Image of runner pods whose template names none (DURABLERUN_RUNNER_IMAGE).
    runner_image: str = f"ghcr.io/durable-run/runner:{__version__}"
    #: Port of the Prometheus /metrics endpoint (DURABLERUN_METRICS_PORT; 0 disables it).
    metrics_port: int = 9090
    #: Port of the /healthz endpoint for liveness and readiness (DURABLERUN_HEALTH_PORT).
    health_port: int = 8080
    #: Seconds between safety-net LISTs of every run (DURABLERUN_RESYNC_SECONDS): a run whose version the
    #: watch did not deliver is decided then. Runs are never re-decided on this clock: each is decided on
    #: its watch events and at its own next wake-up (docs/operator.md).
    resync_seconds: float = 600.0
    #: Seconds a pod may stay Terminating past its grace period before the next
    #: attempt starts anyway (DURABLERUN_STUCK_TERMINATING_SECONDS). Its node is
    #: presumed lost; the epoch already fences it.
    stuck_terminating_seconds: float = 60.0
    #: Seconds an attempt's pod may fail to get its image (ErrImagePull, ImagePullBackOff, InvalidImageName)
    #: after the attempt started before the run Fails with reason ImagePullFailed, naming the image
    #: (DURABLERUN_START_TIMEOUT_SECONDS, default 600). Until then the run stays Running with the kubelet's
    #: reason in status.reason: a registry that comes back, or an image pushed late, starts it.
    start_timeout_seconds: float = 600.0
    #: This cluster's name (DURABLERUN_CLUSTER, or its earlier name DURABLERUN_CLUSTER_NAME when that is unset),
    #: handed to runners: a run with spec.checkpoint.runId records it in the store's owner record, so that a run
    #: in another cluster names whom it waits for.
    cluster_name: str = ""
    #: The webhook ingress's public base URL (DURABLERUN_WEBHOOK_URL, the chart's webhooks.url); when set,
    #: runner pods get it and the namespace's signing keys, so ctx.webhook_url works (docs/web.md).
    webhook_url: str = ""
    #: The operator's Kubernetes API client: sustained requests per second (DURABLERUN_KUBE_QPS) and burst
    #: (DURABLERUN_KUBE_BURST), a token bucket over every call it makes (client-go's defaults, 5 and 10,
    #: are what cap controllers that keep them).
    kube_qps: float = 50.0
    kube_burst: int = 100
    #: Mass lease expiry (DURABLERUN_MASS_EXPIRY_FRACTION, DURABLERUN_MASS_EXPIRY_MIN_RUNS): when at least
    #: this share of the active runs' leases, and at least this many, are late at once, restarts that rest
    #: only on the lease are held until renewals recover. A fraction of 0 turns the hold off.
    mass_expiry_fraction: float = 0.5
    mass_expiry_min_runs: int = 10
    #: The OTEL_* variables runners get (the chart's tracing values, set on the operator too), by name; the
    #: operator traces its own decisions when they name an endpoint (docs/metrics.md, Traces).
    otel_env: tuple[tuple[str, str], ...] = ()
    #: Admission through Kueue (DURABLERUN_KUEUE=true, the chart's kueue.enabled): a run labelled
    #: kueue.x-k8s.io/queue-name gets a Workload and starts each attempt only once Kueue admits it. Off,
    #: the label means nothing and the operator needs neither Kueue's CRDs nor RBAC for them.
    kueue: bool = False
    #: Where runner pods get their rights (DURABLERUN_RUNNER_ACCESS): api.RUNNER_ACCESS_NAMESPACE, one
    #: ServiceAccount, Role and RoleBinding per namespace, made once; or api.RUNNER_ACCESS_RUN, per run, for a
    #: namespace whose runs must not read each other (docs/security.md, "What a runner may do").
    runner_access: str = api.RUNNER_ACCESS_NAMESPACE
    #: ModelQuotas (DURABLERUN_MODEL_QUOTAS=true, the chart's quotas.enabled): watched, handed to the runner pods of
    #: the namespaces each covers, and read back into their status. Runners share their windows in the Redis
    #: DURABLERUN_LLM_QUOTA_REDIS names (required with quotas on); the operator reads it with the password
    #: DURABLERUN_LLM_QUOTA_REDIS_PASSWORD (a Secret), and runners get theirs from their namespace's
    #: durablerun-quota-redis Secret. DURABLERUN_LLM_QUOTA_UNAVAILABLE, if set, is handed on as it is.
    model_quotas: bool = False
    quota_redis: str = ""
    quota_redis_password: str = field(default="", repr=False)
    quota_unavailable: str = ""
    #: More than one replica: the shards the runs are split into (DURABLERUN_SHARDS; 0, the default, is one
    #: replica deciding every run, with no shard Lease), each held for this many seconds
    #: (DURABLERUN_SHARD_LEASE_SECONDS): a dead replica's shards are taken over within about that long.
    shards: int = 0
    shard_lease_seconds: float = 15.0
    #: This replica's name in the shard Leases (DURABLERUN_POD_NAME, else the host's name) and the namespace
    #: they live in (DURABLERUN_NAMESPACE: the operator's own; required with shards).
    replica_name: str = ""
    lease_namespace: str = ""
    #: Namespaces to watch; empty means all (--namespace).
    namespaces: tuple[str, ...] = field(default_factory=tuple)

    @classmethod
    def from_env(cls, namespaces: tuple[str, ...] = ()) -> Settings:
        return cls(
            runner_image=os.environ.get(api.OperatorEnv.RUNNER_IMAGE) or cls.runner_image,
            metrics_port=_env_number(api.OperatorEnv.METRICS_PORT, cls.metrics_port, int),
            health_port=_env_number(api.OperatorEnv.HEALTH_PORT, cls.health_port, int),
            resync_seconds=_env_number(api.OperatorEnv.RESYNC_SECONDS, cls.resync_seconds, float),
            stuck_terminating_seconds=_env_number(
                api.OperatorEnv.STUCK_TERMINATING_SECONDS, cls.stuck_terminating_seconds, float
            ),
            start_timeout_seconds=_positive(api.OperatorEnv.START_TIMEOUT_SECONDS, cls.start_timeout_seconds, float),
            kube_qps=_positive(api.OperatorEnv.KUBE_QPS, cls.kube_qps, float),
            kube_burst=_positive(api.OperatorEnv.KUBE_BURST, cls.kube_burst, int),
            mass_expiry_fraction=_fraction(api.OperatorEnv.MASS_EXPIRY_FRACTION, cls.mass_expiry_fraction),
            mass_expiry_min_runs=_positive(api.OperatorEnv.MASS_EXPIRY_MIN_RUNS, cls.mass_expiry_min_runs, int),
            cluster_name=os.environ.get(api.OperatorEnv.CLUSTER) or os.environ.get(api.OperatorEnv.CLUSTER_OLD_NAME)
            or "",
            webhook_url=os.environ.get(api.Env.WEBHOOK_URL, ""),
            otel_env=tuple(sorted((k, v) for k, v in os.environ.items()
                                  if k.startswith(api.Env.OTEL_PREFIX) and k not in api.Env.OTEL_NOT_SHARED)),
            kueue=_flag(api.OperatorEnv.KUEUE),
            runner_access=_runner_access(),
            **_quotas(),
            namespaces=namespaces,
            **_sharding(),
        )


def _runner_access() -> str:
    access = os.environ.get(api.OperatorEnv.RUNNER_ACCESS) or api.RUNNER_ACCESS_NAMESPACE
    if access not in (api.RUNNER_ACCESS_NAMESPACE, api.RUNNER_ACCESS_RUN):
        raise SystemExit(f"{api.OperatorEnv.RUNNER_ACCESS}={access!r} must be {api.RUNNER_ACCESS_NAMESPACE} "
                         f"(one runner ServiceAccount per namespace) or {api.RUNNER_ACCESS_RUN} (one per run)")
    return access


def _quotas() -> dict[str, Any]:
    on, url = _flag(api.OperatorEnv.MODEL_QUOTAS), os.environ.get(api.Env.LLM_QUOTA_REDIS, "")
    if on and not url:
        raise SystemExit(f"{api.OperatorEnv.MODEL_QUOTAS}=true needs {api.Env.LLM_QUOTA_REDIS}, the Redis whose "
                         "windows the runners share (the chart deploys one, or give quotas.redis.url)")
    unavailable = os.environ.get(api.Env.LLM_QUOTA_UNAVAILABLE, "")
    if unavailable not in ("", "wait", "proceed"):
        raise SystemExit(f"{api.Env.LLM_QUOTA_UNAVAILABLE}={unavailable!r} must be wait or proceed")
    return {"model_quotas": on, "quota_redis": url,
            "quota_redis_password": os.environ.get(api.Env.LLM_QUOTA_REDIS_PASSWORD, ""),
            "quota_unavailable": unavailable}


def _sharding() -> dict[str, Any]:
    import socket

    shards = _env_number(api.OperatorEnv.SHARDS, 0, int)
    if shards < 0:
        raise SystemExit(f"{api.OperatorEnv.SHARDS}={shards} must be 0 (one replica) or more: set it to e.g. 16")
    lease_namespace = os.environ.get(api.OperatorEnv.NAMESPACE, "")
    if shards and not lease_namespace:
        raise SystemExit(f"{api.OperatorEnv.SHARDS}={shards} needs {api.OperatorEnv.NAMESPACE}, the namespace "
                         "of the shard Leases (the operator's own): set it, as the chart does from the pod's")
    return {"shards": shards, "lease_namespace": lease_namespace,
            "shard_lease_seconds": _positive(api.OperatorEnv.SHARD_LEASE_SECONDS, Settings.shard_lease_seconds,
                                             float),
            "replica_name": os.environ.get(api.OperatorEnv.POD_NAME) or socket.gethostname()}
