"""Fast checks of the benchmark harness (the benchmarks themselves run with `make bench`, not in CI)."""
# The report checks Markdown with multiplication signs: they are meant.
# ruff: noqa: RUF001

from __future__ import annotations

import math
import time
from pathlib import Path
from typing import Any

import pytest
from durablerun_bench import dr_flows, report, streams, systems, tracing, util


def test_payload_is_one_kilobyte_and_differs_per_step() -> None:
    assert len(util.payload(0)) == len(util.payload(99_999)) == 1024
    assert util.payload(1) != util.payload(2)


def test_percentiles_and_intervals() -> None:
    assert util.percentile([3.0, 1.0, 2.0, 4.0], 50) == 2.0
    assert util.percentile([float(i) for i in range(100)], 99) == 98.0
    assert math.isnan(util.percentile([], 50))
    diffs, wall = util.intervals([1.0, 1.5, 2.5])
    assert diffs == [0.5, 1.0]
    assert wall == 1.5


def test_median_run_keeps_every_rate() -> None:
    runs = [{"ops_per_s": 10.0, "x": "a"}, {"ops_per_s": 30.0, "x": "b"}, {"ops_per_s": 20.0, "x": "c"}]
    chosen = util.best_of(runs)
    assert chosen["x"] == "c"
    assert chosen["runs_ops_per_s"] == [10.0, 30.0, 20.0]


def test_process_start_time_is_this_process() -> None:
    started = dr_flows.process_start_time()
    assert started <= time.time()
    assert time.time() - started < 3600


@pytest.mark.parametrize("name", ["floor-append-fdatasync", "floor-create-fsync"])
def test_filesystem_floors_time_every_write(tmp_path: Path, name: str) -> None:
    series = systems.SYSTEMS[name]({"dir": str(tmp_path), "size": 1300, "steps": 20})
    assert len(series.latencies) == 20
    assert series.summary()["bytes"] == 1300
    assert list(tmp_path.iterdir()) == []  # cleaned up


def test_durablerun_system_measures_steps_and_record_size(tmp_path: Path) -> None:
    summary = systems.durablerun({"store": "fs", "dir": str(tmp_path), "steps": 30}).summary()
    assert summary["n"] == 29  # intervals between 30 step starts
    assert summary["record_bytes"] > 1024  # the record carries the 1 KB result
    assert summary["ops_per_s"] > 0


def _results() -> dict[str, Any]:
    row = {"ops_per_s": 2000.0, "mean_ms": 0.5, "p50_ms": 0.4, "p99_ms": 2.0, "runs_ops_per_s": [2000.0]}
    rows = [
        {"key": "floor-fdatasync", "label": "floor: append + fdatasync", "durability": "d", "floor": None,
         **row, "mean_ms": 0.3},
        {"key": "floor-s3", "label": "floor: S3 conditional PutObject (MinIO)", "durability": "d", "floor": None,
         **row, "mean_ms": 3.0},
        {"key": "dr-fs", "label": "durable-run, filesystem store", "durability": "d", "floor": "floor-fdatasync",
         **row, "ratio_floor": 1.5, "ratio_floor_p50": 1.4, "ratio_fdatasync": 1.5},
        {"key": "dr-s3", "label": "durable-run, S3 store (MinIO)", "durability": "d", "floor": "floor-s3",
         **row, "mean_ms": 3.6, "ratio_floor": 1.2, "ratio_floor_p50": 1.1, "ratio_fdatasync": 12.0},
        {"key": "dbos-pg", "label": "DBOS on PostgreSQL", "durability": "d", "floor": None, **row, "mean_ms": 4.0},
    ]
    phases = {"interpreter_s": 0.1, "imports_s": 0.3, "load_s": 0.05, "replay_s": 0.01, "to_first_new_step_s": 0.5,
              "run_to_first_new_step_s": 0.06, "to_result_s": 0.6, "objects_read": 3}
    return {
        "quick": True, "started": "now", "seconds": 60, "load_before": [1, 1, 1], "load_after": [1, 1, 1],
        "machine": {"cpu": "cpu", "cores": 2, "versions": {"dbos": "3.4.0"}},
        "steps": {"steps": 1000, "repeats": 1, "record_bytes": 1293, "rows": rows},
        "replay": {"fs": {100: phases, 10_000: {**phases, "run_to_first_new_step_s": 0.1}},
                   "s3": {10_000: phases}, "dbos": {10_000: {**phases, "to_result_s": 14.0}}, "built": {}},
        "resume": {"steps": 400, "kill_after": 200, "step_sleep_s": 0.01,
                   "median": {k: 0.4 for k in ("detection_s", "pod_creation_s", "process_start_s", "runner_start_s",
                                               "load_s", "replay_s", "total_s")},
                   "samples": [{k: 0.4 for k in ("detection_s", "pod_creation_s", "process_start_s",
                                                 "runner_start_s", "load_s", "replay_s", "total_s")}]},
        "scale": {"runs": 100, "lease_seconds": 15, "stopped": 10, "ramp_up_s": 10.0, "ramp_cpu_cores": 0.3,
                  "held_after_ramp": 100, "window_s": 60.0, "cpu_cores": 0.2, "rss_mb_max": 100.0, "hwm_mb": 101.0,
                  "api_requests_per_s": 50.0, "api_requests_by_kind": {"GET durableruns": 30.0},
                  "renewer": {"acquired": 110, "renewed": 900, "fenced": 0, "errors": 0},
                  "detection_delay": {"p50": 1.0, "p99": 3.0, "max": 3.0, "n": 10},
                  "since_last_renewal": {"p50": 16.0, "p99": 18.0, "max": 18.0, "n": 10},
                  "detection_target_s": 20, "missed_restarts": 0, "duplicated_restarts": 0},
    }


