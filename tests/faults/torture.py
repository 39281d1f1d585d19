"""Torture runs under faults done to their runner pods: the faults, the driver and the invariants.

A batch of runs executes the torture workflow while a driver per run does
one fault (``Fault``: SIGKILL, OOM kill, ``kubectl delete pod``, the Eviction
API) to the run's current runner at a random moment after its process
starts, up to ``FAULTS_PER_RUN`` times. After every run ``check_run`` checks
the invariants, whichever fault the run suffered: every step executed, at
most once more per fault that caught it in flight, the journal whole, the
result and totals the uncrashed reference's, and the status, Events, pods
and every operator's metrics agreeing with the attempts the faults ended.
"""

from __future__ import annotations

import json
import threading
import time
import urllib.error
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import timedelta
from decimal import Decimal
from pathlib import Path
from typing import Any

from kubernetes import client
from kubernetes.client.rest import ApiException

from durablerun import api
from durablerun_operator import decide
from durablerun_operator.decide import clocks
from durablerun_testbed import procs
from tests.faults.helpers import GO, finished, reference, running_pod
from tests.helpers.fault_workflows import torture_flows
from tests.helpers.journal_checks import check_journal, check_kept, list_objects, read_journal, run_root
from tests.helpers.leases import LeaseTimeline
from tests.helpers.metrics import run_metric
from tests.helpers.pods import PodRecorder, wait_pod_exit
from tests.helpers.runs import RunEnv, send_event
from tests.helpers.torture_runs import Ledger, check_executions, manifest, torture_input

FAULTS_PER_RUN = 3
SPREAD = 5.0  # seconds after a runner's process starts within which its fault falls
POLICY = {"maxRestarts": 50, "maxDisruptions": 50, "leaseDuration": "20s",
          "backoff": {"initial": "1s", "max": "1s"}}
R = api.RestartReason

#: A scrape of one operator's /metrics (``helpers.scrape``).
Samples = dict[tuple[str, frozenset[tuple[str, str]]], float]


class Gone(Exception):
    """The runner ended on its own before the fault landed: no trial."""


@dataclass(frozen=True)
class Fault:
    """Something done to a run's current runner pod, and how the operator must count the attempt it ends."""

    name: str  # its row in the tally
    reason: api.RestartReason
    inject: Callable[[RunEnv, str], None]  # raises Gone if the runner had already ended


def _node_action(action: str) -> Callable[[RunEnv, str], None]:
    def inject(runs: RunEnv, pod: str) -> None:
        node = runs.testbed.node
        assert node
        try:
            getattr(node, action)(runs.namespace, pod)
        except urllib.error.HTTPError:  # the process node has no running container for it
            raise Gone(pod) from None

    return inject


def _api_action(act: Callable[[client.CoreV1Api, str, str], Any]) -> Callable[[RunEnv, str], None]:
    def inject(runs: RunEnv, pod: str) -> None:
        if running_pod(runs, pod.rsplit("-a", 1)[0]) != pod:
            raise Gone(pod)
        try:
            act(client.CoreV1Api(runs.testbed.api_client()), runs.namespace, pod)
        except ApiException as error:
            if error.status == 404:
                raise Gone(pod) from None
            raise

    return inject


def _evict(core: client.CoreV1Api, namespace: str, pod: str) -> None:
    core.create_namespaced_pod_eviction(pod, namespace, client.V1Eviction(
        metadata=client.V1ObjectMeta(name=pod, namespace=namespace)))


RUNNER_SIGKILL = Fault("runner SIGKILL at random moments", R.CRASH, _node_action("kill"))
#: The process node kills the container as the kernel's OOM killer would and reports reason OOMKilled, exit 137.
OOM = Fault("runner OOM-killed at random moments", R.OOM_KILLED, _node_action("oom"))
POD_DELETION = Fault("runner pod deleted at random moments", R.POD_DELETED,
                     _api_action(lambda core, ns, pod: core.delete_namespaced_pod(pod, ns)))
EVICTION = Fault("runner pod evicted at random moments", R.EVICTED, _api_action(_evict))


