"""An attempt's stdout and stderr kept in the run's store (logs/<attempt>-<uid>/), shipped from outside the runner.

The parts and their bounds on the filesystem and on MinIO; then the pod's shipper in a real process tree: a
"runner" that prints and then SIGKILLs itself still has every line it wrote in the store, and one that exits
by itself keeps its exit code and has its last lines stored by the time it has exited.
"""

from __future__ import annotations

import gzip
import signal
import subprocess
import sys
import textwrap
import uuid

import pytest

from durablerun._private.records import layout
from durablerun._private.storage import logs
from tests.helpers.local_runs import StoreSpec, sub_env, wait_until

from .helpers import cli


def run_ref() -> layout.RunRef:
    return layout.RunRef.kubernetes("team-a", "logged", uuid.uuid4().hex)


def test_parts_keep_whole_lines_of_both_streams_and_first_write_wins(durable_store_spec: StoreSpec) -> None:
    store, ref = durable_store_spec.open(), run_ref()
    log = logs.AttemptLog()
    log.feed(1, b"before the store is known\nhalf a ")
    log.feed(2, b"an error line\n")
    assert log.ship() == 0, "nothing is stored before attach"
    log.attach(store.backend, ref, 3, "uid-a")
    log.feed(1, b"line\n")
    assert log.ship() == len(b"before the store is known\nan error line\nhalf a line\n")
    log.feed(1, b"no newline at the end")
    log.close()
    log.ship()
    assert logs.read_attempt(store.backend, ref, 3) == \
        b"before the store is known\nan error line\nhalf a line\nno newline at the end\n"
    keys = store.backend.list_keys(f"{ref.path}/logs/")
    assert [k[len(ref.path) + 1:] for k in keys] == ["logs/000003-uid-a/000000.log.gz",
                                                     "logs/000003-uid-a/000001.log.gz"]
    assert logs.archived_attempts(store.backend, ref) == [3]
    assert logs.read_attempt(store.backend, ref, 2) is None

    # Another writer of attempt 3 of the same DurableRun (none should exist: an epoch is one pod's) finds its
    # first part taken: it stores nothing over it.
    other = logs.AttemptLog()
    other.attach(store.backend, ref, 3, "uid-a")
    other.feed(1, b"somebody else\n")
    with pytest.raises(logs.PartTaken):
        other.ship()
    assert b"somebody else" not in (logs.read_attempt(store.backend, ref, 3) or b"")
    # Another DurableRun continuing the same run id counts its own attempts: its attempt 3 is kept apart.
    continuer = logs.AttemptLog()
    continuer.attach(store.backend, ref, 3, "uid-b")
    continuer.feed(1, b"the other cluster's attempt 3\n")
    continuer.ship()
    assert logs.read_attempt(store.backend, ref, 3) == (
        b"==> attempt 3 of DurableRun uid uid-a <==\nbefore the store is known\nan error line\nhalf a line\n"
        b"no newline at the end\n==> attempt 3 of DurableRun uid uid-b <==\nthe other cluster's attempt 3\n")
    # The deletion of the run deletes its logs: they have the journal's retention.
    store.delete_run(run=ref)
    assert logs.archived_attempts(store.backend, ref) == []


def test_an_attempt_keeps_its_bound_and_says_what_it_dropped(durable_store_spec: StoreSpec) -> None:
    store, ref = durable_store_spec.open(), run_ref()
    log = logs.AttemptLog(limit=100)
    log.attach(store.backend, ref, 1, "uid-a")
    for i in range(30):
        log.feed(1, b"line %02d\n" % i)  # 8 bytes each: 12 lines fit
    log.feed(2, b"x" * (logs.LINE_PIECE + 10))  # a runaway line without a newline: stored in pieces
    log.close()
    log.ship()
    text = logs.read_attempt(store.backend, ref, 1) or b""
    assert text.startswith(b"".join(b"line %02d\n" % i for i in range(12)))
    assert b"line 12" not in text
    (marker,) = [line for line in text.splitlines() if line.startswith(b"[durablerun:")]
    assert marker == b"[durablerun: %d more bytes in 19 lines were not kept: an attempt keeps 100 bytes of logs]" \
        % (18 * 8 + logs.LINE_PIECE + 10 + 1)
    # Compressed: the parts are gzip, not the text.
    (key,) = store.backend.list_keys(f"{ref.path}/logs/")
    assert gzip.decompress(store.backend.get(key) or b"") == text


