"""Helpers shared by SDK tests: running the CLI with this folder's workflows, a reference attempt, and reaching
*under* a store to damage it on purpose (the store matrix's specs and waiting on a condition are in
``tests.helpers.local_runs``, shared with the fault suite)."""

from __future__ import annotations

import subprocess
import sys
import threading
from collections import Counter
from datetime import timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Any

from durablerun._private.records import layout
from durablerun._private.storage.backends.fs import FsBackend
from durablerun._private.storage.backends.memory import MemoryBackend
from durablerun._private.storage.backends.s3 import S3Backend
from durablerun.engine import AttemptResult, EngineConfig, Run
from durablerun.resource import Policy
from durablerun.stores import RunRef, Store
from tests.helpers import local_runs

if TYPE_CHECKING:
    pass

HERE = Path(__file__).resolve().parent
REPO = HERE.parent.parent
WORKFLOWS = HERE / "workflows"


def cli(args: list[str], *, env: dict[str, str] | None = None, cwd: Path | None = None,
        timeout: float = 60) -> subprocess.CompletedProcess[str]:
    """Run ``python -m durablerun ARGS`` and wait for it."""
    return subprocess.run(
        [sys.executable, "-m", "durablerun", *args], capture_output=True, text=True,
        env=sub_env(env), cwd=cwd, timeout=timeout, check=False)


def sub_env(extra: dict[str, str] | None = None) -> dict[str, str]:
    """``local_runs.sub_env`` with this folder's workflows importable."""
    return local_runs.sub_env(extra, workflows=[WORKFLOWS])


FAST = EngineConfig(retry_initial=timedelta(milliseconds=1), retry_max=timedelta(milliseconds=5),
                    snapshot_every=4)
REF = RunRef.local("t")


def attempt(store: Store, wf: Any, input: Any = None, *, ref: RunRef = REF,
            policy: Policy | None = None, config: EngineConfig = FAST,
            sinks: list[Any] | None = None) -> AttemptResult:
    return Run(store=store, run=ref, workflow=wf, input=input or {}, policy=policy,
               config=config, sinks=sinks).run_attempt()


class Ledger:
    """Side effects recorded outside the run: proves what executed how often."""

    def __init__(self) -> None:
        self.calls: Counter[Any] = Counter()
        self.lock = threading.Lock()

    def hit(self, key: Any) -> None:
        with self.lock:
            self.calls[key] += 1


def flip_byte(data: bytes, offset: int) -> bytes:
    b = bytearray(data)
    b[offset] ^= 0x01
    return bytes(b)


def corrupt_journal_record(store: Store, ref: RunRef, seq: int) -> None:
    """Flip one bit inside the body of journal record ``seq`` (not the tail)."""
    backend = store.backend
    root = ref.path + "/"
    if isinstance(backend, MemoryBackend):
        records = backend.raw_journal(root)
        records[seq] = flip_byte(records[seq], len(records[seq]) - 5)
    elif isinstance(backend, FsBackend):
        seg_dir = backend.root / root / "journal"
        start = seq - seq % layout.SEGMENT_RECORDS
        path = seg_dir / layout.segment_name(start)
        lines = path.read_bytes().split(b"\n")
        index = seq - start
        lines[index] = flip_byte(lines[index], len(lines[index]) - 5)
        path.write_bytes(b"\n".join(lines))
    elif isinstance(backend, S3Backend):
        key = backend._key(root + layout.journal_key(seq))
        data = backend._client.get_object(Bucket=backend.bucket, Key=key)["Body"].read()
        backend._client.put_object(Bucket=backend.bucket, Key=key,
                                   Body=flip_byte(data, len(data) - 5))
    else:  # pragma: no cover
        raise AssertionError(backend)


def raw_journal_bytes(store: Store, ref: RunRef) -> list[bytes]:
    """Every journal record as stored, to prove nothing was overwritten."""
    return [data for _, data in store.backend.journal(ref.path + "/").read(0)]


def fs_segment(store: Store, ref: RunRef, start: int = 0) -> Path:
    assert isinstance(store.backend, FsBackend)
    return store.backend.root / ref.path / "journal" / layout.segment_name(start)