def test_report_renders_every_section_and_judges_the_targets() -> None:
    text = report.render(_results())
    for heading in ("## 1. Per-step overhead", "## 2. Replay", "## 3. Resume", "## 4. Operator scale",
                    "## Targets"):
        assert heading in text
    assert "Quick smoke run" in text
    assert "| filesystem store ≥ 3,000 steps/s, within 1.6× of append+fdatasync | 2,000 steps/s" in text
    assert "S3 store per step ≤ 1.25× one conditional PutObject | 1.20×" in text
    assert "**not measured at 1,000**" in text  # 100 runs is said to be fewer than asked
    assert "| DBOS on PostgreSQL | 8.00× | 1.11× |" in text  # side by side, per store


def test_report_shows_the_fan_out_side_by_side_and_judges_group_commit() -> None:
    def row(key: str, wall: float, puts: float | None) -> dict[str, Any]:
        got: dict[str, Any] = {"key": key, "label": key, "wall_ms": wall, "p50_ms": 1.0, "p99_ms": 2.0}
        if puts is not None:
            got.update(puts=puts, puts_per_step=puts / 100)
        return got

    rows = [row("dr-s3-group", 60.0, 3), row("dr-s3-single", 900.0, 101), row("dbos-pg", 200.0, None)]
    fan: dict[str, Any] = {"steps": 100, "step_seconds": 0.001, "repeats": 1, "rows": rows}
    results = _results()
    text = report.render({**results, "steps": {**results["steps"], "fanout": fan}})
    assert "| dr-s3-group | 60.0 | 1.00 | 2.00 | 3 | 0.03 |" in text
    assert "| dbos-pg | 200.0 | 1.00 | 2.00 | – | – |" in text
    assert ("3 PUTs in 60 ms against 101 in 900 ms; DBOS on PostgreSQL 200 ms | **met**") in text
    slow = {**fan, "rows": [row("dr-s3-group", 950.0, 3), *rows[1:]]}
    text = report.render({**results, "steps": {**results["steps"], "fanout": slow}})
    assert "3 PUTs in 950 ms against 101 in 900 ms; DBOS on PostgreSQL 200 ms | **missed**" in text


def test_report_shows_the_replica_kill_and_judges_it_against_the_shard_lease() -> None:
    decided = {"p50": 9.0, "p99": 14.0, "max": 14.5, "n": 20}
    failover = {"runs": 3000, "replicas": 3, "shards": 12, "shard_lease_s": 15, "lease_seconds": 180, "stopped": 60,
                "held_after_ramp": 3000, "ramp_up_s": 400.0, "takeover_s": 12.0, "dead_shards": 4, "load": [9.0],
                "orphaned_decided": decided, "others_decided": {**decided, "max": 3.0}, "missed_restarts": 0,
                "duplicated_restarts": 0, "standin_lapses": 0, "renewer": {"lag_p99": 0.5}, "target_s": 20}
    results = _results()
    text = report.render({**results, "scale": {**results["scale"], "failover": failover}})
    assert "### 3 sharded operators, 3,000 runs, one replica killed" in text
    assert "0 missed, 0 duplicated, decided within 14.5 s | **met**" in text
    late = {**failover, "orphaned_decided": {**decided, "max": 21.0}}
    text = report.render({**results, "scale": {**results["scale"], "failover": late}})
    assert "decided within 21.0 s | **missed**" in text


