"""Operator settings, grouped by concern, read once from the environment."""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Any

from durablerun import __version__, api


def _env_number(name: str, default: float, kind: type[int] | type[float]) -> Any:
    raw = os.environ.get(name)
    if raw is None or raw == "":
        return default
    try:
        return kind(raw)
    except ValueError:
        what = "a whole number" if kind is int else "a number"
        raise SystemExit(f"{name}={raw!r} is not {what}: set it to e.g. {default}") from None


@dataclass(frozen=True)
class Settings:
    #: Image of runner pods whose template names none (DURABLERUN_RUNNER_IMAGE).
    runner_image: str = f"ghcr.io/durable-run/runner:{__version__}"
    #: Port of the Prometheus /metrics endpoint (DURABLERUN_METRICS_PORT; 0 disables it).
    metrics_port: int = 9090
    #: Port of the /healthz endpoint for liveness and readiness (DURABLERUN_HEALTH_PORT).
    health_port: int = 8080
    #: Seconds between level-based checks of every active run (DURABLERUN_RESYNC_SECONDS).
    #: Bounds how late a lease expiry, a backoff's end or a wake time is noticed.
    resync_seconds: float = 5.0
    #: Seconds a pod may stay Terminating past its grace period before the next
    #: attempt starts anyway (DURABLERUN_STUCK_TERMINATING_SECONDS). Its node is
    #: presumed lost; the epoch already fences it.
    stuck_terminating_seconds: float = 60.0
    #: This cluster's name (DURABLERUN_CLUSTER, or its earlier name DURABLERUN_CLUSTER_NAME when that is unset),
    #: handed to runners: a run with spec.checkpoint.runId records it in the store's owner record, so that a run
    #: in another cluster names whom it waits for.
    cluster_name: str = ""
    #: The webhook ingress's public base URL (DURABLERUN_WEBHOOK_URL, the chart's webhooks.url); when set,
    #: runner pods get it and the namespace's signing keys, so ctx.webhook_url works (docs/web.md).
    webhook_url: str = ""
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
            cluster_name=os.environ.get(api.OperatorEnv.CLUSTER) or os.environ.get(api.OperatorEnv.CLUSTER_OLD_NAME)
            or "",
            webhook_url=os.environ.get(api.Env.WEBHOOK_URL, ""),
            namespaces=namespaces,
        )
