"""S3 backend (``s3://bucket/prefix``), for AWS S3 and S3-compatible servers.

* Journal records are one object each, written with ``If-None-Match: *``: a
  sequence number is written at most once; 412 means another writer owns
  the run (FencedError).
* The snapshot pointer is replaced with ``If-Match: <etag>`` (compare and
  swap); events, blobs, chunks and the manifest are created with
  ``If-None-Match: *`` (first write wins).
* One retry layer: botocore's. Throttling, 5xx, timeouts and lost
  connections are retried by its retry mode (AWS_RETRY_MODE, standard by
  default) up to AWS_MAX_ATTEMPTS (default 8 here); the region comes from
  boto3's chain (AWS_REGION, the AWS config) unless given. The only retries of
  our own are of a conditional write that got 409 (a concurrent conditional
  write to the same key, which S3 asks the caller to retry). A conditional
  write retried after its first try landed gets 412 for its own write; we
  tell that apart by reading the object back and comparing bytes (every
  record carries its writer's attempt id).
* Server-side encryption (``AES256`` or ``aws:kms`` with a key id) is applied
  to every object written.
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable, Iterable, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING, Any, TypeVar

import boto3
import botocore.config
import botocore.exceptions
import botocore.session

from durablerun import errors
from durablerun._private.records import layout
from durablerun._private.storage.backends import base
from durablerun._private.storage.backends.options import DEFAULT_MAX_ATTEMPTS, S3Options

if TYPE_CHECKING:
    from mypy_boto3_s3.client import S3Client

T = TypeVar("T")

# Tries of a conditional write that keeps getting 409 (ConditionalRequestConflict).
CONFLICT_ATTEMPTS = 5

_NOT_FOUND = {"NoSuchKey", "404", "NotFound"}
_PRECONDITION = {"PreconditionFailed", "412"}
_CONFLICT = {"ConditionalRequestConflict", "409", "OperationAborted"}
# Worth another attempt though not a 5xx: throttling, a request the server timed out, and MinIO's
# ClientDisconnected (499), which a server going down mid-request answers.
_TRANSIENT = {"RequestTimeout", "SlowDown", "TooManyRequests", "ClientDisconnected"}
_TRANSIENT_STATUS = {408, 429, 499}
_NO_BUCKET = {"NoSuchBucket"}
_ACCESS = {
    "AccessDenied",
    "InvalidAccessKeyId",
    "SignatureDoesNotMatch",
    "ExpiredToken",
    "InvalidToken",
    "403",
}


class StoreUnsupportedError(errors.StoreError, errors.ConfigError):
    """The server does not implement what the store asks of it (501): configuration, never transient."""


def _code(e: botocore.exceptions.ClientError) -> str:
    return str(e.response.get("Error", {}).get("Code", ""))


def _message(e: botocore.exceptions.ClientError) -> str:
    return str(e.response.get("Error", {}).get("Message", ""))


def _status(e: botocore.exceptions.ClientError) -> int:
    return int(e.response.get("ResponseMetadata", {}).get("HTTPStatusCode", 0) or 0)


class S3Backend(base.Backend):
    io_inline = False

    def __init__(
        self,
        bucket: str,
        prefix: str,
        options: S3Options | None = None,
        *,
        client: S3Client | None = None,
    ) -> None:
        self.bucket = bucket
        self.prefix = prefix.strip("/")
        self.options = options or S3Options()
        o = self.options
        # botocore's session reads the AWS configuration (environment, ~/.aws/config) as boto3 does.
        core = botocore.session.get_session()
        attempts = o.max_attempts or core.get_config_variable("max_attempts") or DEFAULT_MAX_ATTEMPTS
        config = botocore.config.Config(
            retries={"total_max_attempts": attempts},  # the mode stays AWS_RETRY_MODE's
            connect_timeout=o.connect_timeout,
            read_timeout=o.read_timeout,
            max_pool_connections=16,
            s3={"addressing_style": "path"} if o.endpoint_url else None,
        )
        self._client: S3Client = client or boto3.session.Session(botocore_session=core).client(
            "s3",
            endpoint_url=o.endpoint_url,
            region_name=o.region,
            aws_access_key_id=o.access_key,
            aws_secret_access_key=o.secret_key,
            aws_session_token=o.session_token,
            config=config,
        )
        self._pool: ThreadPoolExecutor | None = None

    # --- plumbing ----------------------------------------------------------------
    def describe(self) -> dict[str, Any]:
        o = self.options
        return {
            "kind": "s3",
            "uri": f"s3://{self.bucket}/{self.prefix}".rstrip("/"),
            "bucket": self.bucket,
            "prefix": self.prefix,
            "endpoint_url": o.endpoint_url,
            "region": o.region,
            "server_side_encryption": o.server_side_encryption,
            "kms_key_id": o.kms_key_id,
        }

    def _key(self, key: str) -> str:
        return f"{self.prefix}/{key}" if self.prefix else key

    def _rel(self, full: str) -> str:
        return full[len(self.prefix) + 1 :] if self.prefix else full

    def _call(self, what: str, key: str, fn: Callable[[], T]) -> T:
        """Run ``fn`` (botocore has retried what is worth retrying) and map its errors."""
        try:
            return fn()
        except botocore.exceptions.ClientError as e:
            code, status = _code(e), _status(e)
            if code in _NO_BUCKET:
                raise errors.StoreNotFoundError(
                    "the bucket does not exist: create it or fix checkpoint.uri",
                    bucket=self.bucket,
                    endpoint=self.options.endpoint_url or "aws",
                ) from e
            if code in _ACCESS or status == 403:
                raise errors.StoreAccessError(
                    f"access denied ({code or status}): check the credentials (checkpoint."
                    "credentialsSecret / AWS_ACCESS_KEY_ID) and the bucket policy",
                    bucket=self.bucket,
                    key=key,
                    op=what,
                ) from e
            if status == 501 or code == "NotImplemented":
                raise StoreUnsupportedError(
                    f"the S3 server does not implement this request ({code}: {_message(e)}): "
                    "checkpoint.serverSideEncryption needs a KMS on the server; conditional writes "
                    "(If-None-Match, If-Match) need S3 or a recent S3-compatible server",
                    bucket=self.bucket, key=key, op=what,
                ) from e
            if status >= 500 or code in _CONFLICT or code in _TRANSIENT or status in _TRANSIENT_STATUS:
                raise errors.StoreUnavailableError(
                    f"S3 {what} failed: {code} {e}", bucket=self.bucket, key=key
                ) from e
            raise errors.StoreError(
                f"S3 {what} failed: {code}: {e}", bucket=self.bucket, key=key
            ) from e
        except (
            botocore.exceptions.NoCredentialsError,
            botocore.exceptions.PartialCredentialsError,
            botocore.exceptions.CredentialRetrievalError,
        ) as e:
            # Raised before any request is sent: configuration, never transient.
            raise errors.StoreAccessError(
                f"no usable S3 credentials ({e}): set AWS_ACCESS_KEY_ID and "
                "AWS_SECRET_ACCESS_KEY (or checkpoint.credentialsSecret on Kubernetes, or "
                "workload identity)",
                bucket=self.bucket,
                op=what,
            ) from e
        except (
            botocore.exceptions.EndpointConnectionError,
            botocore.exceptions.ConnectionClosedError,
            botocore.exceptions.ReadTimeoutError,
            botocore.exceptions.ConnectTimeoutError,
            botocore.exceptions.HTTPClientError,
        ) as e:
            raise errors.StoreUnavailableError(
                f"S3 {what} failed: the server could not be reached: {e}",
                bucket=self.bucket,
                key=key,
                endpoint=self.options.endpoint_url or "aws",
            ) from e

    def _sse(self) -> Any:
        o = self.options
        extra: dict[str, Any] = {}
        if o.server_side_encryption:
            extra["ServerSideEncryption"] = o.server_side_encryption
            if o.kms_key_id:
                extra["SSEKMSKeyId"] = o.kms_key_id
        return extra

    def check(self, under: str = "") -> None:
        # A listing of the keys the caller will use, not HeadBucket: credentials scoped to a prefix (a tenant's
        # runs/<namespace>/, as an IAM policy's s3:prefix condition grants) may list there and nowhere else, and
        # a missing bucket or a bad key is refused just the same.
        prefix = self._key(under)
        self._call("ListObjectsV2", prefix, lambda: self._client.list_objects_v2(
            Bucket=self.bucket, Prefix=prefix, MaxKeys=1))

    # --- objects -----------------------------------------------------------------
    def get_versioned(self, key: str) -> tuple[bytes, str] | None:
        full = self._key(key)

        def go() -> tuple[bytes, str] | None:
            try:
                resp = self._client.get_object(Bucket=self.bucket, Key=full)
            except botocore.exceptions.ClientError as e:
                if _code(e) in _NOT_FOUND:
                    return None
                raise
            return resp["Body"].read(), str(resp["ETag"])

        return self._call("GetObject", full, go)

    def get(self, key: str) -> bytes | None:
        got = self.get_versioned(key)
        return None if got is None else got[0]

    def get_many(self, keys: Sequence[str]) -> list[bytes | None]:
        if len(keys) <= 1:
            return [self.get(k) for k in keys]
        if self._pool is None:
            self._pool = ThreadPoolExecutor(max_workers=8, thread_name_prefix="durablerun-s3")
        return list(self._pool.map(self.get, keys))

    def _conditional_put(self, full: str, data: bytes, **condition: Any) -> str | None:
        """PutObject with a condition: the new ETag, or None on 412."""

        def go() -> str | None:
            for attempt in range(1, CONFLICT_ATTEMPTS + 1):
                try:
                    resp = self._client.put_object(
                        Bucket=self.bucket, Key=full, Body=data, **condition, **self._sse()
                    )
                except botocore.exceptions.ClientError as e:
                    if _code(e) in _PRECONDITION or _status(e) == 412:
                        return None
                    if "IfMatch" in condition and _code(e) in _NOT_FOUND:
                        return None  # If-Match on a key that does not exist (any more)
                    if (_code(e) in _CONFLICT or _status(e) == 409) and attempt < CONFLICT_ATTEMPTS:
                        # A concurrent conditional write to this key: S3 asks for a retry, which
                        # then gets 412 (the other write won) or succeeds.
                        time.sleep(min(2.0, 0.05 * 2**attempt) * random.uniform(0.5, 1.0))
                        continue
                    raise
                return str(resp.get("ETag") or "")
            raise AssertionError("unreachable")

        return self._call("PutObject", full, go)

    def create(self, key: str, data: bytes) -> bool:
        if self._conditional_put(self._key(key), data, IfNoneMatch="*") is not None:
            return True
        return self.get(key) == data

    def put(self, key: str, data: bytes) -> None:
        full = self._key(key)
        self._call(
            "PutObject",
            full,
            lambda: self._client.put_object(Bucket=self.bucket, Key=full, Body=data, **self._sse()),
        )

    def cas(self, key: str, data: bytes, *, etag: str | None) -> str | None:
        full = self._key(key)
        condition = {"IfNoneMatch": "*"} if etag is None else {"IfMatch": etag}
        etag = self._conditional_put(full, data, **condition)
        if etag is None:
            current = self.get_versioned(key)
            if current is not None and current[0] == data:
                return current[1]  # our own write, retried after it landed
            return None
        if etag:
            return etag
        current = self.get_versioned(key)  # a server that returned no ETag
        return None if current is None or current[0] != data else current[1]

    def list_keys(self, prefix: str) -> list[str]:
        return [self._rel(k) for k in self._list_full(self._key(prefix))]

    def _list_full(self, full_prefix: str, start_after: str | None = None) -> list[str]:
        def go() -> list[str]:
            keys: list[str] = []
            paginator = self._client.get_paginator("list_objects_v2")
            kwargs: dict[str, Any] = {"Bucket": self.bucket, "Prefix": full_prefix}
            if start_after:
                kwargs["StartAfter"] = start_after
            for page in paginator.paginate(**kwargs):
                keys.extend(obj["Key"] for obj in page.get("Contents", []))
            return keys

        return self._call("ListObjectsV2", full_prefix, go)

    def _list_some(self, full_prefix: str, start_after: str | None, limit: int) -> list[str]:
        """At most ``limit`` keys under ``full_prefix`` after ``start_after``: ceil(limit / 1000) requests."""
        def go() -> list[str]:
            keys: list[str] = []
            kwargs: dict[str, Any] = {"Bucket": self.bucket, "Prefix": full_prefix}
            if start_after:
                kwargs["StartAfter"] = start_after
            while len(keys) < limit:
                page = self._client.list_objects_v2(**kwargs, MaxKeys=min(1000, limit - len(keys)))
                keys.extend(obj["Key"] for obj in page.get("Contents", []))
                if not page.get("IsTruncated") or not page.get("NextContinuationToken"):
                    break
                kwargs["ContinuationToken"] = page["NextContinuationToken"]
            return keys[:limit]

        return self._call("ListObjectsV2", full_prefix, go)

    def delete(self, keys: Iterable[str]) -> None:
        full = [self._key(k) for k in keys]
        self._delete_full(full)

    def _delete_full(self, full: list[str]) -> None:
        for i in range(0, len(full), 1000):
            batch = full[i : i + 1000]
            self._call(
                "DeleteObjects",
                batch[0],
                lambda batch=batch: self._client.delete_objects(  # type: ignore[misc]
                    Bucket=self.bucket,
                    Delete={"Objects": [{"Key": k} for k in batch], "Quiet": True},
                ),
            )

    def delete_prefix(self, prefix: str) -> int:
        full = self._list_full(self._key(prefix))
        self._delete_full(full)
        return len(full)

    def journal(self, root: str) -> base.JournalBackend:
        return S3Journal(self, root)

    def close(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=False)
            self._pool = None


class S3Journal(base.JournalBackend):
    groups = True

    def __init__(self, backend: S3Backend, root: str) -> None:
        self._b = backend
        self._root = root
        #: The first record of the group each grouped record this journal wrote or read is in.
        self._group_of: dict[int, int] = {}

    def _objects(self, from_seq: int) -> list[tuple[int, str]]:
        """(first seq, key) of the journal objects that hold records from ``from_seq`` on.

        A group holding ``from_seq`` is named at most GROUP_RECORDS - 1 before it: list from
        there (one listing all the same) and keep, of the objects before ``from_seq``, the last.
        """
        b = self._b
        look = max(0, from_seq - layout.GROUP_RECORDS + 1)
        start_after = b._key(self._root + layout.journal_key(look - 1)) if look > 0 else None
        found: list[tuple[int, str]] = []
        for full in b._list_full(b._key(self._root + layout.JOURNAL_DIR), start_after):
            seq = layout.seq_of_journal_key(b._rel(full)[len(self._root) :])
            if seq is not None and seq >= look:
                found.append((seq, b._rel(full)))
        before = [o for o in found if o[0] < from_seq]
        after = [o for o in found if o[0] >= from_seq]
        if before and (not after or after[0][0] != from_seq):
            return before[-1:] + after  # it may be a group holding from_seq
        return after

    def read(self, from_seq: int, *, repair: bool = False) -> list[tuple[int, bytes]]:
        objects = self._objects(from_seq)
        found = []
        for (seq, key), body in zip(objects, self._b.get_many([k for _, k in objects]), strict=True):
            if body is None:
                raise errors.CorruptionError("a listed journal record disappeared while being read", key=key)
            found.append((seq, key, body))
        return self._unpack(found, from_seq)

    def read_range(self, from_seq: int, to_seq: int) -> list[tuple[int, bytes]]:
        # An object is named by its first position, so a page is its objects fetched by name (in parallel), no
        # listing: from GROUP_RECORDS - 1 before the page (a group holding its first record starts there at the
        # earliest). Names that hold nothing come back empty; the journal has no gaps, so the page ends at the
        # first position no object holds.
        seqs = range(max(0, from_seq - layout.GROUP_RECORDS + 1), max(from_seq, to_seq))
        keys = [self._root + layout.journal_key(seq) for seq in seqs]
        found = [(seq, key, body) for seq, key, body in zip(seqs, keys, self._b.get_many(keys), strict=True)
                 if body is not None]
        records = dict(self._unpack(found, from_seq))
        out = []
        for seq in range(from_seq, to_seq):
            if seq not in records:
                break
            out.append((seq, records[seq]))
        return out

    def _unpack(self, objects: list[tuple[int, str, bytes]], from_seq: int) -> list[tuple[int, bytes]]:
        """The records from ``from_seq`` on that ``objects`` ((first seq, key, body), in order) hold."""
        out: list[tuple[int, bytes]] = []
        for seq, key, body in objects:
            held = layout.unpack_journal_object(seq, body, key=self._b._key(key))
            if len(held) > 1:
                self._group_of.update((s, seq) for s, _ in held)
            out.extend(r for r in held if r[0] >= from_seq)
        return out

    def location(self, seq: int) -> str:
        first = self._group_of.get(seq)
        return layout.journal_key(seq) if first is None else f"{layout.journal_key(first)}#{seq}"

    def _exists(self, seq: int) -> bool:
        """Whether an object is named ``seq`` or later: one listing of at most one key."""
        b = self._b
        start_after = b._key(self._root + layout.journal_key(seq - 1)) if seq > 0 else None
        return bool(b._list_some(b._key(self._root + layout.JOURNAL_DIR), start_after, 1))

    def count(self, at_least: int = 0) -> int:
        # The journal is a prefix 0..n-1 kept in objects named by their first position, so n is the last
        # object's name plus the records it holds. From a count known reached (the snapshot's), one listing
        # finds the last object of a short tail; past that, doubling then bisecting: O(log n) one-key listings.
        b = self._b
        prefix = b._key(self._root + layout.JOURNAL_DIR)
        # The object holding record at_least - 1 is named here or later.
        look = max(0, at_least - layout.GROUP_RECORDS + 1)
        start = b._key(self._root + layout.journal_key(look - 1)) if look > 0 else None
        listed = b._list_some(prefix, start, 1000)
        names = (layout.seq_of_journal_key(b._rel(full)[len(self._root):]) for full in listed)
        tail = [seq for seq in names if seq is not None]
        if not tail:
            return 0 if look == 0 else at_least
        if len(tail) < 1000:
            return self._end_of(tail[-1])
        low, step = tail[-1], 1  # an object is named ``low``
        while self._exists(low + step):
            low, step = low + step, step * 2
        high = low + step  # no object is named ``high`` or later
        while high - low > 1:
            middle = (low + high) // 2
            low, high = (middle, high) if self._exists(middle) else (low, middle)
        return self._end_of(low)

    def _end_of(self, seq: int) -> int:
        """One past the last record of the object named ``seq``."""
        key = self._root + layout.journal_key(seq)
        body = self._b.get(key)
        if body is None:
            raise errors.CorruptionError("a listed journal record disappeared while being read", key=self._b._key(key))
        return seq + len(layout.unpack_journal_object(seq, body, key=self._b._key(key)))

    def append(self, seq: int, data: bytes) -> str:
        return self._put(seq, data, base.CRASH_POINTS)

    def append_group(self, first: int, records: Sequence[bytes]) -> list[str]:
        """One conditional PUT at ``first`` holding every record: durable together, or not at all."""
        if len(records) == 1:
            return [self.append(first, records[0])]
        full = self._put(first, layout.pack_group(first, list(records)), base.GROUP_CRASH_POINTS)
        self._group_of.update((first + i, first) for i in range(len(records)))
        return [f"{full}#{first + i}" for i in range(len(records))]

    def _put(self, seq: int, data: bytes, points: tuple[str, str, str]) -> str:
        key = self._root + layout.journal_key(seq)
        full = self._b._key(key)
        base.crash_point(points[0])
        etag = self._b._conditional_put(full, data, IfNoneMatch="*")
        # The object is stored, nothing of the answer acted on: to a killed process, the same as
        # dying before the answer arrived.
        base.crash_point(points[1])
        if etag is not None or self._b.get(key) == data:  # or our own write: the first try landed, the retry got 412
            base.crash_point(points[2])
            return full
        raise errors.FencedError(
            "journal position already written by another writer (412 Precondition Failed)",
            bucket=self._b.bucket,
            key=full,
        )

    def truncate(self, from_seq: int) -> int:
        """The last object first; a group holding ``from_seq`` is put back with the records before it,
        last of all, so an interruption leaves a prefix of the journal at every moment."""
        objects = self._objects(from_seq)
        bodies = self._b.get_many([k for _, k in objects])
        dropped, keep = 0, None
        for (seq, key), body in sorted(zip(objects, bodies, strict=True), reverse=True):
            held = [] if body is None else layout.unpack_journal_object(seq, body, key=key)
            if seq < from_seq:
                kept = [data for s, data in held if s < from_seq]
                if len(kept) < len(held):  # a group holding from_seq
                    keep = (key, seq, kept)
                    dropped += len(held) - len(kept)
                continue
            dropped += len(held)
            self._b.delete([key])
        if keep is not None:
            key, seq, kept = keep
            self._b.put(key, kept[0] if len(kept) == 1 else layout.pack_group(seq, kept))
        self._group_of.clear()
        return dropped
