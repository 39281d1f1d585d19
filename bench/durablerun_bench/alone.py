"""One section run by itself (``python -m durablerun_bench.<section>``): its work directory, an id that marks its
processes, MinIO when it needs one, the load before and after, and its RESULTS.md section printed with its JSON.
Everything it started is stopped when it ends, as ``make bench`` does."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import tempfile
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from durablerun_bench import machine
from durablerun_testbed import procs
from durablerun_testbed.s3 import S3Server

BUCKET = "bench"


@dataclass
class Alone:
    root: Path
    run_id: str
    load: list[float]
    s3: S3Server | None = None

    @property
    def s3_params(self) -> dict[str, Any]:
        """What the sections take as ``s3``: MinIO's endpoint, credentials and bucket."""
        assert self.s3, "this section was started without MinIO"
        return {"endpoint": self.s3.endpoint_url, "access_key": self.s3.access_key,
                "secret_key": self.s3.secret_key, "bucket": BUCKET}

    def report(self, lines: list[str], result: dict[str, Any]) -> None:
        print("\n".join(lines))
        print(json.dumps({**result, "load_before": self.load, "load_after": machine.load()}))


@contextlib.contextmanager
def alone(section: str, *, s3: bool = False) -> Iterator[Alone]:
    root = Path(tempfile.mkdtemp(prefix=f"durablerun-bench-{section}-"))
    run = Alone(root, "bench-" + uuid.uuid4().hex[:8], machine.load())
    try:
        if s3:
            run.s3 = S3Server(root / "s3", run.run_id).start()
            run.s3.create_bucket(BUCKET)
        yield run
    finally:
        if run.s3:
            run.s3.stop()
        for pid, _ in procs.processes_with_marker(run.run_id):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        if not os.environ.get("BENCH_KEEP"):
            shutil.rmtree(root, ignore_errors=True)
