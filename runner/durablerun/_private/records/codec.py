"""Bytes on the wire: JSON encoding, checksummed envelopes, content hashes.

Every object the SDK stores is *sealed*: wrapped in a small JSON envelope that
carries the sha256 of its body, so each object verifies itself::

    {"sha256":"<64 hex>","body":<the body's JSON, byte for byte>}

The prefix has a fixed length, so :func:`unseal` slices the body out exactly
and checks it against the hash without re-serialising anything. A mismatch is
a :class:`~durablerun.errors.CorruptionError`, never a silent fresh start.
"""

from __future__ import annotations

import hashlib
import importlib
import json
from typing import Any

from pydantic import BaseModel

from durablerun import errors

_PREFIX = b'{"sha256":"'
_MID = b'","body":'
_SUFFIX = b"}"
_HEADER_LEN = len(_PREFIX) + 64 + len(_MID)


def sha256_hex(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def seal(body: bytes, *, sha256: str | None = None) -> bytes:
    """Wrap ``body`` (JSON bytes) in an envelope carrying its sha256 (``sha256``: already computed, for a
    content-addressed object whose name is that hash: hashed once, not twice)."""
    digest = hashlib.sha256(body).hexdigest() if sha256 is None else sha256
    return b"".join((_PREFIX, digest.encode(), _MID, body, _SUFFIX))


def unseal(data: bytes, *, what: str) -> bytes:
    """Return the body of a sealed object, or raise CorruptionError naming ``what``."""
    if (
        len(data) < _HEADER_LEN + len(_SUFFIX)
        or not data.startswith(_PREFIX)
        or data[_HEADER_LEN - len(_MID) : _HEADER_LEN] != _MID
        or not data.endswith(_SUFFIX)
    ):
        raise errors.CorruptionError(
            "object is not a sealed durable-run envelope (truncated or overwritten)",
            object=what,
            size=len(data),
        )
    expected = data[len(_PREFIX) : len(_PREFIX) + 64].decode("ascii", "replace")
    body = data[_HEADER_LEN : -len(_SUFFIX)]
    actual = hashlib.sha256(body).hexdigest()
    if actual != expected:
        raise errors.CorruptionError(
            "checksum mismatch: the object was modified or damaged after it was written",
            object=what,
            expected_sha256=expected,
            actual_sha256=actual,
        )
    return body


def is_sealed_ok(data: bytes) -> bool:
    try:
        unseal(data, what="-")
    except errors.CorruptionError:
        return False
    return True


# --- JSON -----------------------------------------------------------------------


# Built once: json.dumps with any non-default argument builds a new encoder on every call (every step
# encodes twice). An encoder keeps no state between calls, so threads may share it.
_ENCODE = json.JSONEncoder(separators=(",", ":"), ensure_ascii=False, allow_nan=False).encode


def dumps(value: Any) -> bytes:
    """Compact JSON bytes. NaN/Infinity are refused (they are not JSON)."""
    return _ENCODE(value).encode()


def loads(data: bytes, *, what: str) -> Any:
    try:
        return json.loads(data)
    except ValueError as e:
        raise errors.CorruptionError(f"object is not valid JSON: {e}", object=what) from e


class _Unserializable(TypeError):
    def __init__(self, path: str, value: Any) -> None:
        self.path = path
        self.type_name = f"{type(value).__module__}.{type(value).__qualname__}"
        super().__init__(f"{self.type_name} at {path}")


def _plain(value: Any, path: str) -> Any:
    """Convert to plain JSON types, or raise _Unserializable naming the path."""
    if value is None or isinstance(value, bool | int | str):
        return value
    if isinstance(value, float):
        if value != value or value in (float("inf"), float("-inf")):
            raise _Unserializable(path, value)
        return value
    if isinstance(value, BaseModel):
        return value.model_dump(mode="json")
    if isinstance(value, dict):
        out = {}
        for k, v in value.items():
            if not isinstance(k, str):
                raise _Unserializable(f"{path} (a key)", k)
            out[k] = _plain(v, f"{path}[{k!r}]")
        return out
    if isinstance(value, list | tuple):
        return [_plain(v, f"{path}[{i}]") for i, v in enumerate(value)]
    raise _Unserializable(path, value)


def _default(value: Any) -> Any:
    if isinstance(value, BaseModel):
        return value.model_dump(mode="json")
    raise TypeError(type(value).__qualname__)


_ENCODE_VALUE = json.JSONEncoder(separators=(",", ":"), ensure_ascii=False, allow_nan=False,
                                 default=_default).encode


def encode_value(value: Any, *, what: str, verb: str = "returned",
                 root: str = "result") -> tuple[bytes, str | None]:
    """Encode a step result (or event payload) as JSON bytes.

    Returns the bytes and, when the value is a pydantic model, its class as
    ``module:QualName`` so :func:`decode_value` can rebuild it. Raises
    ResultNotSerializableError naming ``what``, the offending type and where it is
    (``"<what> <verb> a value that ...: <type> at <root>['key']"``).
    """
    model = None
    if isinstance(value, BaseModel):
        model = f"{type(value).__module__}:{type(value).__qualname__}"
    try:
        return _ENCODE_VALUE(value).encode(), model
    except (TypeError, ValueError) as first:
        # Slow path only to say exactly what and where.
        try:
            _plain(value, root)
        except _Unserializable as e:
            raise errors.ResultNotSerializableError(
                f"{what} {verb} a value that is not JSON-serializable: {e.type_name} at "
                f"{e.path}. Return JSON types (dict, list, str, int, float, bool, None) or a "
                "pydantic model."
            ) from None
        raise errors.ResultNotSerializableError(
            f"{what} {verb} a value that cannot be encoded as JSON: {first}"
        ) from None


def decode_value(data: bytes, model: str | None, *, what: str) -> Any:
    value = loads(data, what=what)
    return rebuild(value, model, what=what)


def rebuild(value: Any, model: str | None, *, what: str) -> Any:
    if model is None:
        return value
    module_name, _, qualname = model.partition(":")
    try:
        target: Any = importlib.import_module(module_name)
        for part in qualname.split("."):
            target = getattr(target, part)
    except (ImportError, AttributeError) as e:
        raise errors.WorkflowError(
            f"{what}: the journal holds a {model} but that class cannot be imported now: {e}"
        ) from e
    if not (isinstance(target, type) and issubclass(target, BaseModel)):
        raise errors.WorkflowError(f"{what}: {model} is no longer a pydantic model")
    return target.model_validate(value)
