"""Replay: resuming a journal of N steps in a fresh process, and DBOS recovering the same.

Subcommands, each in a fresh interpreter (``python -m durablerun_bench.replay CMD JSON``):

* ``build``: run ``dr_flows:steps`` for N steps on a store; its marker step
  SIGKILLs the process, leaving a journal of exactly N steps (plus snapshots
  every 100 records, the default) and no outcome, as a crash would. With
  ``flow: continuing`` it runs ``dr_flows:continuing`` instead, the same steps
  with a ``ctx.continue_as_new`` every ``every`` (1,000) steps.
* ``resume``: a new process resumes it; prints when the process started, when
  the journal was loaded, when the workflow had replayed the N steps and ran
  its first new step, and when it had the result.
* ``dbos-build`` / ``dbos-resume``: the same for DBOS (its workflow is recovered
  by ``DBOS.launch()``, which re-runs it and reads each step's output back).
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path
from typing import Any

T_MAIN = time.time()  # set before the heavy imports below

WORKFLOW = "durablerun_bench.dr_flows:steps"
#: The long-lived loop: ctx.continue_as_new every CONTINUE_EVERY steps.
CONTINUING = "durablerun_bench.dr_flows:continuing"
CONTINUE_EVERY = 1_000
#: The workflows measured: key -> (workflow, how it is described in the report).
FLOWS = {"steps": WORKFLOW, "continuing": CONTINUING}


def _workflow(p: dict[str, Any]) -> tuple[str, dict[str, Any]]:
    """The workflow reference and input of a benchmark run's parameters."""
    flow = p.get("flow", "steps")
    if flow == "continuing":
        return CONTINUING, {"n": int(p["n"]), "every": int(p.get("every", CONTINUE_EVERY))}
    return WORKFLOW, {"n": int(p["n"])}


def _store(p: dict[str, Any]) -> Any:
    from durablerun.stores import open_store

    if p["store"] == "fs":
        return open_store(f"file://{p['root']}")
    return open_store(f"s3://{p['bucket']}/{p['prefix']}", endpoint_url=p["endpoint"],
                      access_key=p["access_key"], secret_key=p["secret_key"], region="us-east-1")


def _run(p: dict[str, Any], sinks: list[Any] | None = None) -> Any:
    from durablerun.engine import EngineConfig, Run
    from durablerun.stores import RunRef

    workflow, input_value = _workflow(p)
    return Run(store=_store(p), run=RunRef.local(p["run_id"]), workflow=workflow, input=input_value,
               sinks=sinks or [], config=EngineConfig(snapshot_every=int(p.get("snapshot_every", 100))))


def build(p: dict[str, Any]) -> dict[str, Any]:
    from durablerun_bench import dr_flows

    os.environ[dr_flows.CRASH_ENV] = "settle"
    _run(p).run_attempt()
    raise RuntimeError("the marker step should have killed this process")


def resume(p: dict[str, Any]) -> dict[str, Any]:
    """Resume the journal; every moment goes to the marks file (the process may be killed)."""
    from durablerun import api
    from durablerun.sinks import ProgressSink
    from durablerun_bench import dr_flows

    dr_flows.mark("process", dr_flows.process_start_time())
    dr_flows.mark("main", T_MAIN)
    seen: dict[str, Any] = {}

    class Sink(ProgressSink):
        def run_started(self, *, info: Any) -> None:
            dr_flows.mark("loaded")
            seen.update(objects_read=info.objects_read, records=info.journal_records,
                        loaded_from=info.first_loaded, generation=info.generation)
            dr_flows.mark(f"objects_read={info.objects_read}")
            dr_flows.mark(f"loaded_from={info.first_loaded}")

    dr_flows.mark("run")
    result = _run(p, [Sink()]).run_attempt()
    dr_flows.mark("result")
    if result.outcome != api.Outcome.COMPLETED or result.result != int(p["n"]):
        raise RuntimeError(f"resume ended {result.outcome.value}: {result.message}")
    return {"records": seen.get("records"), "objects_read": seen.get("objects_read"),
            "loaded_from": seen.get("loaded_from"), "generation": seen.get("generation")}


_COUNTS = ("objects_read", "loaded_from")


def read_marks(path: Path) -> dict[str, float]:
    """``what -> unix time`` of the marks file's lines (the first of each), plus the counts
    (``objects_read``, ``loaded_from``: the record the loaded journal starts at)."""
    out: dict[str, float] = {}
    for line in path.read_text().splitlines():
        what, _pid, when = line.split()
        name, eq, value = what.partition("=")
        if eq and name in _COUNTS:
            out[name] = float(value)
        else:
            out.setdefault(what, float(when))
    return out


