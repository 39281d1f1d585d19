"""The run browser on a namespace of N DurableRuns (10,000): how soon its list is drawn, and how soon a change
reaches an open page, while the runs' leases are renewed around it.

On the test bed (API server, etcd, MinIO; no operator: this bench writes the runs' statuses) N runs are created
and given a Running status; ``kubectl durablerun ui`` serves them and a headless Chromium (Debian's, through
chromedriver) opens its pages. Throughout, a stand-in renews the runs' leases at RENEWALS_PER_S, as runners
would (on a cluster of 10,000 runners, ten times as many), and reports its own lag. Figures:

- ready: from the server's start until its watch holds every run (its answer says so);
- first paint: from Chromium's navigation to the list until its first page of 100 rows is drawn; and to a run's
  page until its facts are;
- /api/runs: the server's answer for a page of the list, filtered and sorted (each of a few queries, median);
- update: a run's phase written to the API server until the open list shows it; a run's message written until
  its open page shows it (UPDATES times each);
- quiet: change-feed events the list got during QUIET_S of renewals alone (each would make it ask again).

``python -m durablerun_bench.browser [--runs N]`` runs this section alone and prints its RESULTS.md section.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import threading
import time
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from durablerun import api
from durablerun._private.tools import browser
from durablerun_bench import resume
from durablerun_bench.alone import alone
from durablerun_bench.util import latencies, percentile, quick
from durablerun_testbed import binaries, chromium, procs
from durablerun_testbed.testbed import TestBed

NAMESPACE, BUCKET = "bench-browser", "bench-browser"
RENEWALS_PER_S = 100
UPDATES = 10
QUIET_S = 30.0
QUERIES = {"a page, newest first": "", "phase Running, by cost": "phase=Running&sort=cost",
           "a search matching one run": "q=r00042", "label team=a, by name": "labels=team%3Da&sort=name"}


def _run(i: int, endpoint: str) -> dict[str, Any]:
    return {"apiVersion": api.API_VERSION, "kind": api.KIND,
            "metadata": {"name": f"r{i:05d}", "namespace": NAMESPACE, "labels": {"team": "ab"[i % 2]}},
            "spec": {"workflow": "durablerun_bench.dr_flows:steps", "input": {"n": 1},
                     "checkpoint": {"uri": f"s3://{BUCKET}/runs", "endpoint": endpoint,
                                    "credentialsSecret": "s3-credentials", "region": "us-east-1"},
                     "template": {"spec": {"containers": [{"name": "runner"}]}}}}


def _status(i: int, renewed: str, **extra: Any) -> dict[str, Any]:
    return {"status": {"phase": api.Phase.RUNNING, "attempt": 1, "epoch": 1, "pod": f"r{i:05d}-a1",
                       "cost": {"usd": f"{i % 97 / 100:.2f}", "tokens": i % 997},
                       "lease": {"holder": f"r{i:05d}-a1", "epoch": 1, "acquireTime": renewed, "renewTime": renewed},
                       **extra}}


class StandInRenewals:
    """The stand-in runners: a lease renewal (a status write) for the runs in turn, RENEWALS_PER_S a second on
    8 threads. Its lag (how late each write was sent after it was due) says whether it kept up."""

    def __init__(self, bed: TestBed, runs: int) -> None:
        self.bed, self.runs = bed, runs
        self.stopping = threading.Event()
        self.sent, self.lags = 0, list[float]()
        self.thread = threading.Thread(target=self._loop, name="renewals", daemon=True)

    def __enter__(self) -> StandInRenewals:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stopping.set()
        self.thread.join(timeout=60)

    def _loop(self) -> None:
        from kubernetes import client

        local = threading.local()

        def renew(i: int, due: float) -> None:
            if not hasattr(local, "api"):
                local.api = client.CustomObjectsApi(self.bed.api_client())
            self.lags.append(max(0.0, time.monotonic() - due))
            local.api.patch_namespaced_custom_object_status(
                api.GROUP, api.VERSION, NAMESPACE, api.PLURAL, f"r{i:05d}",
                {"status": {"lease": {"renewTime": api.format_time(api.now())}}})
            self.sent += 1

        start, n = time.monotonic(), 0
        with ThreadPoolExecutor(max_workers=8) as pool:
            while not self.stopping.is_set():
                due = start + n / RENEWALS_PER_S
                if due > time.monotonic():
                    self.stopping.wait(due - time.monotonic())
                pool.submit(renew, n % self.runs, due)
                n += 1


def _create(bed: TestBed, runs: int) -> float:
    from kubernetes import client

    assert bed.s3
    endpoint, local = bed.s3.endpoint_url, threading.local()
    now = api.format_time(api.now())

    def create(i: int) -> None:
        if not hasattr(local, "api"):
            local.api = client.CustomObjectsApi(bed.api_client())
        local.api.create_namespaced_custom_object(api.GROUP, api.VERSION, NAMESPACE, api.PLURAL,
                                                  _run(i, endpoint))
        local.api.patch_namespaced_custom_object_status(api.GROUP, api.VERSION, NAMESPACE, api.PLURAL,
                                                        f"r{i:05d}", _status(i, now))

    began = time.monotonic()
    with ThreadPoolExecutor(max_workers=8) as pool:
        list(pool.map(create, range(runs)))
    return time.monotonic() - began


def _get(url: str) -> dict[str, Any]:
    with urllib.request.urlopen(url, timeout=60) as reply:
        return dict(json.load(reply))


def _answer_time(url: str, repeats: int = 5) -> float:
    took = []
    for _ in range(repeats):
        began = time.monotonic()
        _get(url)
        took.append(time.monotonic() - began)
    return statistics.median(took)


class _Feed:
    """The list's change feed, read as a page would: counts its events."""

    def __init__(self, url: str) -> None:
        self.events = 0
        self.response = urllib.request.urlopen(url, timeout=120)
        self.thread = threading.Thread(target=self._read, daemon=True)
        self.thread.start()

    def _read(self) -> None:
        try:
            for line in self.response:
                self.events += line.startswith(b"data: ")
        except (OSError, ValueError):
            pass  # closed

    def close(self) -> None:
        self.response.close()