@dataclass
class Tortured:
    name: str
    input: dict[str, Any]
    fault: Fault = RUNNER_SIGKILL
    killed: set[str] = field(default_factory=set)  # pods the fault was done to
    listings: list[dict[str, str]] = field(default_factory=list)
    error: BaseException | None = None
    lapsed: set[str] = field(default_factory=set)  # pods no fault ended whose lease lapsed (proven: check_lapses)


def drive(runs: RunEnv, pods: PodRecorder, run: Tortured, rng: Any, journal_root: str,
          faults: int = FAULTS_PER_RUN) -> None:
    """Do the run's fault to its current runner at random moments, up to ``faults`` times, until it
    finishes."""
    assert runs.testbed.s3
    s3 = runs.testbed.s3.client()
    try:
        for _ in range(faults):
            pod = procs.wait_for(lambda: "finished" if finished(runs, run.name) else running_pod(runs, run.name),
                                 timeout=180, what=f"a running runner of {run.name}")
            if pod == "finished":
                return
            time.sleep(rng.uniform(0, SPREAD))  # the random moment of the fault
            try:
                run.fault.inject(runs, pod)
            except Gone:
                continue
            run.killed.add(pod)
            wait_pod_exit(runs, pods, pod)
            run.listings.append(list_objects(s3, runs.bucket, journal_root))
    except BaseException as error:
        run.error = error


def ended_by_fault(ending: dict[str, Any] | None, fault: Fault) -> bool:
    """Whether the operator must count this ending of a faulted pod as the fault's: a crash or OOM kill is
    exit 137; a deleted or evicted pod's runner stops (Suspended), is fenced or dies of the SIGTERM, unless
    it had already reported an ordinary outcome (the run completed or waits), which the operator honours."""
    if not ending:
        return False
    if not fault.reason.disruption:
        return bool(ending.get("exitCode") == 137)
    try:
        outcome = json.loads(ending.get("message") or "")["outcome"]
    except (ValueError, KeyError, TypeError):
        return True
    return outcome in (api.Outcome.SUSPENDED.value, api.Outcome.FENCED.value)


def check_lapses(body: dict[str, Any], lapsed: set[str], told: list[dict[str, Any]], timeline: LeaseTimeline,
                 pods: PodRecorder) -> None:
    """Each lease the operator expired lapsed by its runner's own record: the pod's last renewal in the lease
    timeline (never renewed: its container's start, as its node reported it) is older than the lease's validity
    at the moment the API server stored the LeaseExpired Event. The operator decides before it posts the Event,
    and the Event's time is to the second: the decision came before that time + 1 s."""
    validity = clocks.lease_validity(decide.RunView.from_body(body))  # the lease's duration and the skew margin
    for pod in sorted(lapsed):
        stored = min(api.parse_time(e["metadata"]["creationTimestamp"]) for e in told
                     if e["reason"] == "LeaseExpired" and f"pod {pod} " in e["message"])
        assert stored is not None
        renewed = timeline.last_renewal(pod)
        reference = renewed or pods.started(pod)
        assert reference is not None, f"the operator expired pod {pod}'s lease, but its runner neither renewed nor " \
                                      "started (by its node's report)"
        what = f"last renewed it at {reference}" if renewed else f"started at {reference} and never renewed it"
        assert reference + validity < stored + timedelta(seconds=1), (
            f"the operator expired pod {pod}'s lease (its Event stored at {stored}), but its runner {what}: within "
            f"the lease's validity of {validity}")


