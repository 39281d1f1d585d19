"""Rerun and fork: a run's journal cut back to a step (``durablerun rerun`` / ``durablerun fork``).

* :func:`rerun` drops a run's journal from the first record of step STEP on, after copying every object
  of the run to ``archive/<stamp>/`` under its root (nothing is lost): its next attempt executes STEP and
  everything after it again, and replays what came before.
* :func:`fork` makes a new run (a new run id, the same workflow and input) whose journal is a copy of
  the source's records before STEP: the fork executes STEP on, the source is left as it was.

Both take the owner record of every run they write (:mod:`durablerun._private.storage.owner`) without waiting:
refused while an attempt holds the run. Both check everything before writing anything, and record
who did it, when and from where as a fact in ``history/`` next to the journal (a new journal record kind
would be a new layout version, which SDKs that read layout 1 could not replay).
"""

from __future__ import annotations

import getpass
import socket
import time
from dataclasses import dataclass
from typing import Any

from durablerun import errors
from durablerun._private.records import codec, layout
from durablerun._private.records.model import Record, StepRecord
from durablerun._private.storage.journal import RunStore
from durablerun._private.storage.owner import HeldElsewhere, Holder, OwnerLease
from durablerun._private.storage.stores import Store
from durablerun.api import format_time, input_hash

#: Held only while the journal is cut or copied: seconds, never an attempt's length.
HOLD_SECONDS = 60.0


@dataclass(frozen=True)
class Origin:
    """Who asked for a rerun or fork, and from where (recorded in the run's history)."""

    who: str
    via: str

    @classmethod
    def local(cls) -> Origin:
        return cls(who=getpass.getuser(), via=f"durablerun CLI on host {socket.gethostname()}")


@dataclass(frozen=True)
class Cut:
    """What a rerun or fork did: the run written, the step, and the records kept and dropped."""

    run: str
    step: str
    position: str
    kept: int
    dropped: int
    archive: str | None = None


def first_record_of(records: list[Record], step: str, run: layout.RunRef) -> StepRecord:
    for record in records:
        if isinstance(record, StepRecord) and record.name == step:
            return record
    names = list(dict.fromkeys(r.name for r in records if isinstance(r, StepRecord)))
    shown = ", ".join(names[:10]) + (", ..." if len(names) > 10 else "")
    raise errors.ConfigError(f"--from {step!r}: run {run} has no step by that name in its journal "
                             f"(its steps: {shown or 'none'}); nothing was changed")


def _hold(store: Store, ref: layout.RunRef, what: str) -> OwnerLease:
    """The run's owner record, taken at once or refused (an attempt holds the run)."""
    owner = OwnerLease(store.backend, ref, Holder.local(), HOLD_SECONDS)
    try:
        owner.acquire(patience=0)
    except HeldElsewhere as held:
        raise errors.ConfigError(f"{what} refused: {held}. Stop it first (kubectl durablerun suspend NAME, "
                                 "or wait for the local attempt to end); nothing was changed") from None
    return owner


def _record_fact(rs: RunStore, action: str, origin: Origin, **fields: Any) -> None:
    now = time.time()
    doc = {"action": action, "by": origin.who, "via": origin.via, "time": format_time(now, precise=True),
           **fields}
    stamp = time.strftime("%Y%m%dT%H%M%S", time.gmtime(now)) + f"{now % 1:.6f}"[1:]
    rs.backend.create(rs.key(f"{layout.HISTORY_DIR}{stamp}-{action}.json"), codec.seal(codec.dumps(doc)))


def read_history(rs: RunStore) -> list[dict[str, Any]]:
    """The run's recorded facts (reruns and forks), oldest first."""
    facts = []
    for key in rs.backend.list_keys(rs.key(layout.HISTORY_DIR)):
        body = rs.backend.get(key)
        if body is not None:
            facts.append(codec.loads(codec.unseal(body, what=key), what=key))
    return facts


def read_archives(rs: RunStore) -> dict[str, int]:
    """The copies a rerun left: each archive's folder under the run's root, and its number of objects."""
    archives: dict[str, int] = {}
    for key in rs.backend.list_keys(rs.key(layout.ARCHIVE_DIR)):
        folder = layout.ARCHIVE_DIR + key[len(rs.key(layout.ARCHIVE_DIR)):].split("/", 1)[0] + "/"
        archives[folder] = archives.get(folder, 0) + 1
    return archives


