"""Store errors a user can fix: missing or wrong credentials, a missing bucket, a damaged journal.

Credential and bucket errors are usage errors (exit 2, one clear line, no
traceback); a damaged journal record stops the run loudly and nothing is
replaced. All against the real MinIO and the real filesystem.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from durablerun import errors
from durablerun._private.records import layout
from durablerun.api import Outcome
from durablerun.engine import Run
from durablerun.stores import RunRef, open_store
from tests.helpers.local_runs import StoreSpec, wait_until

from .helpers import cli, fs_segment, sub_env


def _cli_env(spec: StoreSpec, **overrides: str) -> dict[str, str]:
    """The environment of a user's shell: only the credentials the test gives, no others."""
    env = sub_env({**spec.env, **overrides})
    for name in ("AWS_PROFILE", "AWS_DEFAULT_PROFILE", "AWS_SESSION_TOKEN"):
        env.pop(name, None)
    env.update(AWS_SHARED_CREDENTIALS_FILE="/nonexistent", AWS_CONFIG_FILE="/nonexistent",
               AWS_EC2_METADATA_DISABLED="true")
    return env


def _durablerun(args: list[str], env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "durablerun", *args], capture_output=True,
                          text=True, env=env, timeout=120, check=False)


def test_credential_and_bucket_errors_are_one_line_usage_errors(s3_spec: StoreSpec) -> None:
    bucket = s3_spec.uri.split("/")[2]
    cases = {
        "wrong secret key": (s3_spec.uri, {"AWS_SECRET_ACCESS_KEY": "wrong-" + "x" * 20},
                             ["access denied", "check the credentials", f"bucket={bucket}"]),
        "unknown access key": (s3_spec.uri, {"AWS_ACCESS_KEY_ID": "nobody"},
                               ["access denied", "check the credentials", f"bucket={bucket}"]),
        "no credentials at all": (s3_spec.uri, {"AWS_ACCESS_KEY_ID": "", "AWS_SECRET_ACCESS_KEY": ""},
                                  ["no usable S3 credentials", "AWS_ACCESS_KEY_ID",
                                   f"bucket={bucket}"]),
        "missing bucket": ("s3://no-such-bucket-here/runs", {},
                           ["the bucket does not exist", "bucket=no-such-bucket-here"]),
    }
    calls = []
    for case, (uri, overrides, says) in cases.items():
        env = _cli_env(s3_spec, **overrides)
        base = ["--run-id", "creds", "--store", uri, *s3_spec.cli_args]
        for args in (["run", "racing:approval", *base, "--input", "{}"],
                     ["run", "racing:approval", *base],  # a resume reads the stored input first
                     ["inspect", *base],
                     ["send-event", *base, "decision", "true"]):
            calls.append((case, says, args, env))
    # Sixteen CLI processes, each mostly importing boto3: four at a time.
    with ThreadPoolExecutor(max_workers=4) as pool:
        results = list(pool.map(lambda call: _durablerun(call[2], call[3]), calls))
    failures = []
    for (case, says, args, _), r in zip(calls, results, strict=True):
        lines = r.stderr.strip().splitlines()
        if (r.returncode != 2 or "Traceback" in r.stderr or len(lines) != 1
                or not all(s in r.stderr for s in says)):
            failures.append(f"{case}: {args[0]}: exit {r.returncode}: {r.stderr!r}")
    assert not failures, "\n".join(failures)
    # Nothing was created with the wrong credentials.
    assert open_store(s3_spec.uri, **s3_spec.options).read_run(run=RunRef.local("creds")).exists is False


def test_an_attempt_with_wrong_keys_ends_as_a_usage_error_naming_the_store(s3_spec: StoreSpec) -> None:
    """What the runner pod reports (UsageError: the operator fails the run once, no restarts)."""
    store = open_store(s3_spec.uri, **{**s3_spec.options, "secret_key": "wrong-" + "y" * 20})
    result = Run(store=store, run=RunRef.kubernetes("team", "r", "u1"), workflow="racing:approval",
                 input={}).run_attempt()
    assert result.outcome == Outcome.USAGE_ERROR
    assert result.exit_code == 2
    assert result.error_type == "durablerun.errors.StoreAccessError"
    assert "check the credentials" in result.message
    assert s3_spec.options["secret_key"] not in result.message
    missing = open_store("s3://no-such-bucket-here/runs", **s3_spec.options)
    result = Run(store=missing, run=RunRef.kubernetes("team", "r", "u1"), workflow="racing:approval",
                 input={}).run_attempt()
    assert result.outcome == Outcome.USAGE_ERROR
    assert result.error_type == "durablerun.errors.StoreNotFoundError"
    assert "no-such-bucket-here" in result.message
    assert issubclass(errors.StoreAccessError, errors.ConfigError)


def test_a_damaged_last_record_stops_the_run_loudly_and_nothing_is_replaced(
        durable_store_spec: StoreSpec, tmp_path: Path) -> None:
    """Filesystem and S3: a run is killed, one digit of its last journal record is changed; the
    resume must not run that step again over it (a torn write is only an incomplete record)."""
    spec = durable_store_spec
    base = ["--run-id", "dmg", "--store", spec.uri, *spec.cli_args]
    marker = tmp_path / "marker"
    proc = subprocess.Popen(
        [sys.executable, "-m", "durablerun", "run", "racing:slow_steps", *base, "--quiet",
         "--input", json.dumps({"marker": str(marker), "steps": 200})],
        env=sub_env(spec.env), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    wait_until(lambda: marker.exists() and len(marker.read_text().split()) >= 4, timeout=60,
               what="a few steps")
    proc.kill()
    proc.wait(timeout=30)
    store = spec.open()
    ref = RunRef.local("dmg")
    last = store.read_run(run=ref).journal_records - 1
    assert last >= 2
    key = ref.path + "/" + (layout.segment_name(0) if spec.kind == "fs" else layout.journal_key(last))
    increment = (re.compile(rb'"value":(\d+)'),
                 lambda m: b'"value":' + str(int(m[1]) + 1).encode())

    def raw() -> object:
        if spec.kind == "fs":
            return fs_segment(store, ref).read_bytes()
        # Every object but the owner record, which each attempt takes and releases (not the journal).
        return [(k, store.backend.get(k)) for k in store.backend.list_keys(ref.path + "/")
                if not k.endswith("/" + layout.OWNER)]

    before = raw()
    if spec.kind == "fs":
        lines = fs_segment(store, ref).read_bytes().rstrip(b"\0").split(b"\n")
        assert lines[-1] == b""
        lines[last] = increment[0].sub(increment[1], lines[last])
        fs_segment(store, ref).write_bytes(b"\n".join(lines))
    else:
        data = store.backend.get(key)
        assert data is not None
        store.backend.put(key, increment[0].sub(increment[1], data))
    damaged = raw()
    assert damaged != before
    ran = marker.read_text().split()
    again = cli(["run", "racing:slow_steps", *base, "--quiet"], env=spec.env)
    assert again.returncode == Outcome.FAILED.exit_code, again.stderr
    assert "Traceback" not in again.stderr
    message = again.stderr
    assert "is damaged" in message, message
    assert "nothing was replaced" in message
    assert spec.uri in message
    assert key.split("/")[-1] in message, message
    if spec.kind == "fs":
        assert f"seq={last}" in message
    assert marker.read_text().split() == ran  # no step ran again
    assert raw() == damaged  # nothing rewritten, nothing appended