def measure(command: str, params: dict[str, Any], *, crash: bool, marks: Path) -> dict[str, float]:
    """Spawn ``command`` in a fresh interpreter and return its phases, in seconds from the spawn.

    With ``crash`` the first new step SIGKILLs the process right after marking
    itself, so the journal is left as it was and the next repeat resumes the same.
    """
    import subprocess

    marks.unlink(missing_ok=True)
    from durablerun_bench import dr_flows

    env = {**os.environ, dr_flows.MARK_ENV: str(marks)}
    env.pop(dr_flows.CRASH_ENV, None)
    if crash:
        env[dr_flows.CRASH_ENV] = "now"
    spawned = time.time()
    proc = subprocess.run([sys.executable, "-m", "durablerun_bench.replay", command, json.dumps(params)],
                          env=env, capture_output=True, text=True, timeout=900)
    if proc.returncode != (-9 if crash else 0):
        raise RuntimeError(f"replay {command} exited {proc.returncode}:\n{proc.stderr[-3000:]}")
    got = read_marks(marks)
    return {k: (v if k in _COUNTS else v - spawned) for k, v in got.items()}


def build_exported(p: dict[str, Any]) -> dict[str, Any]:
    """Build N steps on the in-memory store, then write the run out in both stores' layouts.

    100,000 steps through a real store take 100,000 fdatasyncs or sequential
    PUTs (and under a shared machine's load, many minutes); built in memory by
    the same engine (same records, same snapshot chunks and pointer), the run
    is then written to the filesystem layout (segments of
    ``layout.SEGMENT_RECORDS`` records, one per line) and to the S3 layout (an
    object per record, 16 PUTs at a time), with the manifest, the snapshot
    pointer and the chunks it names. The resume benchmark checks each copy
    replays to the same result.
    """
    from durablerun._private.records import codec, layout
    from durablerun.stores import RunRef, open_store
    from durablerun_bench import dr_flows
    from durablerun_bench.systems import s3_client
    from durablerun_bench.util import put_objects

    ref = RunRef.local(p["run_id"])
    store = open_store(f"memory://{p['run_id']}")
    root = ref.path + "/"

    def export() -> None:
        backend: Any = store.backend
        records: list[bytes] = list(backend.raw_journal(root))
        # The snapshot thread may still be behind (a busy machine): wait, within reason, for the last
        # snapshot the engine takes before this record, so every build leaves the same state; then copy
        # the pointer as read and exactly the chunks it names (superseded ones, which the SDK leaves
        # behind, are never read by a resume), fetched by key: a chunk listed before the pointer moved
        # would not be enough.
        due = _last_snapshot_due(records, int(p.get("snapshot_every", 100)))
        deadline = time.monotonic() + 120
        while True:
            pointer_bytes = backend.get(root + layout.SNAPSHOT)
            pointer = codec.loads(codec.unseal(pointer_bytes, what="snapshot"), what="snapshot")
            if int(pointer["seq"]) >= due or time.monotonic() > deadline:
                break
            time.sleep(0.05)
        objects = {k: backend.get(k) for k in backend.list_keys(root)
                   if layout.seq_of_journal_key(k[len(root):]) is None and not k.startswith(root + layout.CHUNKS_DIR)}
        objects[root + layout.SNAPSHOT] = pointer_bytes
        for c in pointer["chunks"]:
            objects[root + c["key"]] = backend.get(root + c["key"])
        fs_root = Path(p["fs_root"]) / ref.path
        for key, data in objects.items():
            target = fs_root / key[len(root):]
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_bytes(data)
        (fs_root / "journal").mkdir(parents=True, exist_ok=True)
        for start in range(0, len(records), layout.SEGMENT_RECORDS):
            (fs_root / "journal" / layout.segment_name(start)).write_bytes(
                b"".join(r + b"\n" for r in records[start:start + layout.SEGMENT_RECORDS]))
        os.sync()
        client = s3_client(p)
        prefix = f"{p['prefix']}/"
        puts = [(prefix + k, v) for k, v in objects.items()]
        puts += [(prefix + root + layout.journal_key(seq), r) for seq, r in enumerate(records)]
        put_objects(client, p["bucket"], puts)

    dr_flows.BEFORE_CRASH.append(export)
    os.environ[dr_flows.CRASH_ENV] = "settle"
    from durablerun.engine import EngineConfig, Run

    workflow, input_value = _workflow(p)
    Run(store=store, run=ref, workflow=workflow, input=input_value,
        config=EngineConfig(snapshot_every=int(p.get("snapshot_every", 100)))).run_attempt()
    raise RuntimeError("the marker step should have killed this process")


