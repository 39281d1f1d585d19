"""Results: how a record carries a value, and the value the workflow gets back (runtime layer).

A value is journaled as JSON (a pydantic model with its class, to be rebuilt); past
``EngineConfig.inline_result_max`` bytes it goes to a content-addressed blob and the
record carries the reference. The workflow always gets its own copy, decoded exactly
as a replay would decode it, so a first run and its replay see the same value.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

from durablerun import errors
from durablerun._private.engine.halts import Halt, HaltKind
from durablerun._private.records import codec
from durablerun._private.records.model import EngineConfig, Payload, ResultRecord
from durablerun._private.storage.journal import RunStore

_DECODES_TO_ITSELF = frozenset({str, int, float, bool, type(None)})


class Results:
    """Encodes one attempt's results for their records and decodes recorded ones."""

    def __init__(self, store: RunStore, config: EngineConfig,
                 io: Callable[..., Awaitable[Any]]) -> None:
        self._store = store
        self._config = config
        #: Runs a blocking store call off the loop (AttemptCore.io).
        self._io = io

    async def encode(self, value: Any, what: str, verb: str = "returned",
                     root: str = "result") -> tuple[Payload, Any]:
        """How a record carries ``value``, and the value the workflow gets back."""
        body, model = codec.encode_value(value, what=what, verb=verb, root=root)
        size = len(body)
        config = self._config
        if size > config.result_hard_limit:
            raise errors.ResultTooLargeError(
                f"{what} {verb} {size:,} bytes of JSON, over the hard limit of "
                f"{config.result_hard_limit:,} bytes (EngineConfig.result_hard_limit, "
                "--max-result-bytes). Store large data elsewhere and return a reference."
            )
        payload = Payload(body, None, model or None)
        if size > config.inline_result_max:
            try:
                payload = Payload(None, await self._io(self._store.put_blob, body), model or None)
            except errors.StoreError as e:
                # The store failed, not the step: never journal this as the step's error.
                raise store_halt(e) from None
        # The workflow gets its own copy, decoded exactly as a replay would decode it. A str, int,
        # float, bool or None (those types exactly, no subclass) decodes to an equal immutable value:
        # the value itself is that copy, and the step skips a decode.
        if model is None and type(value) in _DECODES_TO_ITSELF:
            return payload, value
        return payload, codec.rebuild(codec.loads(body, what=what), model, what=what)

    async def recorded(self, record: ResultRecord, what: str) -> Any:
        """The value ``record`` holds, as the workflow gets it (a copy of its own)."""
        if record.ref is not None:
            try:
                body = await self._io(self._store.get_blob, record.ref)
            except errors.StoreError as e:
                raise store_halt(e) from None
            return codec.decode_value(body, record.model, what=what)
        try:
            if record.encoded is not None:  # written in this process: decoded only now
                return codec.rebuild(codec.loads(record.encoded, what=what), record.model,
                                     what=what)
            value = record.value
            if record.handed:
                # A second pass in this process: the first may have mutated its copy.
                value = fresh(value)
            record.handed = True
            return codec.rebuild(value, record.model, what=what)
        except errors.WorkflowError as e:
            raise Halt(HaltKind.FAIL, str(e), error=e) from None


def fresh(value: Any) -> Any:
    """A private copy of a journaled value (workflows may mutate what they get)."""
    if value is None or isinstance(value, str | int | float | bool):
        return value
    return codec.loads(codec.dumps(value), what="value")


def store_halt(e: errors.StoreError) -> Halt:
    """The halt for a store that failed an operation: a crash when it cannot be reached."""
    return Halt(HaltKind.CRASH if isinstance(e, errors.StoreUnavailableError) else HaltKind.FAIL,
                str(e), error=e)
