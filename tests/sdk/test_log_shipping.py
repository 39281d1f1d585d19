"""An attempt's stdout and stderr kept in the run's store (logs/<attempt>-<uid>/), shipped from outside the runner.

The parts and their bounds on the filesystem and on MinIO; then the pod's shipper in a real process tree: a
"runner" that prints and then SIGKILLs itself still has every line it wrote in the store, and one that exits
by itself keeps its exit code and has its last lines stored by the time it has exited; and until the runner
names the store, the shipper is a light, niced process that takes no CPU the runner's lease needs.
"""

from __future__ import annotations

import gzip
import os
import signal
import subprocess
import sys
import textwrap
import uuid
from pathlib import Path

import pytest

from durablerun._private.pod import logship
from durablerun._private.records import layout
from durablerun._private.storage import logs
from tests.helpers.local_runs import StoreSpec, sub_env, wait_until

from .helpers import cli


def run_ref() -> layout.RunRef:
    return layout.RunRef.kubernetes("team-a", "logged", uuid.uuid4().hex)


def test_parts_keep_whole_lines_of_both_streams_and_first_write_wins(durable_store_spec: StoreSpec) -> None:
    store, ref = durable_store_spec.open(), run_ref()
    lines = logship.Lines(layout.LOG_ATTEMPT_BYTES)
    lines.feed(1, b"before the store is known\nhalf a ")
    lines.feed(2, b"an error line\n")
    parts = logs.AttemptParts(store.backend, ref, 3, "uid-a")
    lines.feed(1, b"line\n")
    assert lines.ship(parts.store) == len(b"before the store is known\nan error line\nhalf a line\n")
    assert lines.ship(parts.store) == 0, "nothing pending: no part"
    lines.feed(1, b"no newline at the end")
    lines.close()
    lines.ship(parts.store)
    assert logs.read_attempt(store.backend, ref, 3) == \
        b"before the store is known\nan error line\nhalf a line\nno newline at the end\n"
    keys = store.backend.list_keys(f"{ref.path}/logs/")
    assert [k[len(ref.path) + 1:] for k in keys] == ["logs/000003-uid-a/000000.log.gz",
                                                     "logs/000003-uid-a/000001.log.gz"]
    assert logs.archived_attempts(store.backend, ref) == [3]
    assert logs.read_attempt(store.backend, ref, 2) is None

    # Another writer of attempt 3 of the same DurableRun (none should exist: an epoch is one pod's) finds its
    # first part taken: it stores nothing over it, and its text stays pending.
    other = logship.Lines(layout.LOG_ATTEMPT_BYTES)
    other.feed(1, b"somebody else\n")
    with pytest.raises(logs.PartTaken):
        other.ship(logs.AttemptParts(store.backend, ref, 3, "uid-a").store)
    assert other.pending() == len(b"somebody else\n")
    assert b"somebody else" not in (logs.read_attempt(store.backend, ref, 3) or b"")
    # Another DurableRun continuing the same run id counts its own attempts: its attempt 3 is kept apart.
    logs.AttemptParts(store.backend, ref, 3, "uid-b").store(b"the other cluster's attempt 3\n")
    assert logs.read_attempt(store.backend, ref, 3) == (
        b"==> attempt 3 of DurableRun uid uid-a <==\nbefore the store is known\nan error line\nhalf a line\n"
        b"no newline at the end\n==> attempt 3 of DurableRun uid uid-b <==\nthe other cluster's attempt 3\n")
    # The deletion of the run deletes its logs: they have the journal's retention.
    store.delete_run(run=ref)
    assert logs.archived_attempts(store.backend, ref) == []


def test_an_attempt_keeps_its_bound_and_says_what_it_dropped(durable_store_spec: StoreSpec) -> None:
    store, ref = durable_store_spec.open(), run_ref()
    lines = logship.Lines(limit=100)
    for i in range(30):
        lines.feed(1, b"line %02d\n" % i)  # 8 bytes each: 12 lines fit
    lines.feed(2, b"x" * (logship.LINE_PIECE + 10))  # a runaway line without a newline: stored in pieces
    lines.close()
    lines.ship(logs.AttemptParts(store.backend, ref, 1, "uid-a").store)
    text = logs.read_attempt(store.backend, ref, 1) or b""
    assert text.startswith(b"".join(b"line %02d\n" % i for i in range(12)))
    assert b"line 12" not in text
    (marker,) = [line for line in text.splitlines() if line.startswith(b"[durablerun:")]
    assert marker == b"[durablerun: %d more bytes in 19 lines were not kept: an attempt keeps 100 bytes of logs]" \
        % (18 * 8 + logship.LINE_PIECE + 10 + 1)
    # Compressed: the parts are gzip, not the text.
    (key,) = store.backend.list_keys(f"{ref.path}/logs/")
    assert gzip.decompress(store.backend.get(key) or b"") == text


RUNNER = textwrap.dedent("""
    import os, signal, subprocess, sys, time
    from durablerun import resource
    from durablerun._private.pod import logship
    from durablerun._private.records import layout

    shipper = logship.start(layout.LOG_ATTEMPT_BYTES)
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
        logs.AttemptParts(store.backend, layout.RunRef.local(run_id), attempt, "uid-a").store(
            b"attempt %d says hello\n" % attempt)
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


IDLE_RUNNER = textwrap.dedent("""
    import sys
    from durablerun._private.pod import logship
    from durablerun._private.records import layout

    shipper = logship.start(layout.LOG_ATTEMPT_BYTES)
    print(shipper.process.pid, flush=True)
    sys.stdin.readline()  # the test has looked at the shipper
    shipper.close()
""")


def stat_fields(pid: int) -> list[str]:
    """/proc/<pid>/stat after the command's parentheses: state is [0] (field 3), utime [11], stime [12],
    nice [16]."""
    return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()


def test_until_the_store_is_named_the_shipper_is_light_and_gives_way() -> None:
    """The shipper starts beside the runner, before the runner's lease: it must not compete with the runner's
    start (0.4 s of imports for the durablerun package) for the CPU, nor hold the memory the store needs."""
    proc = subprocess.Popen([sys.executable, "-c", IDLE_RUNNER], env=sub_env(), stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE)
    assert proc.stdin
    assert proc.stdout
    try:
        pid = int(proc.stdout.readline())  # it came through the shipper: the shipper is up and forwarding
        fields, runner = stat_fields(pid), stat_fields(proc.pid)
        cpu = (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
        rss_kib = next(int(line.split()[1]) for line in Path(f"/proc/{pid}/status").read_text().splitlines()
                       if line.startswith("VmRSS:"))
        maps = Path(f"/proc/{pid}/maps").read_text()
    finally:
        proc.stdin.close()
        proc.wait(timeout=30)
    assert int(fields[16]) == min(19, int(runner[16]) + logship.NICE), "the shipper runs at the runner's priority"
    assert cpu < 0.2, f"the shipper took {cpu:.2f} s of CPU to start (the durablerun package's imports?)"
    assert "pydantic_core" not in maps, "the store's code (pydantic's) was loaded before it was needed"
    assert rss_kib < 24 * 1024, f"the idle shipper holds {rss_kib} KiB"
