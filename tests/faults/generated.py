"""Random workflows from a seed, and a pure oracle of what each must do however often it is killed.

A *program* is JSON: a list of operations that ``workflows/generated_flows.py:program`` interprets as a
workflow. ``generate(seed)`` draws one; the oracle (``expected_result``, ``expected_steps``,
``late_events``) computes, from the program alone, the result an uncrashed run returns, every step and
compensation that must execute and how many calls each makes in one process, and the events the driver
must send after the run stops to wait for them. ``check_ledger`` then holds a run's execution ledger to
exactly what docs/design.md permits under SIGKILL: every step executes in at least one process; a process
that runs it without being killed makes exactly its calls, in one process at most; every other process
that ran it was killed while the step was in flight (started, not yet journaled). So a step executes at
most 1 + the kills that landed while it was in flight, and a journaled step never executes again.

Operations (``op``):

* ``step``: ``name``, ``fails`` (the first ``fails`` calls in a process raise), ``retries``; it fails for
  good when ``fails > retries``: the workflow catches the ``StepError`` and returns ``{"failed": name}``.
* ``gather``: ``branches``, each a list of ``step``, ``sleep`` or (nested) ``gather`` operations, run by
  ``ctx.gather`` (their steps never fail for good: which failure a gather raises is not the oracle's to
  pick). Returns the list of the branches' lists.
* ``sleep``: a durable sleep of ``ms`` (short: slept in process).
* ``wait``: ``event``, ``when`` (``early``: sent before the run starts; ``late``: sent only after the run
  ended its attempt Waiting for it; ``never``: not sent, the wait's short ``timeout_ms`` passes and the
  workflow gets ``EventTimeout``). Returns the payload, or ``"timeout"``.
* ``saga``: ``steps`` (step operations that never fail), each registering a compensation
  ``compensate:undo-<name>``; with ``fail`` (absent: none; a program holds no null, which kubectl apply
  would drop from ``spec.input``), a last step of that name raises ``NonRetryableError``: the
  compensations run last first, the workflow catches the error and returns ``{"undone": fail}``.
* ``child`` (only when generated ``with_children``: child runs need the operator): a child run named
  ``name`` running ``program`` (steps only); returns its result.
* ``continue``: ``ctx.continue_as_new`` (top level only); returns ``"continued"`` in the final result.

Replay a generated program with ``GEN_SEED=<seed>`` (tests/faults/test_generated_local.py and
tests/faults/test_generated_faults.py print the seed of every program they run).
"""

from __future__ import annotations

import hashlib
import itertools
import os
import random
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

Program = list[dict[str, Any]]


def step_result(name: str) -> dict[str, Any]:
    return {"step": name, "digest": hashlib.sha256(name.encode()).hexdigest()[:12]}


def payload(event: str) -> dict[str, Any]:
    return {"event": event, "ok": True}


def seed_stream(what: str) -> Iterator[int]:
    """Program seeds: ``GEN_SEED`` replays one (then only that one), else random ones from a master seed,
    printed first so any failure can be replayed."""
    if os.environ.get("GEN_SEED"):
        yield int(os.environ["GEN_SEED"])
        return
    master = random.SystemRandom().randrange(1 << 32)
    print(f"{what}: programs from master seed {master}; replay one with GEN_SEED=<its seed>")
    rng = random.Random(master)
    while True:
        yield rng.randrange(1 << 32)


def seeds(count: int, what: str) -> list[int]:
    """``count`` program seeds of ``seed_stream`` (``GEN_SEED``: just that one)."""
    return list(itertools.islice(seed_stream(what), count))


@dataclass
class _Names:
    n: int = 0
    events: int = 0

    def step(self) -> str:
        self.n += 1
        return f"s{self.n}"

    def event(self) -> str:
        self.events += 1
        return f"e{self.events}"


def _step(rng: random.Random, names: _Names, *, may_fail: bool) -> dict[str, Any]:
    retries = rng.choice([0, 1, 2])
    fails = rng.choice([0, 0, 0, 1, 2])
    if not may_fail:
        fails = min(fails, retries)
    return {"op": "step", "name": names.step(), "fails": fails, "retries": retries}


def _branch(rng: random.Random, names: _Names, depth: int) -> Program:
    ops: Program = []
    for _ in range(rng.randint(1, 3)):
        roll = rng.random()
        if roll < 0.2 and depth < 2:
            ops.append(_gather(rng, names, depth + 1))
        elif roll < 0.3:
            ops.append({"op": "sleep", "ms": rng.choice([1, 5, 20])})
        else:
            ops.append(_step(rng, names, may_fail=False))
    return ops


def _gather(rng: random.Random, names: _Names, depth: int) -> dict[str, Any]:
    return {"op": "gather", "branches": [_branch(rng, names, depth) for _ in range(rng.randint(2, 4))]}