def _last_snapshot_due(records: list[bytes], every: int) -> int:
    """The last record the engine snapshots at, of journal ``records`` (sealed): every ``every``
    records of the first generation, then at each continuation and every ``every`` records after it."""
    from durablerun._private.records import codec

    last = len(records) - 1
    for seq in range(last, -1, -1):
        body = codec.loads(codec.unseal(records[seq], what=f"record {seq}"), what=f"record {seq}")
        if body.get("kind") == "continue":
            return seq + (last - seq) // every * every
    return (last + 1) // every * every - 1


# --- DBOS ---------------------------------------------------------------------------------


def _dbos(p: dict[str, Any]) -> Any:
    from dbos import DBOS, DBOSConfig

    config: DBOSConfig = {"name": "durablerun-bench-recovery", "system_database_url": p["url"],
                          "log_level": "WARNING", "executor_id": "bench-executor"}
    DBOS(config=config)
    return DBOS


def dbos_build(p: dict[str, Any]) -> dict[str, Any]:
    from durablerun_bench import dbos_flows

    os.environ[dbos_flows.CRASH_ENV] = "1"
    api = _dbos(p)
    api.launch()
    handle = api.start_workflow(dbos_flows.steps, int(p["n"]), True)
    handle.get_result()
    raise RuntimeError("the marker step should have killed this process")


def dbos_resume(p: dict[str, Any]) -> dict[str, Any]:
    """Launch DBOS, which recovers the pending workflow; marks like ``resume``."""
    from durablerun_bench import dbos_flows, dr_flows

    dr_flows.mark("process", dr_flows.process_start_time())
    dr_flows.mark("main", T_MAIN)
    dr_flows.mark("run")
    api = _dbos(p)
    api.launch()  # starts recovering this executor's pending workflows in the background
    dr_flows.mark("loaded")
    try:
        workflows = api.list_workflows()
        if len(workflows) != 1:
            raise RuntimeError(f"expected one workflow, found {len(workflows)}")
        result = api.retrieve_workflow(workflows[0].workflow_id).get_result()
        dr_flows.mark("result")
        if result != int(p["n"]):
            raise RuntimeError(f"DBOS recovered to {result!r}")
    finally:
        api.destroy()
    assert dbos_flows.MARK_ENV == dr_flows.MARK_ENV
    return {}


# --- the benchmark -----------------------------------------------------------------------


def _spawn(command: str, params: dict[str, Any], expect: int) -> dict[str, Any]:
    import subprocess

    proc = subprocess.run([sys.executable, "-m", "durablerun_bench.replay", command, json.dumps(params)],
                          capture_output=True, text=True, timeout=1800)
    if proc.returncode != expect:
        raise RuntimeError(f"replay {command} exited {proc.returncode}, expected {expect}:\n{proc.stderr[-3000:]}")
    lines = [line for line in proc.stdout.splitlines() if line.startswith("{")]
    return dict(json.loads(lines[-1])) if lines else {}


def phases(m: dict[str, float]) -> dict[str, float]:
    """Seconds of each phase of one resume, from the marks (all relative to the spawn)."""
    out = {
        "interpreter_s": m["main"],  # spawn -> the replay module running (interpreter + site)
        "imports_s": m["run"] - m["main"],  # the SDK's (or DBOS's) imports
        "load_s": m["loaded"] - m["run"],  # open the store, read manifest, snapshot, chunks, tail
        "replay_s": m["marker"] - m["loaded"],  # the workflow re-runs through the journaled steps
        "to_first_new_step_s": m["marker"],
        "run_to_first_new_step_s": m["marker"] - m["run"],
    }
    if "result" in m:
        out["to_result_s"] = m["result"]
    for count in _COUNTS:
        if count in m:
            out[count] = m[count]
    return out


def _median_phases(samples: list[dict[str, float]]) -> dict[str, Any]:
    import statistics

    keys = set.intersection(*(set(s) for s in samples))
    out: dict[str, Any] = {k: statistics.median(s[k] for s in samples) for k in keys}
    out["samples"] = len(samples)
    finals = [s for s in samples if "to_result_s" in s]
    if finals:
        out["to_result_s"] = finals[-1]["to_result_s"]
    return out