def describe_fact(fact: dict[str, Any]) -> str:
    """One line for humans: what was done, by whom, when and from where."""
    who = f"by {fact.get('by', '?')} ({fact.get('via', '?')}) at {fact.get('time', '?')}"
    where = f"step {fact.get('fromStep')!r} (position {fact.get('fromPosition')}, record {fact.get('fromSeq')})"
    if fact.get("action") == "rerun":
        return (f"rerun from {where} {who}: {fact.get('dropped')} record(s) dropped, the run as it was "
                f"archived under {fact.get('archive')}")
    if fact.get("action") == "fork":
        return (f"forked from run {fact.get('fromRun')} at {where} {who}: its first {fact.get('fromSeq')} "
                "record(s) copied")
    return f"{fact.get('action')} {who}"


def _manifest(rs: RunStore) -> dict[str, Any]:
    manifest = rs.read_manifest()
    if manifest is None:
        raise errors.ConfigError(f"no run {rs.ref} in the store: check --run-id and --store; nothing was changed")
    return manifest


def rerun(store: Store, ref: layout.RunRef, step: str, origin: Origin) -> Cut:
    """Drop run ``ref``'s journal from the first record of ``step`` on (archived first)."""
    rs = store.run_store(ref)
    try:
        _manifest(rs)
        first_record_of(rs.read_all(), step, ref)  # bad input is refused before anything is written
    finally:
        rs.close()
    owner = _hold(store, ref, f"rerun of run {ref}")
    rs = store.run_store(ref)
    try:
        first = first_record_of(rs.read_all(), step, ref)  # again, now that no attempt can append
        stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
        archive = f"{layout.ARCHIVE_DIR}{stamp}/"
        # Streams are kept as they are (a step run again supersedes what it wrote): a copy would only double them.
        # Logs are the pods', not the journal's.
        skip = (layout.OWNER, layout.ARCHIVE_DIR, layout.HISTORY_DIR, layout.STREAMS_DIR, layout.LOGS_DIR)
        for key in store.backend.list_keys(rs.root):
            rel = key[len(rs.root):]
            body = None if rel.startswith(skip) else store.backend.get(key)
            if body is not None:
                store.backend.create(rs.key(archive + rel), body)
        # The snapshot first: a pointer past the journal's end would hand the next attempt dropped records.
        store.backend.delete([rs.key(layout.SNAPSHOT), rs.key(layout.STATUS)])
        dropped = rs.journal().truncate(first.seq)
        _record_fact(rs, "rerun", origin, fromStep=step, fromPosition=first.pos, fromSeq=first.seq,
                     dropped=dropped, archive=archive)
    finally:
        rs.close()
        owner.release()
    return Cut(str(ref), step, first.pos, first.seq, dropped, archive)


def fork(store: Store, ref: layout.RunRef, step: str, new: layout.RunRef, origin: Origin,
         input: Any = None) -> Cut:
    """A new run ``new``: run ``ref``'s workflow and input, its journal a copy of ``ref``'s before ``step``."""
    if store.backend.list_keys(f"{new.path}/"):
        raise errors.ConfigError(f"--to {new.name!r}: run {new} exists in {store.uri}; pick another name "
                                 "(durablerun list shows the runs there); nothing was written")
    source = store.run_store(ref)
    try:
        manifest = _manifest(source)
        if input is not None and input_hash(input) != manifest.get("input_sha256"):
            raise errors.ConfigError(
                f"--input: differs from run {ref}'s input, and a fork keeps its source's input (the copied "
                "steps were computed from it): drop --input, or start a new run; nothing was written")
        held = _hold(store, ref, f"fork of run {ref}")
        held.release()  # checked: no attempt is writing the source now; a fork only reads it
        records = source.read_all()
        first = first_record_of(records, step, ref)
        policy = source.read_policy()
        blobs = store.backend.list_keys(source.key(layout.BLOBS_DIR))
    finally:
        source.close()
    owner = _hold(store, new, f"fork to run {new}")
    target = store.run_store(new)
    try:
        if not target.create_manifest({**manifest, "run": new.key, "created": format_time(time.time(), precise=True),
                                       "forkedFrom": {"run": ref.key, "step": step, "seq": first.seq}}) \
                .get("forkedFrom"):
            raise errors.ConfigError(f"--to {new.name!r}: run {new} was created meanwhile; nothing was written")
        for key in blobs:
            body = store.backend.get(key)
            if body is not None:
                store.backend.create(target.key(key[len(source.root):]), body)
        if policy is not None:
            target.write_policy(policy)
        for record in records[: first.seq]:
            target.append(record)  # the same bytes, at the same sequence numbers
        _record_fact(target, "fork", origin, fromRun=ref.key, fromStep=step, fromPosition=first.pos,
                     fromSeq=first.seq)
    finally:
        target.close()
        owner.release()
    return Cut(str(new), step, first.pos, first.seq, len(records) - first.seq)
