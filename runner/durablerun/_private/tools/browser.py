"""``kubectl durablerun ui``: the run browser, a local web server acting as the user (docs/web.md).

Like ``kubectl proxy`` it listens on 127.0.0.1 only and makes every call with the user's own kubectl
(kubeconfig, context): Kubernetes RBAC decides what each person sees and changes. The runs list is a LIST and a
WATCH (``kubectl get --raw``) kept in memory; a page is told through a change feed (Server-Sent Events) when the
runs it shows changed, and only then asks for them. A run's timeline is read from its journal with the
credentials ``kubectl durablerun journal`` uses, a page at a time: a page reads its own records, never the
journal whole; its output streams are read the same way, with the reader ``durablerun stream`` uses, from the
offset the page got to. Actions are the plugin's own (``kubeapi``), by POST with this server's token only
(CSRF), and a request naming another host is refused (DNS rebinding).
"""

from __future__ import annotations

import argparse
import itertools
import json
import re
import secrets
import signal
import subprocess
import threading
import time
from collections import OrderedDict
from decimal import Decimal, InvalidOperation
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlencode, urlsplit

from durablerun import api, errors, resource
from durablerun._private.records.layout import RunRef, stream_name_error
from durablerun._private.storage import logs
from durablerun._private.storage.stores import Store
from durablerun._private.storage.stream_reader import StreamReader
from durablerun._private.storage.streams import StreamObjects
from durablerun._private.tools import kubeapi, reruns, timeline
from durablerun._private.tools.kubeapi import Kubectl, PluginError

ASSETS = Path(__file__).parent / "browser_assets"
STATIC = {"ui.css": "text/css; charset=utf-8", "ui.js": "text/javascript; charset=utf-8"}
RUNS_PAGE = 100  # runs per page of the list
TIMELINE_PAGE = 200  # timeline entries per page: a run of 100,000 steps is never sent whole
STREAM_PAGE = 200  # stream chunks per answer: the page asks again at once while there are more
LOG_TAIL_BYTES = 256 * 1024  # of an attempt's logs, the page shows the end (the CLI prints them whole)
TOKEN_HEADER = "X-Durablerun-Token"
QUEUE_LABEL = "kueue.x-k8s.io/queue-name"  # Kueue's own label naming a workload's LocalQueue
PERMISSION_TTL = 30.0  # seconds an answer of the API server's SelfSubjectAccessReview is reused
KEEPALIVE_SECONDS = 15.0  # a comment on an idle change feed, so that proxies and the browser keep it open
#: A change feed tells the list at most once a second (a fleet's changes, coalesced) and a run's page at most
#: twice a second; each page then asks for what it shows.
LIST_EVERY, RUN_EVERY = 1.0, 0.5
MAX_FEEDS = 64  # open change feeds: each holds a thread of this server
TRACE_ID = re.compile(r"[0-9a-f]{32}")  # status.traceID, as api.trace_id writes it


def summary(body: dict[str, Any]) -> dict[str, Any]:
    """What the list shows of a run (and filters on)."""
    meta, status = body["metadata"], body.get("status") or {}
    labels = meta.get("labels") or {}
    waiting = status.get("waitingFor") or {}
    return {"namespace": meta["namespace"], "name": meta["name"], "phase": status.get("phase") or "",
            "message": status.get("message") or "", "labels": labels, "queue": labels.get(QUEUE_LABEL, ""),
            "created": meta.get("creationTimestamp") or "", "usd": (status.get("cost") or {}).get("usd") or "0",
            "tokens": (status.get("cost") or {}).get("tokens") or 0, "attempt": status.get("attempt") or 0,
            "restarts": status.get("restarts") or 0, "waitingFor": waiting.get("event") or waiting.get("wakeTime"),
            "parent": labels.get(api.LABEL_PARENT, "")}