def bench(*, tmp: str, s3: dict[str, Any], dbos_url: str, sizes: list[int], dbos_steps: int, repeats: int,
          export_from: int, log: Any = print, flows: tuple[str, ...] = ("steps", "continuing"),
          dbos: bool = True) -> dict[str, Any]:
    """Replay of journals of each size on both stores, for the plain loop (``steps``: keys ``fs``
    and ``s3``) and the loop that continues as new every CONTINUE_EVERY steps (``continuing``:
    keys ``fs-continuing`` and ``s3-continuing``), and DBOS recovering ``dbos_steps`` steps."""
    import uuid

    marks = Path(tmp) / "marks.txt"
    fs_root = str(Path(tmp) / "replay-fs")
    results: dict[str, Any] = {"fs": {}, "s3": {}, "dbos": {}, "built": {}, "continue_every": CONTINUE_EVERY}
    for flow in flows:
        suffix = "" if flow == "steps" else f"-{flow}"
        for n in sizes:
            built: dict[str, dict[str, Any]] = {}
            run_id = f"replay{suffix}-{n}-{uuid.uuid4().hex[:6]}"
            common = {"n": n, "flow": flow, "every": CONTINUE_EVERY, "prefix": "replay", **s3}
            if n >= export_from:
                started = time.monotonic()
                _spawn("build-exported", {"run_id": run_id, "fs_root": fs_root, **common}, -9)
                for store in ("fs", "s3"):
                    built[store] = {"store": store, "root": fs_root, "run_id": run_id, **common}
                    results["built"][f"{store}{suffix}-{n}"] = {
                        "run_id": run_id, "seconds": time.monotonic() - started,
                        "how": "built in memory by the engine, written out in this store's layout"}
            else:
                for store in ("fs", "s3"):
                    p: dict[str, Any] = {"store": store, "root": fs_root, "run_id": f"{run_id}-{store}", **common}
                    started = time.monotonic()
                    _spawn("build", p, -9)
                    built[store] = p
                    seconds = time.monotonic() - started
                    rate = f" ({n / seconds:,.0f} steps/s, process start included)" if n >= 10_000 else ""
                    results["built"][f"{store}{suffix}-{n}"] = {"run_id": p["run_id"], "seconds": seconds,
                                                                "how": f"built by the SDK{rate}"}
            for store, p in built.items():
                samples = [phases(measure("resume", p, crash=True, marks=marks)) for _ in range(repeats)]
                samples.append(phases(measure("resume", p, crash=False, marks=marks)))
                key = f"{store}{suffix}"
                results.setdefault(key, {})[n] = r = _median_phases(samples)
                r["replayed_steps"] = _replayed(flow, n)
                log(f"  {key} {n:>7,} steps: first new step {r['to_first_new_step_s']:.3f}s after spawn "
                    f"(load {r['load_s']:.3f}s, replay {r['replay_s']:.3f}s, objects read {r.get('objects_read')}, "
                    f"journal read from record {r.get('loaded_from')})")
    if not dbos:
        return results
    p = {"url": dbos_url, "n": dbos_steps}
    started = time.monotonic()
    _spawn("dbos-build", p, -9)
    results["built"]["dbos"] = {"seconds": time.monotonic() - started}
    samples = [phases(measure("dbos-resume", p, crash=True, marks=marks)) for _ in range(max(1, repeats - 2))]
    samples.append(phases(measure("dbos-resume", p, crash=False, marks=marks)))
    results["dbos"][dbos_steps] = _median_phases(samples)
    r = results["dbos"][dbos_steps]
    log(f"  DBOS {dbos_steps:,} steps: first new step {r['to_first_new_step_s']:.3f}s after spawn, "
        f"result {r.get('to_result_s', float('nan')):.3f}s")
    return results


def _replayed(flow: str, n: int) -> int:
    """How many journaled steps a resume replays: all of them, or the last generation's."""
    if flow != "continuing" or n <= CONTINUE_EVERY:
        return n
    return n - (n - 1) // CONTINUE_EVERY * CONTINUE_EVERY


COMMANDS = {"build": build, "resume": resume, "build-exported": build_exported, "dbos-build": dbos_build,
            "dbos-resume": dbos_resume}


def main(argv: list[str]) -> int:
    from durablerun_bench.util import emit

    result = COMMANDS[argv[0]](json.loads(argv[1]))
    emit(result)
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
