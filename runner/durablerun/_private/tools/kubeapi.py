"""The user's own kubectl, the changes a user makes to a DurableRun, and where a queued run is in its Kueue
queue: one definition each.

``kubectl durablerun`` (``durablerun._private.tools.kubectl``) prints what the changes return; the run browser
(``durablerun._private.tools.browser``) shows it. Every call is the real ``kubectl`` with the user's kubeconfig,
context and namespace, so the user's RBAC decides what they may do.
"""

from __future__ import annotations

import argparse
import base64
import json
import os
import subprocess
from dataclasses import dataclass
from decimal import Decimal
from typing import Any

from durablerun import api, resource
from durablerun._private.records import layout
from durablerun._private.storage.stores import Store, store_from_checkpoint
from durablerun._private.tools import reruns

RESOURCE = api.CRD_NAME  # as kubectl names the resource
KIND_REF = f"{api.SINGULAR}.{api.GROUP}"  # as kubectl names objects: durablerun.durablerun.dev/NAME
# Kueue's on-demand visibility API (an aggregated API its manager serves): a LocalQueue's pending Workloads, in
# the order Kueue will consider them, up to LIMIT a request.
VISIBILITY_API = "/apis/visibility.kueue.x-k8s.io/v1beta2"
VISIBILITY_LIMIT = 1000


class PluginError(Exception):
    """Exits 1 with the message (a refused patch, a missing run, ...)."""


class Kubectl:
    """The real kubectl, with the user's namespace/context/kubeconfig flags on every call."""

    def __init__(self, args: argparse.Namespace) -> None:
        self.binary = os.environ.get("KUBECTL") or "kubectl"
        self.args = args
        self.flags = [f"--{flag}={value}" for flag, value in
                      (("namespace", args.namespace), ("context", args.context), ("kubeconfig", args.kubeconfig))
                      if value]

    def namespace(self) -> str:
        """The namespace the user acts in: ``-n``, else their context's, else ``default``."""
        if self.args.namespace:
            return str(self.args.namespace)
        found = self("config", "view", "--minify", "-o", "jsonpath={..namespace}", check=False).stdout.strip()
        return found or "default"

    def in_namespace(self, namespace: str) -> Kubectl:
        """The same identity (context, kubeconfig) acting in ``namespace``."""
        return Kubectl(argparse.Namespace(**{**vars(self.args), "namespace": namespace}))

    def __call__(self, *argv: str, input: str | None = None, check: bool = True) -> subprocess.CompletedProcess[str]:
        result = subprocess.run([self.binary, *self.flags, *argv], input=input, capture_output=True, text=True,
                                check=False)
        if check and result.returncode != 0:
            raise PluginError(result.stderr.strip() or f"kubectl {' '.join(argv)} failed ({result.returncode})")
        return result

    def json(self, *argv: str) -> Any:
        return json.loads(self(*argv, "-o", "json").stdout)

    def run(self, name: str) -> dict[str, Any]:
        body: dict[str, Any] = self.json("get", RESOURCE, name)
        return body

    def events(self, run: dict[str, Any]) -> list[dict[str, Any]]:
        """The Kubernetes Events about ``run`` (this run: an earlier one of the same name, deleted, has another
        uid), oldest first (the run page's table, the timeline's restart causes). Reading Events is not
        everyone's right: none when refused."""
        meta = run["metadata"]
        about = f"involvedObject.name={meta['name']},involvedObject.kind={api.KIND},involvedObject.uid={meta['uid']}"
        result = self("get", "events", "--field-selector", about, "-o", "json", check=False)
        if result.returncode != 0:
            return []
        items: list[dict[str, Any]] = json.loads(result.stdout).get("items") or []
        return sorted(items, key=lambda e: e.get("lastTimestamp") or e.get("eventTime") or "")

    def merge_patch(self, name: str, patch: dict[str, Any]) -> None:
        self("patch", RESOURCE, name, "--type=merge", "-p", json.dumps(patch))

    def annotate(self, name: str, key: str, value: str, *, remove: tuple[str, ...] = ()) -> None:
        """Set ``key`` and remove the ``remove`` annotations, in one change."""
        self("annotate", RESOURCE, name, f"{key}={value}", *(f"{r}-" for r in remove), "--overwrite")


@dataclass(frozen=True)
class QueuePosition:
    """Where a Queued run waits, as Kueue reports it: how many pending Workloads are ahead of the run's in its
    LocalQueue and in that queue's ClusterQueue (Kueue's positionInLocalQueue / positionInClusterQueue: 0 is
    next), or, when Kueue reports none, why."""

    queue: str
    local: int | None = None
    cluster: int | None = None
    unknown: str = ""

    def describe(self) -> str:
        if self.local is None or self.cluster is None:
            return f"{self.queue}, position unknown: {self.unknown}"
        return (f"{self.queue}, position {self.local} in the LocalQueue and {self.cluster} in its ClusterQueue "
                "(the pending Workloads ahead of this run's)")