def test_a_histograms_quantile_is_read_from_the_buckets_observed_between_two_reads() -> None:
    from durablerun_bench.scale import histogram_quantile

    inf = float("inf")
    before = {0.1: 10.0, 0.5: 10.0, 1.0: 10.0, inf: 10.0}  # 10 fast requests before the window: not counted
    after = {0.1: 10.0, 0.5: 60.0, 1.0: 110.0, inf: 110.0}  # in the window: 50 in (0.1, 0.5], 50 in (0.5, 1]
    assert histogram_quantile(0.5, before, after) == pytest.approx(0.5)
    assert histogram_quantile(0.25, before, after) == pytest.approx(0.3)
    assert histogram_quantile(0.99, before, after) == pytest.approx(0.99)
    slow = {**after, inf: 210.0}  # past the last bound: the last bound, as Prometheus says
    assert histogram_quantile(0.99, before, slow) == 1.0
    assert math.isnan(histogram_quantile(0.5, after, after))  # nothing observed


def test_report_judges_waking_runs_amid_the_fleet_against_two_seconds() -> None:
    event_to_pod = {"p50": 0.6, "p99": 1.8, "max": 1.9, "n": 100}
    wake = {"runs": 100, "waiting": 100, "waiting_s": 30.0, "missed_wakes": 0, "duplicated_wakes": 0,
            "event_to_pod": event_to_pod}
    results = _results()
    text = report.render({**results, "scale": {**results["scale"], "woken_amid": wake}})
    assert "100 of 100 Waiting in 30 s; 0.60 / 1.80 / 1.90 s (n=100); 0 / 0" in text
    assert "| waiting runs woken with 100 others running: event patch → next attempt's pod within 2 s p99 | " \
           "p99 1.80 s (n=100), missed 0, duplicated 0 | **met**" in text
    for late, shown in (({**wake, "event_to_pod": {**event_to_pod, "p99": 2.5}}, "p99 2.50 s (n=100), missed 0"),
                         ({**wake, "missed_wakes": 1}, "p99 1.80 s (n=100), missed 1")):
        text = report.render({**results, "scale": {**results["scale"], "woken_amid": late}})
        assert f"{shown}, duplicated 0 | **missed**" in text


def test_report_judges_the_tracing_overhead_against_its_ten_percent() -> None:
    tracing = {"steps": 1000, "repeats": 3, "overhead": 0.042, "overhead_all": [0.05, 0.042, 0.03], "added_us": 21.0,
               "off_ms": 0.5, "on_ms": 0.521, "off_p99_ms": 2.0, "on_p99_ms": 2.1, "undelivered": 0, "target": 0.1}
    text = report.render({**_results(), "tracing": tracing})
    assert "## 5. Tracing overhead per step (filesystem store)" in text
    assert ("Tracing adds **4.2%** to a step's time (21 µs; per repeat: 5.0%, 4.2%, 3.0%), which meets the "
            "target") in text
    assert "| tracing on adds <= 10% per step (filesystem store) | 4.2% | **met** |" in text
    slow = report.render({**_results(), "tracing": {**tracing, "overhead": 0.15}})
    assert "which misses the target" in slow
    cpu = {"thread_overhead": 0.03, "thread_overhead_all": [0.03], "off_thread_cpu_ms": 0.25,
           "on_thread_cpu_ms": 0.2575, "cpu_overhead": 0.2, "cpu_overhead_all": [0.2], "off_cpu_ms": 0.27,
           "on_cpu_ms": 0.324, "child_us": 46.0, "child_us_all": [46.0, 50.2], "child_start_ms": 181.0,
           "sink": {"steps": 20000, "traced_us": 16.5, "untraced_us": 1.5},
           "runner": {"steps": 3000, "pairs": 2, "untraced_us": 250.0, "traced_us": 257.5, "added_us": 7.0,
                      "added_us_all": [6.0, 8.0]}}
    text = report.render({**_results(), "tracing": {**tracing, **cpu}})
    assert "| tracing on | 0.521 ms | 2.100 ms | 0.258 ms | 0.324 ms |" in text
    assert ("CPU of the step's thread +3.0% (per repeat: +3.0%); CPU of the runner's process +20.0% (per repeat: "
            "+20.0%). The span export child") in text
    assert ("spent 46 µs of CPU per step (per repeat: 46, 50 µs), its start included; its start alone (an attempt "
            "that ends no span) 181 ms of CPU, once per attempt, before the steps timed here.") in text
    assert ("of 20,000 steps through the engine's SinkSet, spans encoded and written to a pipe): 15.0 µs per step"
            in text)
    assert ("The runner's own share in a real run (2 alternating pairs of 3,000-step runs in one process, spans "
            "written to a pipe read every 50 ms as the export child reads it, no OpenTelemetry, no collector): "
            "**+7.0 µs** of the event loop thread's CPU per step, +2.8% (257.5 µs traced, 250.0 µs untraced; per "
            "pair: +6.0, +8.0 µs).") in text