def bench(bed: TestBed, root: Path, run_id: str, *, runs: int, log: Any = print) -> dict[str, Any]:
    from selenium import webdriver

    assert bed.s3
    resume.prepare_namespace(bed, NAMESPACE, BUCKET)
    log(f"  creating {runs} runs, each with a Running status")
    created_s = _create(bed, runs)
    result: dict[str, Any] = {"runs": runs, "created_s": created_s, "renewals_per_s": RENEWALS_PER_S}
    driver = chromium.Chromedriver(root / "chromium", run_id).start()
    options = webdriver.ChromeOptions()
    options.binary_location = str(chromium.CHROMIUM)
    for argument in chromium.chromium_arguments(driver.new_profile()):
        options.add_argument(argument)
    chrome = webdriver.Remote(command_executor=driver.url, options=options)
    ui: procs.ManagedProcess | None = None
    try:
        with StandInRenewals(bed, runs) as renewals:
            port, began = procs.free_port(), time.monotonic()
            ui = procs.ManagedProcess(
                "ui", [sys.executable, "-m", "durablerun.kubectl", "--kubeconfig", str(bed.kubeconfig), "ui",
                       "--port", str(port), "-n", NAMESPACE, "--credentials-from-secret"],
                log_path=root / "ui.log", env={**bed.env(), "KUBECTL": str(binaries.kubectl())}, testbed_id=run_id)
            url = f"http://127.0.0.1:{port}"
            procs.wait_for(lambda: _get(f"{url}/api/runs")["total"] == runs, timeout=300, interval=0.1,
                           what=f"the browser's watch to hold {runs} runs")
            result["ready_s"] = time.monotonic() - began
            log(f"  the server's watch holds {runs} runs after {result['ready_s']:.1f} s")
            result["answers"] = {name: _answer_time(f"{url}/api/runs?{query}") for name, query in QUERIES.items()}

            def drawn(script: str, want: object, what: str) -> float:
                """The seconds until ``script`` returns ``want`` in the page."""
                began = time.monotonic()
                procs.wait_for(lambda: chrome.execute_script(script) == want, timeout=60, interval=0.01, what=what)
                return time.monotonic() - began

            paints, run_paints = [], []
            for _ in range(3):
                began = time.monotonic()
                chrome.get(f"{url}/?sort=name")
                drawn("return document.querySelectorAll('#runs tbody tr').length", 100, "the list's first 100 rows")
                paints.append(time.monotonic() - began)
                began = time.monotonic()
                chrome.get(f"{url}/runs/{NAMESPACE}/r00002")
                drawn("return document.getElementById('facts').textContent.includes('r00002-a1')", True,
                      "the run's facts")
                run_paints.append(time.monotonic() - began)
            result["first_paint"], result["run_first_paint"] = paints, run_paints

            # A run's message written, until its open page shows it.
            run_updates = []
            for n in range(UPDATES):
                time.sleep(browser.RUN_EVERY)  # past the feed's coalescing: each a change alone, as most are
                began = time.monotonic()
                bed.kubectl("patch", "dr", "r00002", "-n", NAMESPACE, "--subresource=status", "--type=merge", "-p",
                            json.dumps({"status": {"message": f"update {n}"}}))
                run_updates.append(time.monotonic() - began + drawn(
                    "return document.getElementById('message').textContent", f"update {n}",
                    "the run page to show the message"))
            result["run_update"] = latencies(run_updates)

            # A run's phase written, until the open list shows it; then the list alone with the renewals.
            chrome.get(f"{url}/?sort=name")
            drawn("return document.querySelectorAll('#runs tbody tr').length", 100, "the list")
            list_updates = []
            for n in range(UPDATES):
                phase = api.Phase.FAILED if n % 2 == 0 else api.Phase.RUNNING
                time.sleep(browser.LIST_EVERY)  # as above
                began = time.monotonic()
                bed.kubectl("patch", "dr", "r00001", "-n", NAMESPACE, "--subresource=status", "--type=merge", "-p",
                            json.dumps({"status": {"phase": phase}}))
                list_updates.append(time.monotonic() - began + drawn(
                    f"return (document.querySelector('tr[data-run=\"{NAMESPACE}/r00001\"] .phase') || {{}})"
                    ".textContent", str(phase), "the list to show the phase"))
            result["list_update"] = latencies(list_updates)
            feed = _Feed(f"{url}/api/changes")
            procs.wait_for(lambda: feed.events >= 1, timeout=30, what="the feed's first event")
            sent = renewals.sent
            time.sleep(QUIET_S)  # the measurement window itself: renewals only, counting what the list is told
            result["quiet"] = {"seconds": QUIET_S, "renewals": renewals.sent - sent, "list_events": feed.events - 1}
            feed.close()
        result["renewals"] = {"sent": renewals.sent, "lag_p50": percentile(renewals.lags, 50),
                              "lag_p99": percentile(renewals.lags, 99), "lag_max": max(renewals.lags, default=0.0)}
    finally:
        if ui is not None:
            ui.stop()
        chrome.quit()
        driver.stop()
    return result