class Filters:
    """The list's filters, from the query string; a bad one is a ``ValueError`` naming the field."""

    def __init__(self, query: dict[str, list[str]]) -> None:
        def one(key: str) -> str:
            return (query.get(key) or [""])[0].strip()

        self.phases = {p for p in one("phase").split(",") if p}
        unknown = self.phases - {p.value for p in api.Phase}
        if unknown:
            raise ValueError(f"phase: {', '.join(sorted(unknown))} is not a phase "
                             f"({', '.join(p.value for p in api.Phase)})")
        self.labels: list[tuple[str, str | None]] = []
        for term in (t.strip() for t in one("label").split(",") if t.strip()):
            key, _, value = term.partition("=")
            self.labels.append((key.strip(), value.strip() if "=" in term else None))
        self.queue = one("queue")
        self.max_age: float | None = None
        if one("age"):
            try:
                self.max_age = api.parse_duration(one("age")).total_seconds()
            except ValueError as e:
                raise ValueError(f"age: {e} (e.g. 30m, 2h, 7d)") from None
        #: Words every run shown has in its namespace, name or message (any case).
        self.words = one("q").lower().split()
        self.sort = one("sort") or "newest"
        if self.sort not in SORTS:
            raise ValueError(f"sort: {self.sort!r} is not one of {', '.join(SORTS)}")
        self.min_usd: Decimal | None = None
        if one("cost"):
            try:
                self.min_usd = Decimal(one("cost"))
            except InvalidOperation:
                raise ValueError(f"cost: {one('cost')!r} is not a number of US dollars (e.g. 0.5)") from None

    def __call__(self, run: dict[str, Any], now: float) -> bool:
        if self.phases and run["phase"] not in self.phases:
            return False
        for key, value in self.labels:
            if key not in run["labels"] or (value is not None and run["labels"][key] != value):
                return False
        if self.queue and run["queue"] != self.queue:
            return False
        if self.words:
            searched = f"{run['namespace']}/{run['name']} {run['message']}".lower()
            if not all(word in searched for word in self.words):
                return False
        if self.max_age is not None and (not run["created"]
                                         or now - api.parse_time(run["created"]).timestamp() > self.max_age):
            return False
        return self.min_usd is None or Decimal(run["usd"]) >= self.min_usd


#: The list's orders: ``sort=`` name -> (key, descending). Ties are in namespace and name order.
SORTS: dict[str, tuple[Any, bool]] = {
    "newest": (lambda r: r["created"], True),
    "oldest": (lambda r: r["created"], False),
    "name": (lambda r: r["name"], False),
    "cost": (lambda r: (Decimal(r["usd"]), r["tokens"]), True),
    "restarts": (lambda r: r["restarts"], True),
}


