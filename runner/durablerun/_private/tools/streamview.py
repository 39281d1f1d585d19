"""Printing a run's output stream: ``durablerun stream`` and ``kubectl durablerun stream`` (one behaviour).

Text goes to stdout as it was written; a superseded chunk (a plain read: a step try that did not count)
goes to stderr under a line that says so, so stdout never mixes it in. ``--json`` prints one object per
chunk with its offset and standing instead. Reading and deciding are the reader's
(:mod:`durablerun._private.storage.stream_reader`).
"""

from __future__ import annotations

import argparse
import json
import sys

from durablerun._private.records import layout
from durablerun._private.storage.journal import RunStore
from durablerun._private.storage.stores import Store
from durablerun._private.storage.stream_reader import Read, Standing, StreamReader
from durablerun._private.storage.streams import StreamObjects
from durablerun._private.tools import arguments


def _pick(store: RunStore, name: str | None) -> str:
    """The stream to read: ``name``, else the run's only stream; else a usage error naming them."""
    if name is not None:
        return name
    names = StreamObjects(store.backend, store.ref).names()
    if len(names) == 1:
        return names[0]
    have = f"its streams: {', '.join(names)}" if names else "it has written none yet"
    raise arguments.UsageError(f"name the stream to read of run {store.ref} ({have})")


def show_run(store: Store, ref: layout.RunRef, args: argparse.Namespace) -> int:
    """Both commands' ``stream``: the stream ``args`` name (name, from_offset, final, follow, json) of run
    ``ref``; closes ``store``."""
    rs = store.run_store(ref)
    try:
        return show(rs, args.name, start=args.from_offset, final=args.final, follow=args.follow, as_json=args.json)
    finally:
        rs.close()
        store.close()


def show(store: RunStore, name: str | None, *, start: int, final: bool, follow: bool, as_json: bool) -> int:
    """Print stream ``name`` of the run from offset ``start`` (following it until the run has finished)."""
    problem = None if name is None else layout.stream_name_error(name)
    if problem is not None:
        raise arguments.UsageError(problem)
    if start < 0:
        raise arguments.UsageError(f"--from {start}: offsets count from 0")
    if store.read_manifest() is None:  # else a follower would wait for a run that is not there
        raise arguments.UsageError(f"no run {store.ref} in this store: check the run's id (or name) and the store")
    reader = StreamReader(store, _pick(store, name), start=start, final=final)
    try:
        for read in reader.follow() if follow else reader.read():
            _print(read, as_json)
    except KeyboardInterrupt:
        pass
    print(f"durablerun: stream {reader.name!r}: next offset {reader.next_offset} (--from "
          f"{reader.next_offset} reads on from here)", file=sys.stderr)
    return 0


def _print(read: Read, as_json: bool) -> None:
    chunk = read.chunk
    if as_json:
        print(json.dumps({**chunk.to_json(), "standing": read.standing.value}), flush=True)
    elif read.standing == Standing.SUPERSEDED:
        print(f"\n[superseded: offset {chunk.offset}, step {chunk.step!r} (position {chunk.pos}) try {chunk.tries} "
              f"of attempt {chunk.attempt}]\n{chunk.text}", file=sys.stderr, flush=True)
    else:
        sys.stdout.write(chunk.text)
        sys.stdout.flush()