def test_the_tracing_sinks_own_cost_is_timed_on_spans_it_made() -> None:
    cost = tracing.sink_cost(steps=200, repeats=1)
    assert cost["traced_us"] > cost["untraced_us"] > 0


def test_the_runners_own_share_is_timed_on_real_runs_that_wrote_every_span(tmp_path: Path) -> None:
    share = tracing.runner_share(tmp=str(tmp_path), steps=50, pairs=1)
    assert share["traced_us"] > 0
    assert share["untraced_us"] > 0
    assert share["added_us_all"] == [share["traced_us"] - share["untraced_us"]]


def test_report_shows_the_timeline_pages_beside_the_whole_read() -> None:
    rows = [{"store": "filesystem", "what": "whole journal, then page 1 (before)", "ms": 7000.0,
             "ms_all": [7000.0, 7100.0], "peak_mib": 175.7, "entries": 200},
            {"store": "filesystem", "what": "last page (records 99,800+)", "ms": 20.5, "ms_all": [20.5, 30.0],
             "peak_mib": 1.9, "entries": 200}]
    text = report.render({**_results(), "timelines": {"records": 100_000, "page": 200, "repeats": 2, "rows": rows}})
    assert "## 6. The run browser's timeline of a 100,000-record journal" in text
    assert "| filesystem | whole journal, then page 1 (before) | 7000.0 ms | 7000.0, 7100.0 ms | 175.7 MiB |" in text
    assert "| filesystem | last page (records 99,800+) | 20.5 ms | 20.5, 30.0 ms | 1.9 MiB |" in text


def test_report_judges_kueue_admission_against_its_quota() -> None:
    p = {"p50": 1.0, "p90": 2.0, "p99": 3.0, "max": 4.0}
    cycle = {stage: p for stage in ("pod_to_lease", "lease_to_outcome", "outcome_to_exited", "exited_to_succeeded",
                                    "succeeded_to_released", "released_to_next_admitted", "admitted_to_pod")}
    k = {"runs": 100, "quota": 10, "steps": 5, "sleep": 0.5, "applied_s": 12.0, "kueue_start_s": 20.0,
         "most_live_pods": 10, "makespan_s": 59.0, "create_to_admitted": p, "create_to_pod": p,
         "missed_admissions": 0, "cycle": cycle}
    text = report.render({**_results(), "kueue": k})
    assert "## Admission through Kueue" in text
    assert "| to its pod | 1.00 s | 2.00 s | 3.00 s | 4.00 s |" in text
    assert "| **a turn, the medians summed** | 7.00 s | | | |" in text
    assert "At most **10** runner pods were alive at once: never more than the quota's 10." in text
    assert "| never more than the quota's 10 runner pods at once (Kueue) | 10 | **met** |" in text
    # 10 turns of 2.5 s of steps, twice, plus 10 pod starts of 1 s: 60 s.
    assert "within twice the steps' time plus a pod start per slot turn (60 s) | 59 s | **met** |" in text
    over = report.render({**_results(), "kueue": {**k, "most_live_pods": 11, "makespan_s": 61.0}})
    assert "| never more than the quota's 10 runner pods at once (Kueue) | 11 | **missed** |" in over
    assert "per slot turn (60 s) | 61 s | **missed** |" in over


def test_the_streams_section_measures_real_runs_and_their_reader(tmp_path: Path) -> None:
    from durablerun.stores import open_store

    store = open_store(f"file://{tmp_path}/s")
    thr = streams.throughput(store, writes=200)
    assert thr["chunks"] >= 1
    assert thr["chunks_per_s"] > 0
    lat = streams.latency(store, lines=10)  # every line read, each after it was written
    assert lat["lines"] == 10
    assert 0 < lat["p50_ms"] <= lat["p99_ms"] <= lat["max_ms"]
    cost = streams.step_cost(store, steps=10, repeats=1)
    assert cost["with_us"] > 0
    assert cost["ratio"] == cost["with_us"] / cost["without_us"]
    text = report.render({**_results(), "streams": {"rows": [{"store": "filesystem", "throughput": thr,
                                                               "latency": lat, "cost": cost}],
                                                     "batch_bytes": 65536, "batch_seconds": 0.25}})
    assert "## Output streams" in text
    assert f"| filesystem | {thr['writes_per_s']:,.0f}/s |" in text