class RunWatch:
    """Every run the user may list, kept current as an informer keeps its cache: a LIST (500 runs a request),
    then a WATCH from the list's resourceVersion, resumed from the last version seen when it ends, the whole
    listed again when the API server says that version is too old. Both through the user's kubectl
    (``get --raw``: the API server's own JSON, a line per watch event; ``get --watch`` prints objects one by one
    and took 100 s to show 10,000 runs here, the raw LIST and WATCH 11 s)."""

    CHUNK = 500

    def __init__(self, kube: Kubectl, all_namespaces: bool) -> None:
        self.kube, self.all_namespaces = kube, all_namespaces
        self.runs: dict[tuple[str, str], dict[str, Any]] = {}
        self.version = 0  # bumped when what the list shows changed (a lease renewal alone does not)
        #: Each run's last change (any, its lease's too), by a count of the watch's events: its page's feed.
        self.touched: dict[tuple[str, str], int] = {}
        self.events = 0
        self.error = ""  # the last watch's complaint (e.g. Forbidden), shown on the list
        self.lock = threading.Lock()
        self.changed = threading.Condition(self.lock)
        self.stopping = threading.Event()
        self.process: subprocess.Popen[str] | None = None
        self.thread = threading.Thread(target=self._loop, name="run-watch", daemon=True)

    def start(self) -> RunWatch:
        self.thread.start()
        return self

    def stop(self) -> None:
        self.stopping.set()
        with self.changed:
            self.changed.notify_all()  # the feeds end
        if self.process and self.process.poll() is None:
            self.process.terminate()
            self.process.wait(timeout=10)
        self.thread.join(timeout=10)

    def _path(self) -> str:
        where = "" if self.all_namespaces else f"namespaces/{self.kube.namespace()}/"
        return f"/apis/{api.GROUP}/{api.VERSION}/{where}{api.PLURAL}"

    def _loop(self) -> None:
        version = ""  # the resourceVersion to watch from; "" lists first
        while not self.stopping.is_set():
            try:
                if not version:
                    version = self._list()
                version = self._watch(version)
            except (PluginError, ValueError, KeyError) as e:  # refused, or an answer that is not the API's JSON
                with self.changed:
                    self.error, self.version = str(e) or type(e).__name__, self.version + 1
                    self.changed.notify_all()
                version = ""
                self.stopping.wait(2.0)

    def _list(self) -> str:
        """Every run, a page at a time; replaces what the watch held. Returns the list's resourceVersion."""
        listed: dict[tuple[str, str], dict[str, Any]] = {}
        token = ""
        while True:
            query = urlencode({"limit": self.CHUNK, **({"continue": token} if token else {})})
            page = json.loads(self.kube("get", "--raw", f"{self._path()}?{query}").stdout)
            for body in page.get("items") or []:
                listed[(body["metadata"]["namespace"], body["metadata"]["name"])] = body
            token = page["metadata"].get("continue") or ""
            if not token:
                break
        with self.changed:
            for key in set(self.runs) - set(listed):
                self._tell(key, None)
            for key, body in listed.items():
                self._tell(key, body)
            self.version, self.error = self.version + 1, ""
            self.changed.notify_all()
        return str(page["metadata"]["resourceVersion"])

    def _watch(self, version: str) -> str:
        """Watch from ``version`` until the watch ends; the version to go on from ("": list again)."""
        query = urlencode({"watch": "true", "resourceVersion": version, "allowWatchBookmarks": "true"})
        argv = [self.kube.binary, *self.kube.flags, "get", "--raw", f"{self._path()}?{query}"]
        self.process = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        assert self.process.stdout
        assert self.process.stderr
        for line in self.process.stdout:  # the API server's watch: one JSON event a line
            event = json.loads(line)
            body = event.get("object") or {}
            if event.get("type") == "ERROR":  # 410 Gone: that version is too old to watch from
                version = ""
                break
            version = body.get("metadata", {}).get("resourceVersion") or version
            if event.get("type") == "BOOKMARK" or body.get("kind") != api.KIND:
                continue
            with self.changed:
                self._tell((body["metadata"]["namespace"], body["metadata"]["name"]),
                           None if event.get("type") == "DELETED" else body)
                self.changed.notify_all()
        if self.process.poll() is None:
            self.process.terminate()
        stderr = self.process.stderr.read()
        if self.process.wait() != 0 and not self.stopping.is_set() and version:
            raise PluginError(stderr.strip() or "the watch of the runs failed")
        return version

    def _tell(self, key: tuple[str, str], body: dict[str, Any] | None) -> None:
        """What the API server told of a run (None: deleted); call with the lock held."""
        shown = None if body is None else summary(body)
        before = self.runs.pop(key, None) if shown is None else self.runs.get(key)
        if shown is not None:
            self.runs[key] = shown
        if shown != before or self.error:
            self.version, self.error = self.version + 1, ""
        self.events += 1
        self.touched[key] = self.events

    def wait_change(self, seen: int, run: tuple[str, str] | None, timeout: float) -> int:
        """The list's version (or with ``run``, that run's last change) once it is not ``seen``, or after
        ``timeout`` seconds or when the server stops, whatever it is then."""
        def now() -> int:
            return self.version if run is None else self.touched.get(run, 0)

        with self.changed:
            self.changed.wait_for(lambda: now() != seen or self.stopping.is_set(), timeout)
            return now()

    def page(self, filters: Filters, offset: int) -> dict[str, Any]:
        now = time.time()
        with self.lock:
            found = [r for r in self.runs.values() if filters(r, now)]
            version, error = self.version, self.error
        key, descending = SORTS[filters.sort]
        found.sort(key=lambda r: (r["namespace"], r["name"]))
        found.sort(key=key, reverse=descending)  # stable: ties keep the order above
        return {"version": version, "error": error, "total": len(found), "offset": offset,
                "runs": found[offset:offset + RUNS_PAGE]}

    def children(self, namespace: str, name: str, seen: frozenset[str] = frozenset()) -> list[dict[str, Any]]:
        """The run's child runs (label durablerun.dev/parent), recursively, oldest first."""
        with self.lock:
            found = [r for r in self.runs.values() if r["namespace"] == namespace and r["parent"] == name]
        found.sort(key=lambda r: r["created"])
        return [{**r, "children": [] if r["name"] in seen else self.children(namespace, r["name"], seen | {name})}
                for r in found]