def check_run(runs: RunEnv, pods: PodRecorder, scrapes: list[Samples], run: Tortured, expected: tuple[Any, Any],
              journal_root: str, timeline: LeaseTimeline) -> None:
    """The invariants after one tortured run. ``scrapes``: every operator's metrics, once they show it
    Succeeded (gauges must each equal the status; counters, counted by whichever operator made the
    transition, must add up to it)."""
    assert runs.testbed.s3
    status = runs.get(run.name)["status"]
    assert status["phase"] == "Succeeded", status.get("message")
    journal = read_journal(runs.testbed.s3.client(), runs.bucket, journal_root)
    # No journaled step lost or overwritten; each operation written once, by one attempt; snapshots faithful.
    check_journal(journal)
    for listing in run.listings:
        check_kept(listing, journal.etags)
    steps = torture_flows.step_names(run.input)
    assert sorted(journal.steps) == sorted(steps)
    assert len(set(journal.writers)) <= status["attempt"]
    # The result (and the cost charged by side effects) equals the uncrashed reference.
    result, totals = expected
    assert journal.last
    assert journal.last["value"] == result
    assert journal.last["totals"] == {"usd": str(totals.usd), "tokens": totals.tokens, "steps": totals.steps}
    # Status, Events, pods and metrics agree: every attempt the faults ended counted once, with its reason.
    # First one pod per epoch: the recorder keys endings by pod name, so they say how each attempt ended only
    # if no name was used for two pods.
    pods.check_one_pod_per_epoch(run.name, status["attempt"])
    endings = {p: pods.ending(p) for p in pods.pods_of(run.name)}
    crashed = {p for p, e in endings.items() if (e or {}).get("exitCode") == 137}
    assert crashed <= run.killed, f"pods crashed that nobody killed: {crashed - run.killed}"
    counted = {p for p in run.killed if ended_by_fault(endings.get(p) or wait_pod_exit(runs, pods, p), run.fault)}
    if run.fault.reason == R.OOM_KILLED:
        assert all((endings.get(p) or {}).get("reason") == "OOMKilled" for p in counted), endings
    # The operator posts a transition's Events after its status: wait for the last one.
    def with_succeeded() -> list[dict[str, Any]] | None:
        listed = runs.events(run.name)
        return listed if any(e["reason"] == "Succeeded" for e in listed) else None

    told = procs.wait_for(with_succeeded, timeout=30, what="the Succeeded Event")
    seen = Counter(e["reason"] for e in told)
    # Restarts no fault did: an attempt the operator found with its lease lapsed (a LeaseExpired Event names
    # its pod; on a loaded machine a runner can take longer than a short lease to start) is restarted for
    # that reason, as designed, and its step in flight may run again; but only if its runner's own record
    # shows the lapse (check_lapses): the operator's Event is its claim, not the evidence.
    lapsed = {p for p in endings if p not in run.killed
              and any(e["reason"] == "LeaseExpired" and f"pod {p} " in e["message"] for e in told)}
    check_lapses(runs.get(run.name), lapsed, told, timeline, pods)
    run.lapsed = lapsed
    # No step executed more often than 1 + the faults and lapsed leases that caught it in flight.
    check_executions(Ledger.read(runs, run.name), steps, run.killed | lapsed)
    restarts, disruptions = (0, len(counted)) if run.fault.reason.disruption else (len(counted), 0)
    how = {p: {k: (e or {}).get(k) for k in ("exitCode", "reason")} for p, e in sorted(endings.items())}
    assert (status["restarts"], status["disruptions"]) == (restarts + len(lapsed), disruptions), (
        f"restarts and disruptions {status['restarts']}, {status['disruptions']}; counted {sorted(counted)}, "
        f"lapsed {sorted(lapsed)}; endings {how}; events {[(e['reason'], e['message']) for e in told]}")
    assert seen["AttemptStarted"] == status["attempt"], seen
    assert seen["Restarting"] == len(counted) + len(lapsed), seen
    assert seen["Succeeded"] == 1, seen
    assert status["progress"]["completedSteps"] == totals.steps
    assert Decimal(status["cost"]["usd"]) == totals.usd
    assert status["cost"]["tokens"] == totals.tokens
    ns, name = runs.namespace, run.name
    for samples in scrapes:
        assert run_metric(samples, "durablerun_run_phase", ns, name, phase="Succeeded") == 1
        assert run_metric(samples, "durablerun_run_status_restarts", ns, name) == status["restarts"]
        assert run_metric(samples, "durablerun_run_status_disruptions", ns, name) == status["disruptions"]
        assert run_metric(samples, "durablerun_run_completed_steps", ns, name) == totals.steps
        assert run_metric(samples, "durablerun_run_cost_usd", ns, name) == float(totals.usd)

    def counter(metric: str, **labels: str) -> float:
        return sum(run_metric(samples, metric, ns, name, **labels) or 0 for samples in scrapes)

    for reason in R:
        want = len(counted) if reason == run.fault.reason else len(lapsed) if reason == R.LEASE_EXPIRED else 0
        assert counter("durablerun_run_restarts_total", reason=reason.value) == want, (reason, want)
    assert counter("durablerun_run_completions_total", outcome="Succeeded") == 1