def generate(seed: int, *, size: int = 8, with_children: bool = False) -> Program:
    """A random program of about ``size`` top-level operations, the same for the same seed."""
    rng = random.Random(seed)
    names = _Names()
    program: Program = []
    kinds = ["step", "step", "gather", "sleep", "wait", "saga", "continue"] + (["child"] if with_children else [])
    for _ in range(rng.randint(max(1, size // 2), size)):
        kind = rng.choice(kinds)
        if kind == "step":
            program.append(_step(rng, names, may_fail=True))
        elif kind == "gather":
            program.append(_gather(rng, names, 1))
        elif kind == "sleep":
            program.append({"op": "sleep", "ms": rng.choice([1, 10, 50])})
        elif kind == "wait":
            when = rng.choice(["early", "late", "late", "never"])
            program.append({"op": "wait", "event": names.event(), "when": when, "timeout_ms": 50})
        elif kind == "saga":
            steps = [_step(rng, names, may_fail=False) for _ in range(rng.randint(1, 3))]
            saga: dict[str, Any] = {"op": "saga", "steps": steps}
            if rng.random() < 0.5:  # no null in a program: kubectl apply drops null fields from spec.input
                saga["fail"] = names.step()
            program.append(saga)
        elif kind == "continue":
            program.append({"op": "continue"})
        else:
            child = [_step(rng, names, may_fail=False) for _ in range(rng.randint(1, 2))]
            program.append({"op": "child", "name": f"c{names.n}", "program": child})
    if not any(op["op"] in ("step", "gather", "saga") for op in program):
        program.append(_step(rng, names, may_fail=True))
    return program


# --- the oracle --------------------------------------------------------------------------------------------

def _value(op: dict[str, Any]) -> Any:
    kind = op["op"]
    if kind == "step":
        return {"failed": op["name"]} if op["fails"] > op["retries"] else step_result(op["name"])
    if kind == "gather":
        return [[_value(o) for o in branch] for branch in op["branches"]]
    if kind == "sleep":
        return "slept"
    if kind == "wait":
        return "timeout" if op["when"] == "never" else payload(op["event"])
    if kind == "saga":
        done = [step_result(s["name"]) for s in op["steps"]]
        return {"undone": op["fail"]} if op.get("fail") else done
    if kind == "child":
        return {"out": [_value(o) for o in op["program"]]}
    if kind == "continue":
        return "continued"
    raise AssertionError(kind)


def expected_result(program: Program) -> dict[str, Any]:
    """What the workflow returns, crashed or not."""
    return {"out": [_value(op) for op in program]}


def _calls(op: dict[str, Any], out: dict[str, int]) -> None:
    kind = op["op"]
    if kind == "step":
        out[op["name"]] = min(op["fails"], op["retries"]) + 1
    elif kind == "gather":
        for branch in op["branches"]:
            for o in branch:
                _calls(o, out)
    elif kind == "saga":
        for s in op["steps"]:
            _calls(s, out)
        if op.get("fail"):
            out[op["fail"]] = 1  # NonRetryableError: one call, no retries
            for s in op["steps"]:
                out[f"compensate:undo-{s['name']}"] = 1
    elif kind == "child":
        for o in op["program"]:
            _calls(o, out)


def expected_steps(program: Program) -> dict[str, int]:
    """Every step and compensation that must execute (a child run's too, in the child's own processes), and
    how many calls (the first try and its retries) one uninterrupted process makes to it."""
    out: dict[str, int] = {}
    for op in program:
        _calls(op, out)
    return out


def late_events(program: Program) -> list[str]:
    """The events the driver sends only once the run has stopped to wait for them, in the order it waits."""
    return [op["event"] for op in program if op["op"] == "wait" and op["when"] == "late"]


def early_events(program: Program) -> list[str]:
    return [op["event"] for op in program if op["op"] == "wait" and op["when"] == "early"]


# --- checking a run against it -----------------------------------------------------------------------------

@dataclass
class Attempt:
    """One runner process: its id in the ledger, whether the test killed it, and the steps journaled when it
    ended (or was killed)."""

    process: str
    killed: bool
    journaled: set[str] = field(default_factory=set)


def check_ledger(program: Program, lines: list[str], attempts: list[Attempt]) -> list[str]:
    """What the run's ledger (``call <step> <process>`` per call) breaks of the oracle; empty when nothing.

    Exact: a step's calls in a process nobody killed are its oracle count, and only one such process runs
    it; a killed process makes at most that many; and no process runs a step that an earlier attempt left
    journaled. Together: every step executes at least once and at most 1 + the kills that landed while it
    was in flight."""
    want = expected_steps(program)
    calls: dict[str, Counter[str]] = {}
    for line in lines:
        kind, name, process = line.split(" ")
        if kind == "call":
            calls.setdefault(name, Counter())[process] += 1
    killed = {a.process for a in attempts if a.killed}
    problems = [f"{name} executed, but the program has no such step (or it must not run)"
                for name in sorted(set(calls) - set(want))]
    for name, count in sorted(want.items()):
        per_process = calls.get(name, Counter())
        if not per_process:
            problems.append(f"{name} never executed")
            continue
        unkilled = [p for p in per_process if p not in killed]
        if len(unkilled) > 1:
            problems.append(f"{name} executed in several processes nobody killed: {dict(per_process)}")
        for p, n in per_process.items():
            if p not in killed and n != count:
                problems.append(f"{name} made {n} calls in process {p}, the oracle says {count}")
            if p in killed and n > count:
                problems.append(f"{name} made {n} calls in killed process {p}, at most {count}")
        for i, attempt in enumerate(attempts):
            if name in attempt.journaled:
                again = [a.process for a in attempts[i + 1:] if a.process in per_process]
                if again:
                    problems.append(f"{name} was journaled when {attempt.process} ended "
                                    f"({'killed' if attempt.killed else 'exited'}), yet executed again in {again}")
                break
    return problems