class Timelines:
    """The open journals of the last few runs looked at. A timeline page reads only its own records (and a
    few before them) from the store, never the journal whole (``timeline.page``); the store is kept open,
    and which attempt wrote which position is remembered for ``REMEMBER_SECONDS`` (a rerun rewrites it)."""

    REMEMBER_SECONDS = 10.0
    REOPEN_SECONDS = 300.0  # credentials from a Secret are read again this often

    def __init__(self, credentials_from_secret: bool, keep: int = 4) -> None:
        self.credentials_from_secret, self.keep = credentials_from_secret, keep
        # (namespace, name, uid) -> (its store, the journal's run store, the attempts index, opened, indexed)
        self.open: OrderedDict[tuple[str, str, str], _Journal] = OrderedDict()
        self.lock = threading.Lock()

    def page(self, kube: Kubectl, body: dict[str, Any], offset: int, size: int) -> tuple[timeline.Timeline,
                                                                                           dict[str, Any]]:
        with self.lock:  # one page at a time: a page is a few milliseconds, and a store is not shared
            journal = self._journal(kube, body)
            if time.monotonic() - journal.indexed > self.REMEMBER_SECONDS:
                journal.attempts, journal.indexed = timeline.Attempts(journal.runs), time.monotonic()
            if not journal.checked:
                journal.store.check()
                journal.checked = True
            return timeline.page(journal.runs, journal.ref.key, offset, size, now=time.time(),
                                 attempts=journal.attempts, count_attempts=False,  # status.attempt counts them
                                 history=reruns.read_history(journal.runs))  # a rerun's attempt drawn as one

    def stream(self, kube: Kubectl, body: dict[str, Any], name: str | None, start: int,
               limit: int) -> dict[str, Any]:
        """The run's stream names, and with ``name`` up to ``limit`` of its chunks from offset ``start`` on, each
        with its standing now (the reader ``durablerun stream`` uses: a pending chunk may be superseded later,
        so the page asks again from its first pending one)."""
        with self.lock:
            journal = self._journal(kube, body)
            names = StreamObjects(journal.runs.backend, journal.runs.ref).names()
            if name is None:
                return {"streams": names}
            reader = journal.readers.get(name)
            if reader is None:  # kept with the open store: the journal is indexed once, then read on
                reader = journal.readers[name] = StreamReader(journal.runs, name, start=start)
            reader.seek(start)
            reads = list(itertools.islice(reader.read(), limit))
            more = len(reads) == limit
            return {"streams": names, "stream": name, "from": start, "more": more, "finished": reader.finished,
                    "next": reads[-1].chunk.offset + 1 if reads else start,
                    "chunks": [{"offset": r.chunk.offset, "text": r.chunk.text, "standing": r.standing.value,
                                "step": r.chunk.step, "pos": r.chunk.pos, "attempt": r.chunk.attempt,
                                "tries": r.chunk.tries, "at": r.chunk.at} for r in reads]}

    def logs(self, kube: Kubectl, body: dict[str, Any], attempt: int | None) -> dict[str, Any]:
        """The attempts whose stdout and stderr the run's store keeps, or with ``attempt`` the last
        ``LOG_TAIL_BYTES`` of that attempt's (what ``kubectl durablerun logs --attempt`` prints)."""
        with self.lock:
            journal = self._journal(kube, body)
            backend, ref = journal.runs.backend, journal.ref
            if attempt is None:
                return {"attempts": logs.archived_attempts(backend, ref)}
            data = logs.read_attempt(backend, ref, attempt)
            if data is None:  # only now list them, for the error
                kept = logs.archived_attempts(backend, ref)
                raise LookupError(f"attempt {attempt}: the store keeps no logs of it (kept: "
                                  f"{', '.join(map(str, kept)) or 'none'})")
        tail = data[-LOG_TAIL_BYTES:]
        return {"attempt": attempt, "bytes": len(data), "truncated": len(data) > len(tail),
                "text": tail.decode(errors="replace")}

    def _journal(self, kube: Kubectl, body: dict[str, Any]) -> _Journal:
        """The run's open store (opened again past ``REOPEN_SECONDS``); call with the lock held."""
        meta = body["metadata"]
        key = (meta["namespace"], meta["name"], meta["uid"])
        journal = self.open.pop(key, None)
        if journal is not None and time.monotonic() - journal.opened > self.REOPEN_SECONDS:
            journal.close()
            journal = None
        if journal is None:
            journal = _Journal(*kubeapi.open_journal(kube, body, credentials_from_secret=self.credentials_from_secret))
        self.open[key] = journal
        while len(self.open) > self.keep:
            self.open.popitem(last=False)[1].close()
        return journal

    def close(self) -> None:
        with self.lock:
            while self.open:
                self.open.popitem()[1].close()


