"""Opening stores by URI, and the store operations other components use."""

from __future__ import annotations

import os
import urllib.parse
import uuid
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from durablerun import errors
from durablerun._private.records import layout
from durablerun._private.records.model import Totals, decode_record
from durablerun._private.storage import extras
from durablerun._private.storage.backends import base
from durablerun._private.storage.backends.fs import FsBackend
from durablerun._private.storage.backends.memory import MemoryBackend
from durablerun._private.storage.backends.options import S3Options
from durablerun._private.storage.journal import RunStore, read_pointer
from durablerun.api import parse_time
from durablerun.resource import Checkpoint


@dataclass(frozen=True)
class CheckpointInfo:
    """The latest durable point of a run."""

    seq: int
    key: str
    time: datetime | None


@dataclass(frozen=True)
class EventInfo:
    name: str
    payload: Any
    sent_at: datetime | None
    id: str | None


@dataclass(frozen=True)
class RunInfo:
    """What a store knows about a run (for status, ``inspect`` and diagnostics)."""

    run: str
    exists: bool
    manifest: dict[str, Any] = field(default_factory=dict)
    totals: Totals = field(default_factory=Totals)
    #: Journal records written (the next sequence number).
    journal_records: int = 0
    checkpoint: CheckpointInfo | None = None
    snapshot_seq: int | None = None
    #: The last attempt's recorded outcome (``status.json``), if any.
    status: dict[str, Any] | None = None
    completed: bool = False
    events: list[str] = field(default_factory=list)

    @property
    def input_hash(self) -> str | None:
        value = self.manifest.get("input_sha256")
        return str(value) if value else None

    @property
    def workflow(self) -> str | None:
        value = self.manifest.get("workflow")
        return str(value) if value else None


class Store:
    """A journal store: a backend plus a prefix, holding many runs.

    The operator uses the keyword-only methods below; the engine uses
    :meth:`run_store`. Open one with :func:`open_store`.
    """

    def __init__(self, backend: base.Backend, uri: str) -> None:
        self.backend = backend
        self.uri = uri

    def describe(self) -> dict[str, Any]:
        """Diagnostics: kind, URI, location and options. Never credentials."""
        return self.backend.describe()

    def check(self) -> None:
        """Raise StoreNotFoundError / StoreAccessError if the store is unusable."""
        self.backend.check()

    def run_store(self, run: layout.RunRef) -> RunStore:
        return RunStore(self.backend, run)

    # --- for the operator and the CLI --------------------------------------------------
    def put_event(self, *, run: layout.RunRef, name: str, payload: Any) -> bool:
        """Store event ``name`` for ``run``. True if this write won (first write wins)."""
        return self.run_store(run).put_event(name, payload, event_id=uuid.uuid4().hex)

    def get_event(self, *, run: layout.RunRef, name: str) -> EventInfo | None:
        doc = self.run_store(run).get_event(name)
        if doc is None:
            return None
        sent = doc.get("sent_at")
        return EventInfo(name, doc.get("payload"), parse_time(sent) if sent else None,
                         doc.get("id"))

    def read_run(self, *, run: layout.RunRef) -> RunInfo:
        """Manifest, counters, latest checkpoint and last outcome of ``run``.

        Reads the snapshot pointer and the journal records after it (not the
        whole journal).
        """
        rs = self.run_store(run)
        try:
            manifest = rs.read_manifest()
            status = rs.read_status()
            events = rs.list_events()
            snapshot = self.backend.get_versioned(rs.key(layout.SNAPSHOT))
            snap_seq = -1
            snap_totals = Totals()
            snap_time = None
            snap_complete = False
            if snapshot is not None:
                pointer = read_pointer(snapshot[0], rs.key(layout.SNAPSHOT))
                snap_seq, snap_totals, snap_complete = pointer.seq, pointer.totals, pointer.complete
                snap_time = parse_time(pointer.time) if pointer.time else None
            tail = rs.journal().read(snap_seq + 1)
        finally:
            rs.close()
        if manifest is None and not tail and snapshot is None:
            return RunInfo(run.key, exists=False, events=events, status=status)
        totals, checkpoint, completed = snap_totals, None, snap_complete
        if snapshot is not None:
            checkpoint = CheckpointInfo(snap_seq, rs.key(layout.SNAPSHOT), snap_time)
        if tail:
            from durablerun._private.records import codec

            seq, sealed = tail[-1]
            key = rs.key(layout.journal_key(seq))
            body = codec.unseal(sealed, what=key)
            last = decode_record(seq, codec.loads(body, what=key), body, key)
            totals = last.totals
            checkpoint = CheckpointInfo(
                seq, key, datetime.fromtimestamp(last.at, UTC) if last.at else None)
            completed = last.kind == "complete"
        records = (tail[-1][0] + 1) if tail else snap_seq + 1
        return RunInfo(run.key, True, manifest or {}, totals, records, checkpoint,
                       snap_seq if snapshot is not None else None, status, completed, events)

    def list_local_runs(self) -> list[str]:
        """The run ids of the local runs (``_local/<run-id>/``) in this store, sorted.

        Lists every object under ``_local/`` (one listing request per 1,000 on S3).
        """
        prefix = f"{layout.LOCAL_NAMESPACE}/"
        ids = set()
        for key in self.backend.list_keys(prefix):
            run_id, _, rest = key[len(prefix):].partition("/")
            if rest == layout.MANIFEST:
                ids.add(run_id)
        return sorted(ids)

    def delete_run(self, *, run: layout.RunRef) -> int:
        """Delete every object of ``run`` (retention: Delete). Returns how many."""
        return self.run_store(run).delete()

    def close(self) -> None:
        self.backend.close()

    def __repr__(self) -> str:
        return f"Store({self.uri!r})"