RUNNER = textwrap.dedent("""
    import os, signal, subprocess, sys, time
    from durablerun import resource
    from durablerun._private.pod import logship
    from durablerun._private.records import layout

    shipper = logship.start()
    print("early line, before the store is known", flush=True)
    shipper.ship_to(resource.Checkpoint(uri=sys.argv[1], endpoint=sys.argv[2] or None),
                    layout.RunRef("team-a", "logged", sys.argv[3]), 1, sys.argv[3])
    print("to stdout", flush=True)
    print("to stderr", file=sys.stderr, flush=True)
    subprocess.run([sys.executable, "-c", "print('from a step subprocess')"], check=True)
    if sys.argv[4] == "kill":
        os.kill(os.getpid(), signal.SIGKILL)
    if sys.argv[4] == "shipper-dies":
        shipper.process.kill()
        deadline = time.monotonic() + 30
        while shipper.saved is not None and time.monotonic() < deadline:  # its watcher gives the fds back
            time.sleep(0.01)
        print("after the shipper", flush=True)
    shipper.close()
    sys.exit(7)
""")


@pytest.mark.parametrize("end", ["kill", "exit"])
def test_the_pods_shipper_keeps_what_the_runner_wrote(durable_store_spec: StoreSpec, end: str) -> None:
    store, ref = durable_store_spec.open(), run_ref()
    assert ref.uid
    endpoint = durable_store_spec.options.get("endpoint_url", "")
    proc = subprocess.run([sys.executable, "-c", RUNNER, durable_store_spec.uri, endpoint, ref.uid, end],
                          env=sub_env(durable_store_spec.env), capture_output=True, timeout=60, check=False)
    assert proc.returncode == (-signal.SIGKILL if end == "kill" else 7), proc.stderr
    # The container's own streams still get every line, each on its own stream.
    assert proc.stdout.splitlines()[:2] == [b"early line, before the store is known", b"to stdout"]
    assert b"from a step subprocess" in proc.stdout
    assert b"to stderr" in proc.stderr
    assert b"to stdout" not in proc.stderr
    wanted = {b"early line, before the store is known", b"to stdout", b"to stderr", b"from a step subprocess"}

    def stored() -> bool:
        return wanted <= set((logs.read_attempt(store.backend, ref, 1) or b"").splitlines())

    if end == "exit":  # the runner waited for its shipper: nothing left to wait for
        assert stored(), logs.read_attempt(store.backend, ref, 1)
    else:  # the shipper outlives the killed runner by the moment it takes to store the rest
        wait_until(stored, timeout=30, what="the killed runner's lines in the store", interval=0.05)


def test_durablerun_logs_reads_a_run_ids_stored_attempts(durable_store_spec: StoreSpec) -> None:
    """A DurableRun with spec.checkpoint.runId keeps its pods' logs under _local/<run-id>/: the local CLI
    reads them with the options that name any run id's journal."""
    store, run_id = durable_store_spec.open(), f"logged-{uuid.uuid4().hex[:8]}"
    for attempt in (1, 2):
        log = logs.AttemptLog()
        log.attach(store.backend, layout.RunRef.local(run_id), attempt, "uid-a")
        log.feed(1, b"attempt %d says hello\n" % attempt)
        log.ship()
    where = ["--run-id", run_id, "--store", durable_store_spec.uri, *durable_store_spec.cli_args]
    listed = cli(["logs", *where], env=durable_store_spec.env)
    assert (listed.returncode, listed.stdout) == (0, "the store keeps the logs of attempts 1, 2 (--attempt N)\n"), \
        listed.stderr
    one = cli(["logs", *where, "--attempt", "1"], env=durable_store_spec.env)
    assert (one.returncode, one.stdout) == (0, "attempt 1 says hello\n"), one.stderr
    missing = cli(["logs", *where, "--attempt", "3"], env=durable_store_spec.env)
    assert missing.returncode == 1
    assert "no logs of attempt 3: the store keeps the logs of attempts 1, 2" in missing.stderr


def test_a_shipper_that_dies_first_does_not_break_the_runners_writes(durable_store_spec: StoreSpec) -> None:
    ref = run_ref()
    assert ref.uid
    endpoint = durable_store_spec.options.get("endpoint_url", "")
    proc = subprocess.run([sys.executable, "-c", RUNNER, durable_store_spec.uri, endpoint, ref.uid, "shipper-dies"],
                          env=sub_env(durable_store_spec.env), capture_output=True, timeout=60, check=False)
    assert proc.returncode == 7, proc.stderr
    assert b"after the shipper" in proc.stdout
    assert b"the log shipper exited (-9); the rest of this attempt's logs are not stored" in proc.stderr