class _Journal:
    def __init__(self, store: Store, ref: RunRef) -> None:
        self.store, self.ref = store, ref
        self.runs = store.run_store(ref)
        self.attempts = timeline.Attempts(self.runs)
        self.readers: dict[str, StreamReader] = {}  # the run's streams as the page last read them
        self.opened, self.indexed, self.checked = time.monotonic(), time.monotonic(), False

    def close(self) -> None:
        self.runs.close()
        self.store.close()


class Browser:
    """What the handlers share: the user's kubectl, the watch, the timelines, the token, the permissions."""

    def __init__(self, kube: Kubectl, watch: RunWatch, timelines: Timelines, trace_url: str = "") -> None:
        self.kube, self.watch, self.timelines = kube, watch, timelines
        self.trace_url = trace_url  # --trace-url: a link to the run's trace, {traceID} in it
        self.token = secrets.token_urlsafe(32)
        self.hosts: set[str] = set()
        self._can: dict[str, tuple[float, bool]] = {}
        self.events: dict[tuple[str, str], list[dict[str, Any]]] = {}  # each run's Events, as its page last read them
        self.feeds = threading.BoundedSemaphore(MAX_FEEDS)

    def can_change(self, namespace: str) -> bool:
        """Whether the user may patch runs in ``namespace``: a SelfSubjectAccessReview (`kubectl auth can-i`)."""
        cached = self._can.get(namespace)
        if cached and time.monotonic() - cached[0] < PERMISSION_TTL:
            return cached[1]
        answer = self.kube.in_namespace(namespace)("auth", "can-i", "patch", kubeapi.RESOURCE, check=False)
        allowed = answer.stdout.strip() == "yes"
        self._can[namespace] = (time.monotonic(), allowed)
        return allowed

    def run_page(self, namespace: str, name: str) -> dict[str, Any]:
        kube = self.kube.in_namespace(namespace)
        body = kube.run(name)
        events = kube.events(body)
        self.events[(namespace, name)] = events  # the timeline's restart causes, asked for right after
        position = kubeapi.queue_position(kube, body)  # while Queued: where Kueue has it (or why unknown)
        return {"run": body, "events": [{"type": e.get("type"), "reason": e.get("reason"), "message": e.get("message"),
                                         "count": e.get("count") or 1,
                                         "time": e.get("lastTimestamp") or e.get("eventTime")} for e in events],
                "children": self.watch.children(namespace, name), "canChange": self.can_change(namespace),
                "queue": position.describe() if position else summary(body)["queue"],
                "traceURL": self._trace_link(body)}

    def _trace_link(self, body: dict[str, Any]) -> str:
        """The run's trace under --trace-url; none without one, or for a traceID that is not 32 hex digits (the
        status is the runner's to write: it gets no say in where the link goes)."""
        trace_id = str((body.get("status") or {}).get("traceID") or "")
        if not self.trace_url or not TRACE_ID.fullmatch(trace_id):
            return ""
        return self.trace_url.replace("{traceID}", trace_id)

    def timeline_page(self, namespace: str, name: str, offset: int) -> dict[str, Any]:
        """The timeline entries journal positions ``offset`` to ``offset + TIMELINE_PAGE`` end; ``total`` counts
        the journal's records (the pages), ``attemptCount`` the run's attempts (its status's)."""
        kube = self.kube.in_namespace(namespace)
        kube_run = kube.run(name)
        built, whole = self.timelines.page(kube, kube_run, offset, TIMELINE_PAGE)
        events = self.events.get((namespace, name))
        timeline.restart_causes(built.entries, timeline.kubernetes_events(
            events if events is not None else kube.events(kube_run)))
        page = built.to_json()
        if whole["total"]:  # the bars place each entry within the whole run, not within its page
            page["start"], page["end"] = (api.format_time(whole[k], precise=True) for k in ("start", "end"))
        attempt_count = int((kube_run.get("status") or {}).get("attempt") or 0)
        return {**page, "total": whole["total"], "attemptCount": attempt_count, "offset": offset,
                "pageSize": TIMELINE_PAGE}

    def stream_page(self, namespace: str, name: str, stream: str | None, start: int) -> dict[str, Any]:
        """The run's output streams, and stream ``stream``'s chunks from offset ``start`` (``STREAM_PAGE`` at most),
        read from its store with the credentials the timeline uses."""
        if stream is not None and (problem := stream_name_error(stream)) is not None:
            raise ValueError(f"stream: {problem}")
        kube = self.kube.in_namespace(namespace)
        return self.timelines.stream(kube, kube.run(name), stream, start, STREAM_PAGE)

    def logs_page(self, namespace: str, name: str, attempt: int | None) -> dict[str, Any]:
        kube = self.kube.in_namespace(namespace)
        return self.timelines.logs(kube, kube.run(name), attempt)

    def act(self, namespace: str, name: str, action: str, form: dict[str, Any]) -> str:
        """One of the plugin's changes, as the user (their RBAC refuses what they may not do)."""
        kube = self.kube.in_namespace(namespace)
        if action == "event":
            event = str(form.get("event") or "")
            try:
                payload = json.loads(str(form.get("payload") or "{}"))
            except json.JSONDecodeError as e:
                raise ValueError(f"payload: not JSON ({e}); e.g. {{\"approved\": true}}") from None
            return kubeapi.send_event(kube, name, event, payload)
        if action in ("suspend", "resume"):
            return kubeapi.suspend(kube, name, action == "suspend")
        if action == "abort":
            return kubeapi.abort(kube, name, str(form.get("reason") or "requested in the run browser"))
        if action == "retry":
            return kubeapi.retry(kube, name)
        if action in ("rerun", "fork"):
            step = str(form.get("step") or "")
            if not step:
                raise ValueError("step: name the step to start from")
            secret = self.timelines.credentials_from_secret
            if action == "rerun":
                return kubeapi.rerun(kube, name, step, credentials_from_secret=secret)
            to = str(form.get("to") or "")
            if not to:
                raise ValueError("to: name the new DurableRun")
            return kubeapi.fork(kube, name, step, to, credentials_from_secret=secret)
        if action == "budget":  # the policy.askAt limit a waiting run reached, raised (or "none": lifted)
            flag = {resource.ASK_COST: "ask_at_usd", resource.ASK_TOKENS: "ask_at_tokens"}.get(str(form.get("budget")))
            if flag is None:
                raise ValueError(f"budget: {form.get('budget')!r} is not costUSD or tokens")
            return kubeapi.budget(kube, name, {flag: str(form.get("value") or "")})
        raise LookupError(action)


