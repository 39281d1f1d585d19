"""Operator settings, grouped by concern, read once from the environment."""

from __future__ import annotations

import os
from dataclasses import dataclass, field


def _env_int(name: str, default: int) -> int:
    raw = os.environ.get(name)
    if raw is None or raw == "":
        return default
    try:
        return int(raw)
    except ValueError:
        raise SystemExit(f"{name}={raw!r} is not a whole number: set it to e.g. {default}") from None


def _env_float(name: str, default: float) -> float:
    raw = os.environ.get(name)
    if raw is None or raw == "":
        return default
    try:
        return float(raw)
    except ValueError:
        raise SystemExit(f"{name}={raw!r} is not a number: set it to e.g. {default}") from None


@dataclass(frozen=True)
class Settings:
    #: Image of runner pods whose template names none (DURABLERUN_RUNNER_IMAGE).
    runner_image: str = "ghcr.io/durable-run/runner:0.1.0"
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
    #: Namespaces to watch; empty means all (--namespace).
    namespaces: tuple[str, ...] = field(default_factory=tuple)

    @classmethod
    def from_env(cls, namespaces: tuple[str, ...] = ()) -> Settings:
        return cls(
            runner_image=os.environ.get("DURABLERUN_RUNNER_IMAGE") or cls.runner_image,
            metrics_port=_env_int("DURABLERUN_METRICS_PORT", cls.metrics_port),
            health_port=_env_int("DURABLERUN_HEALTH_PORT", cls.health_port),
            resync_seconds=_env_float("DURABLERUN_RESYNC_SECONDS", cls.resync_seconds),
            stuck_terminating_seconds=_env_float(
                "DURABLERUN_STUCK_TERMINATING_SECONDS", cls.stuck_terminating_seconds
            ),
            namespaces=namespaces,
        )
