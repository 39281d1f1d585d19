"""An attempt's stored logs (``logs/`` in the run's root), shown: ``durablerun logs``, ``kubectl durablerun logs``."""

from __future__ import annotations

import sys

from durablerun._private.records import layout
from durablerun._private.storage import logs
from durablerun._private.storage.stores import Store


def describe_archived(store: Store, ref: layout.RunRef) -> str:
    """Which attempts' logs the store keeps, said for a person choosing one."""
    attempts = logs.archived_attempts(store.backend, ref)
    if not attempts:
        return f"the store keeps no logs of run {ref}"
    return f"the store keeps the logs of attempt{'s' if len(attempts) > 1 else ''} " \
           f"{', '.join(map(str, attempts))} (--attempt N)"


def show(store: Store, ref: layout.RunRef, attempt: int) -> int:
    """Write attempt ``attempt``'s logs to stdout; 1 (said why on stderr) when the store has none of it."""
    text = logs.read_attempt(store.backend, ref, attempt)
    if text is None:
        print(f"no logs of attempt {attempt}: {describe_archived(store, ref)}", file=sys.stderr)
        return 1
    sys.stdout.buffer.write(text)
    sys.stdout.flush()
    return 0