PATHS = [  # (method, pattern, handler name)
    ("GET", re.compile(r"/"), "index"),
    ("GET", re.compile(r"/runs/(?P<ns>[^/]+)/(?P<name>[^/]+)"), "run"),
    ("GET", re.compile(r"/static/(?P<file>[a-z.]+)"), "static"),
    ("GET", re.compile(r"/api/runs"), "api_runs"),
    ("GET", re.compile(r"/api/changes"), "api_changes"),
    ("GET", re.compile(r"/api/runs/(?P<ns>[^/]+)/(?P<name>[^/]+)"), "api_run"),
    ("GET", re.compile(r"/api/runs/(?P<ns>[^/]+)/(?P<name>[^/]+)/timeline"), "api_timeline"),
    ("GET", re.compile(r"/api/runs/(?P<ns>[^/]+)/(?P<name>[^/]+)/streams"), "api_streams"),
    ("GET", re.compile(r"/api/runs/(?P<ns>[^/]+)/(?P<name>[^/]+)/streams/(?P<stream>[^/]+)"), "api_stream"),
    ("GET", re.compile(r"/api/runs/(?P<ns>[^/]+)/(?P<name>[^/]+)/logs"), "api_logs"),
    ("POST", re.compile(r"/api/runs/(?P<ns>[^/]+)/(?P<name>[^/]+)/(?P<action>[a-z]+)"), "api_act"),
]


