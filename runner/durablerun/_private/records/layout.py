"""The key scheme of a run's store: one module owns it, and it is versioned.

Layout version 1. Under the store's prefix a run lives at::

    <prefix>/<namespace>/<name>/<uid>/     a DurableRun on Kubernetes
    <prefix>/_local/<run-id>/              a run named by a run id: ``durablerun run --run-id``,
                                           or a DurableRun with ``spec.checkpoint.runId``

(``_local`` can never clash with a Kubernetes namespace: namespaces are DNS
labels and cannot start with an underscore. The prefix keeps the name it was
given when only the local CLI named runs.) Inside a run's root::

    manifest.json              created once: layout, workflow, input + its hash, code version
    journal/<seq:012d>.json    one sealed record per journal sequence number (S3, memory), or on S3
                               a group: records <seq>, <seq>+1, ... that one write committed together
                               (at most GROUP_RECORDS; :func:`pack_group`)
    journal/<start:012d>.log   append-only segments of sealed records, one per line (filesystem)
    snapshot.json              pointer to the latest snapshot (compare-and-swap)
    chunks/<sha256>.json       immutable runs of journal records a snapshot points to
    blobs/<sha256>.json        big step results, content-addressed, referenced from records
    events/<name>.json         events, first write wins
    status.json                the last attempt's outcome and what a Waiting run waits for (claimedBy: the
                               attempt that claimed it and has not written its outcome yet:
                               journal.RunStore.claim_status)
    policy.json                a local run's policy (budgets), recorded at its first attempt
    owner.json                 a run id's owner record: who may write it now (compare-and-swap;
                               :mod:`durablerun._private.storage.owner`)
    streams/<name>/<offset:012d>.json  one chunk of output stream <name> (``ctx.stream``): offsets count
                               from 0 with no gap, first write wins, so two attempts never own one offset
                               (:mod:`durablerun._private.storage.streams`)
    children/<child>.json      a child run this run asked for (``ctx.start_child``) where no operator
                               keeps the request: ``durablerun run``, ``WorkflowTest``
                               (:mod:`durablerun._private.engine.family`); first write wins
    history/<time>-<action>.json  facts about the run: a rerun or fork (who, when, from where, what)
    archive/<time>/...         a copy of every object above (streams/ aside) as it was before a rerun dropped records
                               (:mod:`durablerun._private.tools.reruns`; readers of layout 1 ignore these
                               three)
    logs/<attempt:06d>-<uid>/<part:06d>.log.gz
                               what an attempt's runner wrote to stdout and stderr, in the order it was
                               written, as gzip parts to concatenate in order (first write wins); the
                               attempt is the pod's epoch (``kubectl durablerun logs --attempt``), the uid
                               its DurableRun's (a run id's journal may be continued by several, each
                               counting its own epochs; a fenced attempt writes only its own). At most
                               LOG_ATTEMPT_BYTES of text per attempt, then one line says what was dropped
                               (:mod:`durablerun._private.storage.logs`). Kept and deleted with the run;
                               never read back by a runner, never archived by a rerun.

Every object is sealed (see :mod:`durablerun._private.records.codec`), but the logs: plain text, gzipped.

Retention: nothing here expires on its own. A run's objects, its streams and logs included, live as long as
its root does: until ``durablerun delete``, or on Kubernetes the DurableRun's deletion under
``checkpoint.retention: Delete`` (``Retain``, the default, keeps them), or the bucket's own lifecycle rules.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass

from durablerun import api, errors, resource

LAYOUT_VERSION = 1
SEQ_DIGITS = 12
# Filesystem journal segments hold this many records each (part of layout v1).
SEGMENT_RECORDS = 4096

# At most this many records share one journal object (S3 group commit; part of layout v1): a reader
# looking for record n finds it in an object named n - GROUP_RECORDS + 1 .. n.
GROUP_RECORDS = 64

# An attempt keeps at most this much of its stdout and stderr (raw text, before gzip; part of layout v1).
LOG_ATTEMPT_BYTES = 8 * 1024 * 1024

LOCAL_NAMESPACE = api.LOCAL_NAMESPACE

_RUN_ID_RE = re.compile(resource.RUN_ID_PATTERN)
_DNS_RE = re.compile(r"^[a-z0-9]([-a-z0-9.]{0,251}[a-z0-9])?$")
_UID_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9-]{0,63}$")


@dataclass(frozen=True)
class RunRef:
    """Identity of one run, and so where its objects live in a store.

    Use :meth:`kubernetes` for a DurableRun and :meth:`local` for a run the
    local CLI started with ``--run-id``.
    """

    namespace: str
    name: str
    uid: str | None = None

    @classmethod
    def kubernetes(cls, namespace: str, name: str, uid: str) -> RunRef:
        for field, value, pattern in (
            ("namespace", namespace, _DNS_RE),
            ("name", name, _DNS_RE),
            ("uid", uid, _UID_RE),
        ):
            if not pattern.match(value):
                raise errors.ConfigError(f"invalid run {field} {value!r}")
        return cls(namespace, name, uid)

    @classmethod
    def local(cls, run_id: str) -> RunRef:
        if not _RUN_ID_RE.match(run_id):
            raise errors.ConfigError(
                f"--run-id {run_id!r} is not a valid run id: use 1-128 letters, digits, '.', "
                "'_' or '-', starting with a letter or digit"
            )
        return cls(LOCAL_NAMESPACE, run_id, None)

    @classmethod
    def durable_run(cls, namespace: str, name: str, uid: str, run_id: str | None) -> RunRef:
        """The journal a DurableRun continues: its ``spec.checkpoint.runId``'s, or by default its own."""
        return cls.local(run_id) if run_id else cls.kubernetes(namespace, name, uid)

    @property
    def path(self) -> str:
        """The run's root relative to the store prefix (no trailing slash)."""
        if self.uid is None:
            return f"{self.namespace}/{self.name}"
        return f"{self.namespace}/{self.name}/{self.uid}"

    @property
    def key(self) -> str:
        """Stable identity used in idempotency keys and trace ids: ``<namespace>/<name>[/<uid>]`` (api.run_key)."""
        return self.path

    def __str__(self) -> str:
        return self.path