def section(r: dict[str, Any], load: str | None = None) -> list[str]:
    def ms(seconds: float) -> str:
        return f"{seconds * 1000:.0f} ms"

    q, lag = r["quiet"], r["renewals"]
    return [
        f"## The run browser on a namespace of {r['runs']:,} runs",
        "",
        *([f"Load before: {load}.", ""] if load else []),
        f"{r['runs']:,} DurableRuns, each Running, on the test bed (API server, etcd; no operator), created in "
        f"{r['created_s']:.0f} s; `kubectl durablerun ui -n` serving them to a headless Chromium, while a stand-in "
        f"renewed {r['renewals_per_s']} leases a second (it sent {lag['sent']:,}; its lag p50 {ms(lag['lag_p50'])}, "
        f"p99 {ms(lag['lag_p99'])}, max {ms(lag['lag_max'])}) (`python -m durablerun_bench.browser`).",
        "",
        "| what | took |",
        "|---|---|",
        f"| the server's start until its watch holds every run | {r['ready_s']:.1f} s |",
        *(f"| `/api/runs`: {name} | {ms(took)} |" for name, took in r["answers"].items()),
        f"| Chromium's navigation until the list's first 100 rows are drawn (3 times) | "
        f"{', '.join(ms(s) for s in r['first_paint'])} |",
        f"| Chromium's navigation until a run's page shows its facts (3 times) | "
        f"{', '.join(ms(s) for s in r['run_first_paint'])} |",
        f"| a run's phase written until the open list shows it ({UPDATES} times) | p50 {ms(r['list_update']['p50'])}, "
        f"max {ms(r['list_update']['max'])} |",
        f"| a run's message written until its open page shows it ({UPDATES} times) | "
        f"p50 {ms(r['run_update']['p50'])}, max {ms(r['run_update']['max'])} |",
        f"| change-feed events the list got in {q['seconds']:.0f} s of {q['renewals']:,} lease renewals alone | "
        f"{q['list_events']} |",
        "",
        "A write's time includes `kubectl patch` (a process, about 100 ms here). Each change is made alone, past the "
        "feeds' coalescing: the list is told at most once a second and a run's page twice a second, so while a "
        "namespace's runs keep changing what they show, a change waits up to that much more.",
        "",
    ]


def main(argv: list[str] | None = None) -> int:
    from durablerun_bench.__main__ import testbed

    parser = argparse.ArgumentParser(prog="python -m durablerun_bench.browser", description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=1_000 if quick() else 10_000)
    args = parser.parse_args(argv)
    chromium.ensure_installed()
    with alone("browser", s3=True) as run:
        assert run.s3
        with testbed(run.root, run.run_id, run.s3) as bed:
            result = bench(bed, run.root, run.run_id, runs=args.runs, log=lambda m: print(m, file=sys.stderr))
        run.report(section(result, str(run.load)), result)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