class Handler(BaseHTTPRequestHandler):
    browser: Browser  # set on the subclass serve() makes
    server_version = "durablerun-ui"

    def log_message(self, format: str, *args: Any) -> None:  # quiet: the terminal shows the URL, not every GET
        pass

    def do_GET(self) -> None:
        self._route("GET")

    def do_POST(self) -> None:
        self._route("POST")

    def _route(self, method: str) -> None:
        if self.headers.get("Host") not in self.browser.hosts:  # another site's name resolving to 127.0.0.1
            return self._send(HTTPStatus.MISDIRECTED_REQUEST, {"error": "this server answers to 127.0.0.1 only"})
        url = urlsplit(self.path)
        if url.path.startswith("/api/") and self.headers.get("Sec-Fetch-Site", "same-origin") not in ("same-origin",
                                                                                                     "none"):
            # Another site's page (another port of this machine included) gets no answer and no feed: a browser
            # says whose page asks (Fetch Metadata); a client without the header (curl) is the user's own.
            return self._send(HTTPStatus.FORBIDDEN, {"error": "only this server's own pages may call its API"})
        for verb, pattern, name in PATHS:
            match = pattern.fullmatch(url.path)
            if match and verb == method:
                try:
                    return getattr(self, name)(parse_qs(url.query), **match.groupdict())  # type: ignore[no-any-return]
                except ValueError as e:
                    return self._send(HTTPStatus.BAD_REQUEST, {"error": str(e)})
                except (PluginError, errors.StoreError, errors.ConfigError) as e:
                    status = HTTPStatus.FORBIDDEN if "Forbidden" in str(e) else HTTPStatus.CONFLICT
                    if "NotFound" in str(e):
                        status = HTTPStatus.NOT_FOUND
                    return self._send(status, {"error": str(e)})
        self._send(HTTPStatus.NOT_FOUND, {"error": f"no page {url.path}"})

    def _send(self, status: HTTPStatus, body: Any, content_type: str = "application/json") -> None:
        data = body if isinstance(body, bytes) else json.dumps(body).encode()
        self._head(status, content_type, len(data))
        self.wfile.write(data)

    def _head(self, status: HTTPStatus, content_type: str, length: int | None) -> None:
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        if length is not None:
            self.send_header("Content-Length", str(length))
        self.send_header("Cache-Control", "no-store")
        self.send_header("X-Frame-Options", "DENY")
        self.send_header("Content-Security-Policy", "default-src 'self'")
        self.end_headers()

    def _page(self, file: str) -> None:
        html = (ASSETS / file).read_text().replace("{{token}}", self.browser.token)
        self._send(HTTPStatus.OK, html.encode(), "text/html; charset=utf-8")

    def index(self, query: dict[str, list[str]]) -> None:
        self._page("index.html")

    def run(self, query: dict[str, list[str]], ns: str, name: str) -> None:
        self._page("run.html")

    def static(self, query: dict[str, list[str]], file: str) -> None:
        if file not in STATIC:
            return self._send(HTTPStatus.NOT_FOUND, {"error": f"no file {file}"})
        self._send(HTTPStatus.OK, (ASSETS / file).read_bytes(), STATIC[file])

    def api_runs(self, query: dict[str, list[str]]) -> None:
        filters, offset = Filters(query), _offset(query)
        version = self.browser.watch.version
        if (query.get("version") or [""])[0] == str(version):  # the poll's usual answer: nothing new
            return self._send(HTTPStatus.OK, {"version": version, "unchanged": True})
        self._send(HTTPStatus.OK, self.browser.watch.page(filters, offset))

    def api_changes(self, query: dict[str, list[str]]) -> None:
        """A change feed (Server-Sent Events): ``data: <version>`` when the list's runs changed, or with
        ``run=NAMESPACE/NAME`` when that run did, at once on connecting and then as the watch sees changes. The
        page then asks for what it shows; no page polls."""
        run = None
        if query.get("run"):
            namespace, _, name = query["run"][0].partition("/")
            if not namespace or not name:
                raise ValueError(f"run: {query['run'][0]!r} is not NAMESPACE/NAME")
            run = (namespace, name)
        if not self.browser.feeds.acquire(blocking=False):
            return self._send(HTTPStatus.SERVICE_UNAVAILABLE, {"error": f"{MAX_FEEDS} change feeds are open: close "
                                                                        "some of this browser's tabs"})
        watch, every = self.browser.watch, RUN_EVERY if run else LIST_EVERY
        try:
            self._head(HTTPStatus.OK, "text/event-stream", None)
            self.close_connection = True  # no length: the feed ends with the connection
            seen = -1
            while not watch.stopping.is_set():
                version = watch.wait_change(seen, run, KEEPALIVE_SECONDS)
                self.wfile.write(f"data: {version}\n\n".encode() if version != seen else b": keepalive\n\n")
                self.wfile.flush()
                if version != seen:
                    seen = version
                    watch.stopping.wait(every)  # what changes meanwhile goes in the next event
        except OSError:
            pass  # the page went away
        finally:
            self.browser.feeds.release()

    def api_run(self, query: dict[str, list[str]], ns: str, name: str) -> None:
        self._send(HTTPStatus.OK, self.browser.run_page(ns, name))

    def api_timeline(self, query: dict[str, list[str]], ns: str, name: str) -> None:
        self._send(HTTPStatus.OK, self.browser.timeline_page(ns, name, _offset(query)))

    def api_streams(self, query: dict[str, list[str]], ns: str, name: str) -> None:
        self._send(HTTPStatus.OK, self.browser.stream_page(ns, name, None, 0))

    def api_stream(self, query: dict[str, list[str]], ns: str, name: str, stream: str) -> None:
        self._send(HTTPStatus.OK, self.browser.stream_page(ns, name, stream, _offset(query, "from")))

    def api_logs(self, query: dict[str, list[str]], ns: str, name: str) -> None:
        attempt = _offset(query, "attempt") if query.get("attempt") else None
        try:
            self._send(HTTPStatus.OK, self.browser.logs_page(ns, name, attempt))
        except LookupError as e:
            self._send(HTTPStatus.NOT_FOUND, {"error": str(e)})

    def api_act(self, query: dict[str, list[str]], ns: str, name: str, action: str) -> None:
        # Only this server's pages know the token: another site can make the browser POST here, not read it.
        if not secrets.compare_digest(self.headers.get(TOKEN_HEADER) or "", self.browser.token):
            return self._send(HTTPStatus.FORBIDDEN, {"error": f"missing or wrong {TOKEN_HEADER}: reload the page"})
        length = int(self.headers.get("Content-Length") or 0)
        if length > 256 * 1024:
            return self._send(HTTPStatus.REQUEST_ENTITY_TOO_LARGE, {"error": "the form is larger than 256 KiB"})
        try:
            form = json.loads(self.rfile.read(length) or b"{}")
        except json.JSONDecodeError:
            return self._send(HTTPStatus.BAD_REQUEST, {"error": "the request body is not JSON"})
        try:
            message = self.browser.act(ns, name, action, form if isinstance(form, dict) else {})
        except LookupError:
            return self._send(HTTPStatus.NOT_FOUND, {"error": f"no action {action!r}: event, suspend, resume, "
                                                              "abort, retry, budget, rerun or fork"})
        self._send(HTTPStatus.OK, {"message": message})