def torture_batch(runs: RunEnv, pods: PodRecorder, scrape_all: Callable[[], list[Samples]], rng: Any,
                  batch: list[tuple[str, Fault]], tmp_path: Path,
                  faults_per_run: int = FAULTS_PER_RUN, rounds: int = 4) -> list[tuple[Tortured, str | None]]:
    """Run a batch of tortured runs (name, fault) at once, each driven by its fault, and check each: every
    run with what was done to it and why it failed the checks (None: it passed them)."""
    timeline = LeaseTimeline(runs.testbed, runs.namespace)
    try:
        return _torture_batch(runs, pods, scrape_all, rng, batch, tmp_path, faults_per_run, rounds, timeline)
    finally:
        timeline.stop()


def _torture_batch(runs: RunEnv, pods: PodRecorder, scrape_all: Callable[[], list[Samples]], rng: Any,
                   batch: list[tuple[str, Fault]], tmp_path: Path, faults_per_run: int, rounds: int,
                   timeline: LeaseTimeline) -> list[tuple[Tortured, str | None]]:
    tortured = []
    for i, (name, fault) in enumerate(batch):
        shape: dict[str, Any] = {}
        if i % 3 == 1:
            shape["waitRound"] = 1
        if i % 3 == 2:
            shape["sleepRound"] = 2
        tortured.append(Tortured(name, torture_input(name, rounds=rounds, **shape), fault))
    expected = {t.name: reference(t.input, tmp_path) for t in tortured}
    roots: dict[str, str] = {}
    threads = []
    for i, t in enumerate(tortured):
        # Half the runs snapshot every 4 records: faults also hit snapshot writes and chunk merges.
        runs.apply(manifest(runs, t.name, input=t.input, policy=POLICY, snapshot_every=4 if i % 2 else None))
        roots[t.name] = run_root("runs", runs.namespace, t.name, runs.get(t.name)["metadata"]["uid"])
        threads.append(threading.Thread(target=drive, args=(runs, pods, t, rng, roots[t.name], faults_per_run)))
        if t.input.get("waitRound") is not None:
            # The event arrives at a random moment: before the wait, during it, or while no pod runs.
            threads.append(threading.Timer(rng.uniform(0, 12), send_event, (runs, t.name, "go", GO)))
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    out: list[tuple[Tortured, str | None]] = []
    for t in tortured:
        try:
            if t.error:
                raise t.error
            runs.wait_phase(t.name, "Succeeded", "Failed", "Aborted", timeout=180)

            def settled(t: Tortured = t) -> list[Samples] | None:
                # Every gauge shows the run Succeeded, and one operator has counted it. The counter lags the
                # gauge by a moment: the winner counts a transition once its status write returns, and its
                # watch may deliver that write (setting the gauge) first.
                scrapes = scrape_all()
                ok = all(run_metric(s, "durablerun_run_phase", runs.namespace, t.name, phase="Succeeded") == 1
                         for s in scrapes) and sum(
                    run_metric(s, "durablerun_run_completions_total", runs.namespace, t.name,
                               outcome="Succeeded") or 0 for s in scrapes) >= 1
                return scrapes if ok else None

            scrapes = procs.wait_for(settled, timeout=30, what=f"metrics of {t.name}")
            check_run(runs, pods, scrapes, t, expected[t.name], roots[t.name], timeline)
            out.append((t, None))
        except AssertionError as error:
            out.append((t, f"{t.name} ({t.fault.name}, faulted {sorted(t.killed)}): {error}"))
    return out