MANIFEST = "manifest.json"
SNAPSHOT = "snapshot.json"
STATUS = "status.json"
POLICY = "policy.json"
OWNER = "owner.json"
JOURNAL_DIR = "journal/"
CHUNKS_DIR = "chunks/"
BLOBS_DIR = "blobs/"
EVENTS_DIR = "events/"
HISTORY_DIR = "history/"
CHILDREN_DIR = "children/"
ARCHIVE_DIR = "archive/"
STREAMS_DIR = "streams/"

#: A stream's name: a path segment of its keys, so no '/' and nothing a shell or URL must quote.
STREAM_NAME_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$"
_STREAM_NAME_RE = re.compile(STREAM_NAME_PATTERN)

LOGS_DIR = "logs/"


def journal_key(seq: int) -> str:
    return f"{JOURNAL_DIR}{seq:0{SEQ_DIGITS}d}.json"


def seq_of_journal_key(name: str) -> int | None:
    """The sequence number of ``journal/<seq>.json`` (relative key), else None."""
    if not name.startswith(JOURNAL_DIR) or not name.endswith(".json"):
        return None
    digits = name[len(JOURNAL_DIR) : -len(".json")]
    if len(digits) != SEQ_DIGITS or not digits.isdigit():
        return None
    return int(digits)


_GROUP_HEAD = b'{"group":'


def pack_group(first: int, records: list[bytes]) -> bytes:
    """One journal object holding the sealed records ``first``, ``first + 1``, ...: a header line
    ``{"group":<first>,"count":<n>}``, then one sealed record per line (sealed JSON has no raw
    newline). A single record is stored as itself, so such an object reads as before."""
    if not 1 < len(records) <= GROUP_RECORDS:
        raise ValueError(f"a group holds 2..{GROUP_RECORDS} records, not {len(records)}")
    head = b'%s%d,"count":%d}' % (_GROUP_HEAD, first, len(records))
    return b"\n".join([head, *records])


def unpack_journal_object(seq: int, data: bytes, *, key: str) -> list[tuple[int, bytes]]:
    """The records a journal object named ``seq`` holds: itself, or each record of its group."""
    if not data.startswith(_GROUP_HEAD):
        return [(seq, data)]
    head, *records = data.split(b"\n")
    try:
        meta = json.loads(head)
        first, count = int(meta["group"]), int(meta["count"])
    except (ValueError, KeyError, TypeError):
        raise errors.CorruptionError("journal group header does not parse", key=key) from None
    if first != seq or count != len(records):
        raise errors.CorruptionError(
            f"journal group names records {first}..{first + count - 1} but is stored at {seq} with "
            f"{len(records)}", key=key)
    return [(seq + i, r) for i, r in enumerate(records)]


def segment_name(start: int) -> str:
    return f"{start:0{SEQ_DIGITS}d}.log"


def chunk_key(sha256: str) -> str:
    return f"{CHUNKS_DIR}{sha256}.json"


def blob_key(sha256: str) -> str:
    return f"{BLOBS_DIR}{sha256}.json"


def child_request_key(child: str) -> str:
    return f"{CHILDREN_DIR}{child}.json"


def event_key(name: str) -> str:
    return f"{EVENTS_DIR}{api.check_event_name(name)}.json"


def stream_name_error(name: object) -> str | None:
    """Why ``name`` cannot name a stream, or None when it can."""
    if isinstance(name, str) and _STREAM_NAME_RE.match(name):
        return None
    return (f"invalid stream name {name!r}: use 1-128 letters, digits, '.', '_' or '-', starting with a "
            "letter or digit")


def stream_dir(name: str) -> str:
    return f"{STREAMS_DIR}{name}/"


def stream_key(name: str, offset: int) -> str:
    return f"{stream_dir(name)}{offset:0{SEQ_DIGITS}d}.json"


def offset_of_stream_key(name: str, key: str) -> int | None:
    """The offset of ``streams/<name>/<offset>.json`` (relative key), else None."""
    head = stream_dir(name)
    digits = key[len(head):-len(".json")] if key.startswith(head) and key.endswith(".json") else ""
    return int(digits) if len(digits) == SEQ_DIGITS and digits.isdigit() else None


def log_part_key(attempt: int, writer: str, part: int) -> str:
    return f"{log_attempt_dir(attempt, writer)}{part:06d}.log.gz"


def log_attempt_dir(attempt: int, writer: str) -> str:
    """The folder of attempt ``attempt``'s logs, written by DurableRun ``writer`` (its uid)."""
    return f"{LOGS_DIR}{attempt:06d}-{writer}/"


def log_dir_of_key(name: str) -> tuple[int, str] | None:
    """The attempt and writer of ``logs/<attempt>-<uid>/<part>.log.gz`` (relative key), else None."""
    if not name.startswith(LOGS_DIR) or not name.endswith(".log.gz"):
        return None
    folder, _, part = name[len(LOGS_DIR):].partition("/")
    attempt, _, writer = folder.partition("-")
    if not (attempt.isdigit() and writer and part[:-len(".log.gz")].isdigit()):
        return None
    return int(attempt), writer
