"""What a test session's beds leave in the machine, found and removed, however the session ended.

A bed's processes run in sessions of their own, and a real node's containers in the bed's cgroups, so they
outlive whatever started them unless it stops them. A session ended by a signal stops its beds itself
(``tests/conftest.py`` turns SIGTERM and SIGINT into an orderly teardown) and :func:`sweep` removes what that
left. A session ended by SIGKILL can do nothing: every owner of beds (a pytest session, or each xdist worker)
records itself when it starts (:func:`register`: its id, which starts every bed id it uses, its pid and the
pid's start time, its directory), and the next session, or ``make clean``, sweeps the beds of every owner
whose process is gone (:func:`reap_orphans`), never those of a live one.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
from dataclasses import asdict, dataclass
from pathlib import Path

from durablerun_testbed import procs, realnode

#: One record per owner of beds: under /run, which no reboot carries over (nor the processes it names); a user
#: who may not write there (who can run no real node either) keeps them in their cache.
RECORDS = (Path("/run/durablerun-testbed/owners") if os.access("/run", os.W_OK)
           else Path.home() / ".cache" / "durable-run" / "testbed-owners")


@dataclass(frozen=True)
class Owner:
    #: Every bed id of this owner starts with it (its processes' marker, its cgroups, its bridges' aliases).
    id: str
    pid: int
    #: The pid's start time (clock ticks after boot): a pid the kernel gave to a later process is not the owner.
    started: int
    #: The owner's directory (its beds' state, logs and mounts), removed with the rest unless ``keep``.
    root: str
    keep: bool = False

    def alive(self) -> bool:
        return _start_time(self.pid) == self.started


def _start_time(pid: int) -> int | None:
    """The start time of ``pid`` (field 22 of /proc/<pid>/stat), or None when it is gone or a zombie."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except (FileNotFoundError, ProcessLookupError):
        return None
    fields = stat[stat.rindex(")") + 2:].split()  # after "pid (comm) "; comm may hold spaces
    return None if fields[0] == "Z" else int(fields[19])


def register(owner_id: str, root: Path, *, keep: bool = False) -> Owner:
    """Record this process as the owner of the beds whose ids start with ``owner_id``."""
    started = _start_time(os.getpid())
    assert started is not None
    owner = Owner(owner_id, os.getpid(), started, str(root), keep)
    RECORDS.mkdir(parents=True, exist_ok=True)
    (RECORDS / f"{owner_id}.json").write_text(json.dumps(asdict(owner)))
    return owner


def unregister(owner_id: str) -> None:
    (RECORDS / f"{owner_id}.json").unlink(missing_ok=True)


def owners() -> list[Owner]:
    found = []
    for path in sorted(RECORDS.glob("*.json")):
        with contextlib.suppress(FileNotFoundError, ValueError, TypeError):
            found.append(Owner(**json.loads(path.read_text())))
    return found


def remains(owner_id: str, root: Path) -> list[str]:
    """What of the owner's beds is in the machine (empty when nothing is): processes carrying the marker of
    one of its beds, processes in its beds' cgroups, the cgroups, mounts under its directory, pod bridges."""
    found = [f"process {pid}: {cmd}" for pid, cmd in procs.processes_with_marker(owner_id, id_prefix=True)]
    found += [f"process {pid} in a real node's cgroups: {cmd}"
              for pid, cmd in realnode.cgroup_processes(owner_id, id_prefix=True)]
    found += [f"cgroup {path}" for path in realnode.cgroups(owner_id, id_prefix=True)]
    found += [f"mount {point}" for point in realnode.mounts_under(root)]
    found += [f"bridge {bridge}" for bridge in realnode.bridges(owner_id, id_prefix=True)]
    return found


def sweep(owner_id: str, root: Path) -> list[str]:
    """Remove what remains of the owner's beds; return what that was (see :func:`remains`).

    The bed's own processes go first (a kubelet or containerd left running would start containers again), then
    the containers in its cgroups and the cgroups, then mounts, then bridges.
    """
    found = remains(owner_id, root)

    def ended() -> bool:
        left = procs.processes_with_marker(owner_id, id_prefix=True)
        for pid, _ in left:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        return not left

    procs.wait_for(ended, timeout=30, interval=0.1, what=f"the processes of the beds {owner_id}* to exit")
    realnode.end_cgroups(owner_id, id_prefix=True)
    realnode.unmount_under(root)
    for bridge in realnode.bridges(owner_id, id_prefix=True):
        subprocess.run(["ip", "link", "del", bridge], capture_output=True)
    return found


def reap_orphans() -> dict[str, list[str]]:
    """Sweep the beds of every recorded owner that is gone, remove its directory (unless it asked to keep it)
    and its record; owner id -> what was left of its beds. An owner whose beds cannot all be removed (a
    process that will not die) keeps its record for the next try, and says why; the others are still swept."""
    reaped = {}
    for owner in owners():
        if owner.alive():
            continue
        try:
            reaped[owner.id] = sweep(owner.id, Path(owner.root))
        except Exception as error:
            reaped[owner.id] = [f"not all removed, left for the next try: {error}"]
            continue
        if not owner.keep:
            shutil.rmtree(owner.root, ignore_errors=True)
        unregister(owner.id)
    return reaped


def main() -> int:
    """``python -m durablerun_testbed reap`` (``make clean``): what the next test session does first."""
    reaped = reap_orphans()
    for owner_id, found in reaped.items():
        print(f"removed what test session {owner_id} (ended without stopping its beds) left:")
        for thing in found or ["nothing running, its directory only"]:
            print(f"  {thing}")
    if not reaped:
        print("no test session ended without stopping its beds")
    return 0