def test_report_judges_the_schedules_against_firing_once_each() -> None:
    p = {"p50": 1.0, "p90": 2.0, "p99": 3.0, "max": 4.0}
    s = {"schedules": 100, "applied_s": 3.0, "fired_on_first_tick": 100, "tick_to_run": p, "tick_to_pod": p}
    text = report.render({**_results(), "schedules": s})
    assert "| its pod created | 1 s | 2 s | 3 s | 4 s |" in text
    assert "| every schedule fires once at its tick (100 in one minute) | 100 of 100 | **met** |" in text
    missed = report.render({**_results(), "schedules": {**s, "fired_on_first_tick": 99}})
    assert "| 99 of 100 | **missed** |" in missed
    alone = report.render({**_results(), "schedules": {**s, "controller_alone": {
        "fired_on_first_tick": 100, "tick_to_run": {**p, "max": 12.0}}}})
    assert "| the run created, its runs suspended (the schedule controller alone) | 1 s | 2 s | 3 s | 12 s |" in alone
    assert "(the schedule controller alone) | 12 s | **missed** |" in alone


def test_report_judges_preemption_at_a_step_boundary_beside_cut_off_steps() -> None:
    def row(label: str, again: int) -> dict[str, Any]:
        return {"label": label, "grace": None, "preemptions": 5, "disruptions": 5, "restarts": 0, "steps_run": 14,
                "executed_again": again, "again_per_preemption": again / 5, "seconds_lost": again * 4.0,
                "high_to_pod_s": [3.0, 5.0, 4.0]}

    p: dict[str, Any] = {"steps": 14, "seconds": 4.0, "preemptions": 5,
                         "rows": [row("cut off mid-step (stopGracePeriod 0s)", 5),
                                  row("at a step boundary (the default)", 0)]}
    text = report.render({**_results(), "preemption": p})
    assert "| cut off mid-step (stopGracePeriod 0s) | 5 (5) | 5 | 1.00 | 20 s | 4 s |" in text
    assert "| at a step boundary (the default) | 5 (5) | 0 | 0.00 | 0 s | 4 s |" in text
    assert "(real node, Kueue) | 0.00 | **met** |" in text
    p["rows"][-1] = row("at a step boundary (the default)", 1)
    assert "(real node, Kueue) | 0.20 | **missed** |" in report.render({**_results(), "preemption": p})
    assert "Preemption through Kueue" not in report.render({**_results(), "preemption": None})  # no real node


def test_requests_per_run_are_the_counters_difference_divided_by_the_runs() -> None:
    from durablerun_bench import scale

    before = {("create", "pods"): 10.0, ("patch", "durableruns/status"): 5.0, ("list", "pods"): 3.0}
    after = {("create", "pods"): 110.0, ("patch", "durableruns/status"): 305.0, ("list", "pods"): 4.0,
             ("create", "events"): 100.0}
    assert scale.per_run(before, after, 100) == {"patch durableruns/status": 3.0, "create pods": 1.0,
                                                 "create events": 1.0}  # most first; 0.01 LISTs a run left out


def test_report_skips_sections_that_did_not_run() -> None:
    results = _results()
    for section in ("steps", "replay", "resume", "scale"):
        del results[section]
    text = report.render(results)
    assert "## 1." not in text
    assert "## Targets" not in text


