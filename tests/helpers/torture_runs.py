"""Runs of the fault suite's workflows (fault_workflows/: the torture workflow and its bad variants) on the
test bed, as the fault, bad-input, security and real-node tests run them: their manifests and input, and the
ledger of step executions with its at-most-once check."""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tests.helpers.runs import WORKFLOWS as OPERATOR_WORKFLOWS
from tests.helpers.runs import RunEnv

WORKFLOWS = Path(__file__).resolve().parent / "fault_workflows"


LEDGER_MOUNT = "/tmp/ledger"  # where RunEnv mounts the ledger directory in runner pods


def manifest(runs: RunEnv, name: str, workflow: str = "torture_flows:torture", input: dict[str, Any] | None = None,
             policy: dict[str, Any] | None = None, snapshot_every: int | None = None, **spec: Any) -> dict[str, Any]:
    """``runs.manifest`` with the fault suite's workflows importable too (and ``checkpoint.snapshotEvery``)."""
    body = runs.manifest(name, workflow, input, policy=policy, **spec)
    if snapshot_every is not None:
        body["spec"]["checkpoint"]["snapshotEvery"] = snapshot_every
    env = body["spec"]["template"]["spec"]["containers"][0]["env"]
    for var in env:
        if var["name"] == "PYTHONPATH":
            var["value"] = f"{WORKFLOWS}:{OPERATOR_WORKFLOWS}"
    return body


def torture_input(name: str, **extra: Any) -> dict[str, Any]:
    return {"ledger": f"{LEDGER_MOUNT}/{name}.txt", "rounds": 3, "width": 3, "pace": 0.15, **extra}


@dataclass
class Ledger:
    """A run's ledger: ``start|done <step> <pod>`` and ``effect <key> <pod>`` lines."""

    lines: list[tuple[str, str, str]]

    @classmethod
    def read(cls, runs: RunEnv, name: str) -> Ledger:
        path = runs.ledger_dir / f"{name}.txt"
        text = path.read_text() if path.exists() else ""
        return cls([tuple(line.split(" ")) for line in text.splitlines() if line])  # type: ignore[misc]

    def starts(self, step: str) -> list[str]:
        """The pods that started ``step``, one entry per execution."""
        return [pod for kind, name, pod in self.lines if kind == "start" and name == step]

    def effects(self) -> dict[str, list[str]]:
        """Idempotency keys the side-effect steps saw, with the pods that saw them."""
        out: dict[str, list[str]] = {}
        for kind, key, _pod in self.lines:
            if kind == "effect":
                out.setdefault(key.rsplit(":", 1)[1], []).append(key)
        return out


def check_executions(ledger: Ledger, steps: list[str], interrupted: set[str],
                     in_flight: Collection[tuple[str, str]] = ()) -> None:
    """Each step ran at least once, at most once per pod, and every pod but one that ran it was interrupted.

    ``interrupted``: pods the test killed or paused. So a step ran at most
    1 + (the number of kills that caught it in flight) times. ``in_flight``: executions (step, pod) that
    had passed their runner's lease check when the runner froze; such a step runs on when its runner wakes,
    whatever ran since, so where its ledger line falls says nothing (docs/faults.md, "The pause kind's
    failure of 2026-11-26").
    """
    for step in steps:
        pods = ledger.starts(step)
        assert pods, f"step {step} never ran"
        assert len(pods) == len(set(pods)), f"step {step} ran twice in one pod: {pods}"
        uninterrupted = [p for p in pods if p not in interrupted]
        assert len(uninterrupted) <= 1, f"step {step} ran in several pods nobody interrupted: {pods}"
        ordered = [p for p in pods if (step, p) not in in_flight]
        if len(ordered) > 1:
            # All but the last execution were cut short; the last is the journaled one.
            assert set(ordered[:-1]) <= interrupted, f"step {step} ran again after {ordered[:-1]} completed it"
    for step, keys in ledger.effects().items():
        assert len(set(keys)) == 1, f"side effect {step} saw different idempotency keys: {keys}"