def open_store(
    uri: str,
    *,
    endpoint_url: str | None = None,
    region: str | None = None,
    server_side_encryption: str | None = None,
    kms_key_id: str | None = None,
    access_key: str | None = None,
    secret_key: str | None = None,
    session_token: str | None = None,
) -> Store:
    """Open ``s3://bucket/prefix``, ``file:///path`` (or ``file://./relative``) or ``memory://name``.

    S3 credentials default to boto3's chain (``AWS_ACCESS_KEY_ID`` /
    ``AWS_SECRET_ACCESS_KEY``, web identity, instance profile ...);
    ``endpoint_url`` defaults to ``$AWS_ENDPOINT_URL_S3`` / ``$AWS_ENDPOINT_URL``.
    Raises ConfigError (naming the URI and the fix) for anything malformed.
    """
    if not isinstance(uri, str) or "://" not in uri:
        raise errors.ConfigError(
            f"store URI {uri!r} has no scheme: use s3://bucket/prefix, file:///absolute/path "
            "or memory://name (--store / checkpoint.uri)"
        )
    parsed = urllib.parse.urlparse(uri)
    scheme = parsed.scheme.lower()
    if scheme == "memory":
        return Store(MemoryBackend(parsed.netloc + parsed.path or "default"), uri)
    if scheme == "file":
        if parsed.netloc in ("", "localhost"):
            path = parsed.path
        elif parsed.netloc in (".", ".."):
            path = parsed.netloc + parsed.path
        else:
            raise errors.ConfigError(
                f"store URI {uri!r}: file URIs take an absolute path, file:///var/lib/runs "
                "(three slashes), or a relative one, file://./runs"
            )
        if not path:
            raise errors.ConfigError(f"store URI {uri!r} names no directory")
        return Store(FsBackend(urllib.parse.unquote(path)), uri)
    if scheme == "s3":
        bucket = parsed.netloc
        if not bucket or not layout_bucket_ok(bucket):
            raise errors.ConfigError(
                f"store URI {uri!r}: {bucket!r} is not a valid bucket name (3-63 lowercase "
                "letters, digits, '.' or '-'): use s3://bucket/prefix"
            )
        endpoint = (endpoint_url or os.environ.get("AWS_ENDPOINT_URL_S3")
                    or os.environ.get("AWS_ENDPOINT_URL"))
        if server_side_encryption not in (None, "AES256", "aws:kms"):
            raise errors.ConfigError(
                f"serverSideEncryption {server_side_encryption!r}: use AES256 or aws:kms")
        options = S3Options(
            endpoint_url=endpoint, region=region or os.environ.get("AWS_REGION"),
            server_side_encryption=server_side_encryption, kms_key_id=kms_key_id,
            access_key=access_key, secret_key=secret_key, session_token=session_token)
        extras.require("s3", f"store URI {uri!r} (the S3 store)", "boto3")
        from durablerun._private.storage.backends.s3 import S3Backend  # boto3 only when needed

        return Store(S3Backend(bucket, parsed.path.strip("/"), options), uri)
    raise errors.ConfigError(
        f"store URI {uri!r}: unknown scheme {scheme!r}; use s3://, file:// or memory://"
    )


def layout_bucket_ok(bucket: str) -> bool:
    import re

    return bool(re.match(r"^[a-z0-9][a-z0-9.-]{1,61}[a-z0-9]$", bucket))


def store_from_checkpoint(
    checkpoint: Checkpoint,
    *,
    access_key: str | None = None,
    secret_key: str | None = None,
    session_token: str | None = None,
    endpoint_url: str | None = None,
) -> Store:
    """Open the store a DurableRun's ``spec.checkpoint`` describes; ``endpoint_url`` (the credentials Secret's
    AWS_ENDPOINT_URL_S3) applies when the spec names no endpoint."""
    return open_store(
        checkpoint.uri,
        endpoint_url=checkpoint.endpoint or endpoint_url,
        region=checkpoint.region,
        server_side_encryption=checkpoint.serverSideEncryption,
        kms_key_id=checkpoint.kmsKeyId,
        access_key=access_key,
        secret_key=secret_key,
        session_token=session_token,
    )


def runner_store(checkpoint: Checkpoint) -> Store:
    """The store of a DurableRun's ``spec.checkpoint``, with the credentials the operator put in the runner pod's
    environment (the credentials Secret's keys, builders.runner_env): the runner's and its log shipper's."""
    return store_from_checkpoint(
        checkpoint,
        access_key=os.environ.get("AWS_ACCESS_KEY_ID"),
        secret_key=os.environ.get("AWS_SECRET_ACCESS_KEY"),
        session_token=os.environ.get("AWS_SESSION_TOKEN"),
        endpoint_url=os.environ.get("AWS_ENDPOINT_URL_S3"),
    )