def test_replay_target_is_judged_on_the_continuing_workflow_with_the_plain_loop_beside_it() -> None:
    results = _results()
    phases = results["replay"]["fs"][100]

    def at(seconds: float, objects: int, replayed: int) -> dict[str, Any]:
        return {**phases, "run_to_first_new_step_s": seconds, "objects_read": objects, "replayed_steps": replayed}

    results["replay"] = {
        "continue_every": 1000, "dbos": {}, "built": {},
        "fs": {"100": at(0.04, 3, 100), "100000": at(4.8, 8, 100_000)},
        "fs-continuing": {"100": at(0.04, 3, 100), "100000": at(0.07, 5, 1000)},
        "s3": {"100": at(0.7, 3, 100), "100000": at(4.5, 8, 100_000)},
        "s3-continuing": {"100": at(0.7, 3, 100), "100000": at(1.6, 5, 1000)},
    }
    text = report.render(results)
    assert ("| durable-run, filesystem | plain loop | 100,000 | 100,000 | 8 |" in text)
    assert ("| durable-run, filesystem | continue_as_new every 1,000 | 100,000 | 1,000 | 5 |" in text)
    fs_target = next(line for line in text.splitlines()
                     if line.startswith("| replay flat (within 2×) from 100 to 100,000 steps, fs store"))
    assert "1.8× with `ctx.continue_as_new` every 1,000 steps (0.040 s → 0.070 s" in fs_target
    assert "plain loop 120.0× (0.040 s → 4.800 s), O(N) by design" in fs_target
    assert fs_target.endswith("| **met** |")
    s3_target = next(line for line in text.splitlines() if "steps, s3 store" in line)
    assert "2.3× with `ctx.continue_as_new`" in s3_target
    assert s3_target.endswith("| **missed** |")


def test_the_export_waits_for_the_snapshot_the_engine_takes_last() -> None:
    from durablerun_bench import replay

    from durablerun._private.records import codec

    def recs(kinds: list[str]) -> list[bytes]:
        return [codec.seal(codec.dumps({"seq": i, "kind": k})) for i, k in enumerate(kinds)]

    assert replay._last_snapshot_due(recs(["step"] * 250), 100) == 199
    assert replay._last_snapshot_due(recs(["step"] * 100 + ["continue"] + ["step"] * 150), 100) == 200
    assert replay._last_snapshot_due(recs(["step"] * 100 + ["continue"] + ["step"] * 99), 100) == 100


def test_replay_counts_how_many_steps_a_resume_replays() -> None:
    from durablerun_bench import replay

    assert replay._replayed("steps", 100_000) == 100_000
    assert replay._replayed("continuing", 100) == 100
    assert replay._replayed("continuing", 10_000) == 1_000
    assert replay._replayed("continuing", 100_500) == 500


def test_replay_harness_builds_and_resumes_a_continuing_journal(tmp_path: Path,
                                                               monkeypatch: pytest.MonkeyPatch) -> None:
    """The replay section's code path on the filesystem store, small: a crash leaves 25 steps in
    generations of 10; the resume reads from the last continuation and completes."""
    import os

    from durablerun_bench import replay

    bench_dir = Path(replay.__file__).resolve().parent.parent
    runner_dir = bench_dir.parent / "runner"
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(bench_dir), str(runner_dir),
                                                      os.environ.get("PYTHONPATH", "")]))
    p = {"store": "fs", "root": str(tmp_path / "fs"), "run_id": "c", "n": 25, "flow": "continuing", "every": 10}
    replay._spawn("build", p, -9)
    crashed = replay.phases(replay.measure("resume", p, crash=True, marks=tmp_path / "marks"))
    done = replay.phases(replay.measure("resume", p, crash=False, marks=tmp_path / "marks"))
    # Generations of 10 steps, each ended by its continuation record: the last one is record 21.
    assert crashed["loaded_from"] == done["loaded_from"] == 21
    assert done["objects_read"] >= 2
    assert done["to_result_s"] >= done["to_first_new_step_s"] > done["interpreter_s"]


def test_replay_harness_exports_a_built_journal_to_both_stores(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                               s3_server: Any, s3_bucket: str) -> None:
    """The 100,000-step path, small: built in memory, written out in the filesystem and the S3
    layouts with the snapshot that covers the last record, and resumed from each."""
    import os

    from durablerun_bench import replay

    bench_dir = Path(replay.__file__).resolve().parent.parent
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(bench_dir), str(bench_dir.parent / "runner"),
                                                      os.environ.get("PYTHONPATH", "")]))
    s3 = {"endpoint": s3_server.endpoint_url, "access_key": s3_server.access_key,
          "secret_key": s3_server.secret_key, "bucket": s3_bucket}
    common = {"run_id": "exp", "n": 250, "flow": "continuing", "every": 100, "prefix": "replay", "snapshot_every": 20,
              **s3}
    replay._spawn("build-exported", {**common, "fs_root": str(tmp_path / "fs")}, -9)
    for store in ("fs", "s3"):
        done = replay.phases(replay.measure("resume", {**common, "store": store, "root": str(tmp_path / "fs")},
                                            crash=False, marks=tmp_path / f"marks-{store}"))
        # Generations of 100 steps: the last continuation is record 201; snapshots at it and every 20
        # records after it cover the journal up to 241, so the pointer, its chunks and a tail of at
        # most the last 10 records (one object each on S3) are read.
        assert done["loaded_from"] == 201
        assert done["objects_read"] <= (5 if store == "fs" else 14), done