def queue_position(kube: Kubectl, body: dict[str, Any]) -> QueuePosition | None:
    """The position of run ``body`` in its Kueue queue while it is Queued (None otherwise), from Kueue's
    visibility API. It reads as the user: with no such API (or no right to read it) the position is unknown, and
    the answer says why; that is never an error."""
    meta = body["metadata"]
    queue = (meta.get("labels") or {}).get(api.LABEL_QUEUE_NAME)
    if not queue or (body.get("status") or {}).get("phase") != api.Phase.QUEUED:
        return None
    offset = 0
    while True:
        path = (f"{VISIBILITY_API}/namespaces/{meta['namespace']}/localqueues/{queue}/pendingworkloads"
                f"?limit={VISIBILITY_LIMIT}&offset={offset}")
        answer = kube("get", "--raw", path, check=False)
        if answer.returncode != 0:
            why = answer.stderr.strip() or f"kubectl exited {answer.returncode}"
            return QueuePosition(queue, unknown=f"Kueue's visibility API did not answer: {why}")
        items: list[dict[str, Any]] = json.loads(answer.stdout).get("items") or []
        for item in items:  # the run's Workload is the one it owns (its name is Kueue's hash of the run's)
            if any(ref.get("uid") == meta["uid"] for ref in item["metadata"].get("ownerReferences") or []):
                return QueuePosition(queue, local=item["positionInLocalQueue"],
                                     cluster=item["positionInClusterQueue"])
        if len(items) < VISIBILITY_LIMIT:
            return QueuePosition(queue, unknown="Kueue lists no pending Workload of this run (being admitted, "
                                                "or not queued in Kueue yet: see its message)")
        offset += VISIBILITY_LIMIT


# The changes a user makes to a run, one definition each: the commands below print what they return, and the
# run browser (`kubectl durablerun ui`) shows it.

def send_event(kube: Kubectl, run: str, event: str, payload: Any) -> str:
    """Merge patch spec.events.<event>; a sent event is never changed (the run may already have read it)."""
    api.check_event_name(event)
    sent = (kube.run(run).get("spec") or {}).get("events") or {}
    if event in sent:
        if sent[event] == payload:
            return f"event {event!r} was already sent to {run} with this payload"
        raise PluginError(f"event {event!r} was already sent to {run} with another payload "
                          f"({json.dumps(sent[event])}): events are write-once; send a new event instead")
    kube.merge_patch(run, {"spec": {"events": {event: payload}}})
    return f"{KIND_REF}/{run} event {event!r} sent"


def suspend(kube: Kubectl, run: str, on: bool) -> str:
    kube.merge_patch(run, {"spec": {"suspend": on}})
    return f"{KIND_REF}/{run} {'suspended' if on else 'resumed'}"


#: The budgets `kubectl durablerun budget` (and the run browser) set: flag -> (its policy field's path, kind).
BUDGET_FLAGS = {"ask_at_usd": (("askAt", "costUSD"), "usd"), "ask_at_tokens": (("askAt", "tokens"), "count"),
                "max_cost": (("costCeilingUSD",), "usd"), "max_tokens": (("maxTokens",), "count")}


def budget(kube: Kubectl, run: str, values: dict[str, str]) -> str:
    """Set the run's budgets (values by BUDGET_FLAGS key; "none" removes one) with one merge patch of
    spec.policy; a run waiting on its budget goes on once the limit it reached is past its cost."""
    policy: dict[str, Any] = {}
    said = []
    for key, text in values.items():
        path, kind = BUDGET_FLAGS[key]
        flag = "--" + key.replace("_", "-")
        value: Any = None
        if text != "none":
            try:
                number = Decimal(text) if kind == "usd" else int(text)
            except (ValueError, ArithmeticError):
                number = -1
            if not (number >= 0 and Decimal(number).is_finite()):
                example = "an amount in USD such as 5.00" if kind == "usd" else "a whole number such as 200000"
                raise PluginError(f"{flag} {text!r}: give {example}, or none to remove it")
            value = str(number) if kind == "usd" else number
        node = policy
        for part in path[:-1]:
            node = node.setdefault(part, {})
        node[path[-1]] = value
        said.append(f"policy.{'.'.join(path)}={'none' if value is None else value}")
    if not policy:
        raise PluginError("give at least one of --ask-at-usd, --ask-at-tokens, --max-cost, --max-tokens")
    kube.merge_patch(run, {"spec": {"policy": policy}})
    return f"{KIND_REF}/{run} budget set: {', '.join(said)}"


def abort(kube: Kubectl, run: str, reason: str) -> str:
    kube.annotate(run, api.ANNOTATION_ABORT, reason)
    return (f"{KIND_REF}/{run} abort requested: {reason} (a running attempt gets "
            "spec.policy.abortGracePeriod to stop and undo its work)")


def retry(kube: Kubectl, run: str) -> str:
    # A new value each time: the operator acts once per value. A user abort stands until it is lifted (the
    # operator refuses a retry while it is set), so asking for a retry lifts it in the same change.
    value = api.format_time(api.now(), precise=True)
    kube.annotate(run, api.ANNOTATION_RETRY, value, remove=(api.ANNOTATION_ABORT,))
    return f"{KIND_REF}/{run} retry requested ({api.ANNOTATION_RETRY}={value})"


