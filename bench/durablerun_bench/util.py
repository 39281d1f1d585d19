"""Small shared pieces: the step payload, latency summaries, subprocess JSON runs."""

from __future__ import annotations

import itertools
import json
import math
import os
import subprocess
import sys
import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

from durablerun import api

if TYPE_CHECKING:
    from durablerun_testbed.testbed import TestBed

RESULT_BYTES = 1024
_FILLER = "abcdefghijklmnopqrstuvwxyz0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZ-_"


def payload(i: int) -> str:
    """The 1 KB step result: 1,024 ASCII characters, different for every step."""
    head = f"{i:010d}"
    body = (_FILLER * (RESULT_BYTES // len(_FILLER) + 1))[: RESULT_BYTES - len(head)]
    return head + body


def quick() -> bool:
    """BENCH_QUICK=1: a fast smoke run with smaller sizes."""
    return os.environ.get("BENCH_QUICK", "") not in ("", "0")


def percentile(values: Sequence[float], q: float) -> float:
    """The q-th percentile (0..100), nearest-rank on sorted data; nan when empty."""
    if not values:
        return math.nan
    ordered = sorted(values)
    rank = max(1, math.ceil(q / 100 * len(ordered)))
    return ordered[min(rank, len(ordered)) - 1]


def latencies(values: Sequence[float]) -> dict[str, float]:
    """p50, p90, p99 and max of ``values`` (seconds), nearest-rank."""
    return {"p50": percentile(values, 50), "p90": percentile(values, 90), "p99": percentile(values, 99),
            "max": max(values) if values else math.nan}


def kube_items(bed: TestBed, resource: str, namespace: str) -> list[dict[str, Any]]:
    """Every object of ``resource`` in ``namespace``, read with the bed's kubectl."""
    return list(json.loads(bed.kubectl("get", resource, "-n", namespace, "-o", "json").stdout)["items"])


def api_time(value: str | None) -> datetime:
    """A timestamp of an API object (RFC 3339, to the second), which must be there."""
    parsed = api.parse_time(value)
    assert parsed is not None, value
    return parsed


@dataclass
class Series:
    """Per-operation latencies of one measured run (seconds)."""

    name: str
    latencies: list[float]
    wall: float  # seconds from the first operation's start to the last one's end
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def ops_per_s(self) -> float:
        return len(self.latencies) / self.wall if self.wall > 0 else math.nan

    @property
    def mean_ms(self) -> float:
        return 1000 * self.wall / len(self.latencies) if self.latencies else math.nan

    def p(self, q: float) -> float:
        return 1000 * percentile(self.latencies, q)

    def summary(self) -> dict[str, Any]:
        return {"name": self.name, "n": len(self.latencies), "ops_per_s": self.ops_per_s,
                "mean_ms": self.mean_ms, "p50_ms": self.p(50), "p99_ms": self.p(99),
                "wall_s": self.wall, **self.extra}


def intervals(stamps: Sequence[float]) -> tuple[list[float], float]:
    """Latencies between consecutive step starts, and the wall time they span."""
    diffs = [b - a for a, b in itertools.pairwise(stamps)]
    return diffs, (stamps[-1] - stamps[0]) if len(stamps) > 1 else 0.0


def best_of(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """The median run by throughput (of an odd number of repeats), with every run's rate kept."""
    ordered = sorted(runs, key=lambda r: float(r["ops_per_s"]))
    chosen = dict(ordered[len(ordered) // 2])
    chosen["runs_ops_per_s"] = [round(float(r["ops_per_s"]), 1) for r in runs]
    return chosen


def run_json(argv: list[str], *, timeout: float = 900, env: dict[str, str] | None = None,
             cwd: Path | None = None) -> dict[str, Any]:
    """Run ``python -m <argv>`` in a fresh interpreter; its last stdout line is JSON."""
    started = time.monotonic()
    proc = subprocess.run([sys.executable, "-m", *argv], capture_output=True, text=True, timeout=timeout,
                          env=env, cwd=cwd)
    if proc.returncode != 0:
        raise RuntimeError(f"{' '.join(argv)} exited {proc.returncode} after {time.monotonic() - started:.1f}s:\n"
                           f"{proc.stderr[-4000:]}")
    lines = [line for line in proc.stdout.splitlines() if line.startswith("{")]
    if not lines:
        raise RuntimeError(f"{' '.join(argv)} printed no JSON:\n{proc.stdout[-2000:]}\n{proc.stderr[-2000:]}")
    result: dict[str, Any] = json.loads(lines[-1])
    return result


def emit(result: Any) -> None:
    """Print a result as the JSON line ``run_json`` reads."""
    if hasattr(result, "__dataclass_fields__"):
        result = asdict(result)
    sys.stdout.write(json.dumps(result) + "\n")
    sys.stdout.flush()


def put_objects(client: Any, bucket: str, objects: Sequence[tuple[str, bytes]]) -> None:
    """Write many objects at once (16 at a time), backing off while MinIO's drive falls behind (SlowDownWrite)."""
    def put(kv: tuple[str, bytes]) -> None:
        for attempt in range(8):
            try:
                client.put_object(Bucket=bucket, Key=kv[0], Body=kv[1])
                return
            except Exception as e:
                if "SlowDown" not in str(e) or attempt == 7:
                    raise
                time.sleep(0.2 * 2 ** attempt)

    with ThreadPoolExecutor(max_workers=16) as pool:
        list(pool.map(put, objects))