def _window(cores: float) -> dict[str, Any]:
    return {"window_s": 60.0, "cpu_cores": cores, "rss_mb_max": 120.0, "api_requests_per_s": 20.0,
            "api_requests_by_kind": {"PATCH durableruns/status": 16.0, "GET durableruns": 4.0},
            "apiserver_cores": 0.2, "etcd_cores": 0.05, "etcd_db_bytes": 2**24, "etcd_db_in_use_bytes": 2**23}


def test_report_judges_the_write_cost_and_the_sizes_and_divides_per_thousand_runs() -> None:
    results = _results()
    rows: dict[str, dict[str, Any]] = {"configmap": {"apiserver_ms": 2.0}, "dr-shipped": {"apiserver_ms": 6.0},
                                       "dr-schemaless": {"apiserver_ms": 3.0}}
    for row in rows.values():
        row.update(etcd_ms=1.0, wall_ms=5.0, x_configmap=row["apiserver_ms"] / 2.0,
                   rounds_apiserver_ms=[row["apiserver_ms"]])
    results["writecost"] = {"writes": 300, "rounds": 1, "rows": rows, "objects": {
        "parent": {"children": 1000, "bytes": 600 * 1024}, "events": {"events": 500, "bytes": 100 * 1024}}}
    results["scale"].update(runs=2000, lease_seconds=180, mean_bytes=4096, max_bytes=8192, standins=1,
                            **_window(0.2))
    larger = {**results["scale"], "runs": 10_000, **_window(1.5), "mean_bytes": 4096}
    results["scale"]["more_active"] = [larger]
    results["scale"]["waiting"] = {"runs": 4000, "woken": 100, "standins": 2, "idle": _window(0.04),
                                   "event_to_pod": {"p50": 0.5, "p99": 1.5, "max": 2.0, "n": 100},
                                   "missed_wakes": 0, "duplicated_wakes": 0, "mean_bytes": 3072, "max_bytes": 4096}
    text = report.render(results)
    assert "a DurableRun status write within 2× of a ConfigMap patch (API server CPU) | 3.00×" in text
    assert "| a parent of 1,000 children under 256 KiB | 600.0 KiB | **missed** |" in text
    assert "| a run sent 500 events under 256 KiB | 100.0 KiB | **met** |" in text
    assert "### Per 1,000 runs: 2,000, 10,000 active, 4,000 waiting" in text
    assert "| operator CPU (cores) | 0.100 | 0.150 | 0.010 |" in text  # 0.2 / 2, 1.5 / 10 and 0.04 / 4
    assert "| operator CPU | 0.20 cores | 1.50 cores |" in text  # the sizes side by side, undivided
    # 16 status PATCHes/s over 2,000 runs: 0.48 a minute per run; over 10,000: 0.10.
    assert "| 2,000 runs: at most one status write a minute per active run (default lease) | 0.48 status PATCHes/min" \
        in text
    assert "| 10,000 runs: at most one status write a minute per active run (default lease) | 0.10 status PATCHes" \
        in text
    assert "| 4,000 waiting runs: operator under 0.1 core while nothing happens | 0.040 cores | **met** |" in text
    assert "| 4,000 waiting runs: event patch → next attempt's pod within 2 s p99 | p99 1.50 s" in text