def _origin(kube: Kubectl) -> reruns.Origin:
    context = kube("config", "current-context", check=False).stdout.strip() or "?"
    return reruns.Origin(who=os.environ.get("USER") or "?", via=f"kubectl durablerun (context {context})")


def rerun(kube: Kubectl, run: str, step: str, *, credentials_from_secret: bool) -> str:
    """Cut the finished run's journal back to ``step`` (reruns.rerun), then ask the operator for a new attempt."""
    body = kube.run(run)
    phase = (body.get("status") or {}).get("phase")
    if phase not in (api.Phase.FAILED, api.Phase.ABORTED, api.Phase.SUCCEEDED):
        raise PluginError(f"{run} is {phase or 'not started'}: rerun is for a finished run (Failed, Aborted or "
                          f"Succeeded); stop it first (kubectl durablerun abort {run}); nothing was changed")
    store, ref = open_journal(kube, body, credentials_from_secret=credentials_from_secret)
    try:
        cut = reruns.rerun(store, ref, step, _origin(kube))
    finally:
        store.close()
    kube.annotate(run, api.ANNOTATION_RETRY, api.format_time(api.now(), precise=True), remove=(api.ANNOTATION_ABORT,))
    return (f"{KIND_REF}/{run} rerun from step {step!r} (position {cut.position}): dropped {cut.dropped} journal "
            f"records, kept {cut.kept} (archived under {cut.archive}); a new attempt starts")


def fork(kube: Kubectl, run: str, step: str, to: str, *, credentials_from_secret: bool) -> str:
    """A new DurableRun ``to``: the run's spec (no events), created suspended; its journal copied up to ``step``;
    resumed."""
    body = kube.run(run)
    phase = (body.get("status") or {}).get("phase")
    if phase in (api.Phase.PENDING, api.Phase.RUNNING):
        raise PluginError(f"{run} is {phase}: an attempt holds its journal; fork it once it waits, is suspended "
                          "or has finished; nothing was changed")
    if kube("get", RESOURCE, to, "--ignore-not-found", "-o", "name").stdout.strip():
        raise PluginError(f"--to {to!r}: a DurableRun by that name exists; pick another name; nothing was changed")
    store, ref = open_journal(kube, body, credentials_from_secret=credentials_from_secret)
    try:
        records = store.run_store(ref).read_all()
        reruns.first_record_of(records, step, ref)  # refused before anything is created
        spec = {k: v for k, v in body["spec"].items() if k not in ("events", "suspend")}
        spec["checkpoint"] = {k: v for k, v in spec["checkpoint"].items() if k != "runId"}  # its own journal
        manifest = {"apiVersion": body["apiVersion"], "kind": body["kind"],
                    "metadata": {"name": to, "labels": body["metadata"].get("labels") or {}},
                    "spec": {**spec, "suspend": True}}
        created = json.loads(kube("create", "-f", "-", "-o", "json", input=json.dumps(manifest)).stdout)
        new = layout.RunRef.kubernetes(created["metadata"]["namespace"], to, created["metadata"]["uid"])
        try:
            cut = reruns.fork(store, ref, step, new, _origin(kube))
        except BaseException:
            kube("delete", RESOURCE, to, "--wait=false", check=False)  # nothing half-made is left
            raise
    finally:
        store.close()
    kube.merge_patch(to, {"spec": {"suspend": False}})
    return (f"{KIND_REF}/{to} forked from {run} before step {step!r} (position {cut.position}): its journal copies "
            f"{cut.kept} records; it executes that step on")


def open_journal(kube: Kubectl, body: dict[str, Any], *, credentials_from_secret: bool) -> tuple[Store, layout.RunRef]:
    """The store of run ``body`` and its journal's ref; the caller closes the store. S3 credentials come from the
    environment, or with ``credentials_from_secret`` from the run's spec.checkpoint.credentialsSecret."""
    spec = resource.DurableRunSpec.model_validate(body["spec"])
    meta = body["metadata"]
    found: dict[str, str] = {}
    if credentials_from_secret:
        if not spec.checkpoint.credentialsSecret:
            raise PluginError(f"{meta['name']} names no spec.checkpoint.credentialsSecret: drop "
                              "--credentials-from-secret and export AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY")
        data = kube.json("get", "secret", spec.checkpoint.credentialsSecret).get("data") or {}
        # Every key the run's own pods get from it, the endpoint of an S3-compatible server included.
        found = {k: base64.b64decode(data[k]).decode()
                 for k in (*api.STORE_SECRET_KEYS, *api.STORE_SECRET_OPTIONAL_KEYS) if k in data}
    store = store_from_checkpoint(
        spec.checkpoint, access_key=found.get("AWS_ACCESS_KEY_ID"), secret_key=found.get("AWS_SECRET_ACCESS_KEY"),
        session_token=found.get("AWS_SESSION_TOKEN"), endpoint_url=found.get("AWS_ENDPOINT_URL_S3"))
    return store, layout.RunRef.durable_run(meta["namespace"], meta["name"], meta["uid"], spec.checkpoint.runId)