def _offset(query: dict[str, list[str]], field: str = "offset") -> int:
    text = (query.get(field) or ["0"])[0]
    if not text.isdigit():
        raise ValueError(f"{field}: {text!r} is not a whole number")
    return int(text)


def _interrupt(signum: int, frame: object) -> None:
    raise KeyboardInterrupt  # SIGTERM stops the server as Ctrl-C does: the watch's kubectl ends with it


def serve(kube: Kubectl, args: argparse.Namespace) -> int:
    """``kubectl durablerun ui``: serve until interrupted."""
    all_namespaces = bool(args.all_namespaces)
    watch = RunWatch(kube, all_namespaces).start()
    browser = Browser(kube, watch, Timelines(args.credentials_from_secret), args.trace_url or "")
    handler = type("BoundHandler", (Handler,), {"browser": browser})
    server = ThreadingHTTPServer(("127.0.0.1", args.port), handler)  # loopback only, as kubectl proxy
    port = server.server_address[1]
    browser.hosts = {f"127.0.0.1:{port}", f"localhost:{port}"}
    print(f"Serving the run browser on http://127.0.0.1:{port}/ as your kubeconfig's user (Ctrl-C to stop)",
          flush=True)
    signal.signal(signal.SIGTERM, _interrupt)
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass
    finally:
        server.server_close()
        watch.stop()
        browser.timelines.close()
    return 0