def test_the_scratch_crds_change_only_what_their_variant_names() -> None:
    from durablerun_bench import writecost

    def schema(variant: str) -> dict[str, Any]:
        return dict(writecost.scratch_documents(variant)[0]["spec"]["versions"][0]["schema"]["openAPIV3Schema"])

    shipped = schema("shipped")
    assert "x-kubernetes-validations" in str(shipped)
    assert "x-kubernetes-validations" not in str(schema("no-cel"))
    template = schema("template-schemaless")["properties"]["spec"]["properties"]["template"]
    assert template["x-kubernetes-preserve-unknown-fields"] is True
    assert "properties" not in template
    assert schema("status-schemaless")["properties"]["spec"] == shipped["properties"]["spec"]
    crd, policy, binding = writecost.scratch_documents("vap-on-status")
    assert crd["spec"]["group"] == "vap-on-status.writecost.bench"
    assert policy["spec"]["matchConstraints"]["resourceRules"][0]["resources"] == ["durableruns",
                                                                                    "durableruns/status"]
    assert binding["spec"]["policyName"] == policy["metadata"]["name"]
    shipped_policy = writecost.scratch_documents("shipped")[1]
    assert shipped_policy["spec"]["matchConstraints"]["resourceRules"][0]["resources"] == ["durableruns"]
    # The runner's writes go through the runner-status policy as shipped, moved to the scratch group whole.
    status_policy, status_binding, *rbac = writecost.runner_documents("shipped.writecost.bench", "durableruns", "ns")
    assert status_policy["spec"]["matchConstraints"]["resourceRules"][0]["apiGroups"] == ["shipped.writecost.bench"]
    assert status_policy["spec"]["matchConstraints"]["resourceRules"][0]["resources"] == ["durableruns/status"]
    assert "'shipped.writecost.bench'" in status_policy["spec"]["matchConditions"][0]["expression"]
    from durablerun import api

    assert api.GROUP not in str(status_policy["spec"])
    assert status_binding["spec"]["policyName"] == status_policy["metadata"]["name"]
    assert [o["kind"] for o in rbac] == ["ServiceAccount", "Role", "RoleBinding"]


def test_report_judges_the_per_step_targets_and_shows_what_the_sync_hop_costs() -> None:
    results = _results()
    rows = results["steps"]["rows"]
    dr_fs = next(r for r in rows if r["key"] == "dr-fs")
    dr_fs.update(ops_per_s=6000.0, floor="floor-overwrite", ratio_floor=1.25, ratio_floor_p50=1.2,
                 ratio_floor_all=[1.25, 1.3, 1.2], cpu_ms_per_step=0.03)
    rows.append({"key": "floor-overwrite", "label": "floor: overwrite zeros + fdatasync", "durability": "d",
                 "floor": None, "ops_per_s": 9000.0, "mean_ms": 0.11, "p50_ms": 0.1, "p99_ms": 0.2,
                 "runs_ops_per_s": [9000.0]})
    row = {"durability": "d", "floor": "floor-fdatasync", "mean_ms": 0.2, "p50_ms": 0.2, "p99_ms": 1.0,
           "runs_ops_per_s": [1.0]}
    rows += [{**row, "key": "dr-fs-sync", "label": "sync", "ops_per_s": 4000.0, "cpu_ms_per_step": 0.09},
             {**row, "key": "dr-fs-sync-inline", "label": "inline", "ops_per_s": 5800.0, "cpu_ms_per_step": 0.035}]
    text = report.render(results)
    assert ("| filesystem store within 1.3× of its own floor, overwrite zeros + fdatasync (bracketed) | 1.25× | "
            "**met** |") in text
    assert ("its own floor is *overwrite zeros + fdatasync*, measured in the same process right before and after "
            "it: 1.25× that (p50 1.20×; every repeat: 1.25, 1.30, 1.20).") in text
    assert ("| a sync step function within 1.3× of an async one (filesystem store) | 4,000 against 6,000 steps/s, "
            "1.50× | **missed** |") in text
    assert ("4,000 steps/s (CPU 90 µs a step), against 5,800 steps/s (CPU 35 µs) for the same fn on the loop "
            "thread (`sync_steps_in_threads=False`) and 6,000 (CPU 30 µs) for an async one: the difference is the "
            "hop.") in text


def test_report_shows_the_run_browser_on_a_large_namespace() -> None:
    def spread(p50: float, top: float) -> dict[str, float]:
        return {"p50": p50, "p90": top, "p99": top, "max": top}

    browser = {"runs": 10000, "created_s": 59.9, "renewals_per_s": 100, "ready_s": 11.33,
               "answers": {"a page, newest first": 0.016, "phase Running, by cost": 0.028},
               "first_paint": [0.233, 0.147, 0.418], "run_first_paint": [0.529, 0.453, 0.623],
               "run_update": spread(0.347, 0.682), "list_update": spread(0.160, 0.274),
               "quiet": {"seconds": 30.0, "renewals": 3000, "list_events": 0},
               "renewals": {"sent": 6655, "lag_p50": 0.0007, "lag_p99": 0.23, "lag_max": 0.41}}
    text = report.render({**_results(), "browser": browser})
    assert "## The run browser on a namespace of 10,000 runs" in text
    assert "| the server's start until its watch holds every run | 11.3 s |" in text
    assert "| a run's phase written until the open list shows it (10 times) | p50 160 ms, max 274 ms |" in text
    assert "| change-feed events the list got in 30 s of 3,000 lease renewals alone | 0 |" in text
