"""The one module of the operator that talks to the Kubernetes API.

Synchronous calls of the official client, run in worker threads by the
reconciler. Every write that must not race is a JSON patch with ``test`` ops:
a refused test means someone else changed the object first, reported as
``Conflict`` so the caller decides again on fresh facts.
"""

from __future__ import annotations

import base64
import json
import logging
from typing import Any

from kubernetes import client, config
from kubernetes.client.rest import ApiException
from urllib3.exceptions import HTTPError

from durablerun import api, schedules
from durablerun_operator import kueue

log = logging.getLogger("durablerun.operator.kube")

JSON_PATCH = "application/json-patch+json"
#: Objects a LIST returns at most per page (kopf's watch and the resync): client-go's reflectors' page size.
LIST_PAGE = 500


class Conflict(Exception):
    """A guarded write was refused: the object changed since it was read."""


def load_config(connections: int = 16) -> None:
    try:
        config.load_incluster_config()
    except config.ConfigException:
        config.load_kube_config()
    # One connection per reconcile worker at least (the default is cpu_count * 5: 5 in a one-CPU pod).
    settings = client.Configuration.get_default_copy()
    settings.connection_pool_maxsize = connections
    client.Configuration.set_default(settings)


# Over 300 lines: one short method per API call the operator and the ingress make, in the one module that
# talks to the API server; split, the guarded-write and retry conventions would be spelled in two places.
class Kube:
    def __init__(self, api_client: Any | None = None) -> None:
        self.client = api_client or client.ApiClient()
        self.custom = client.CustomObjectsApi(self.client)
        self.core = client.CoreV1Api(self.client)
        self.rbac = client.RbacAuthorizationV1Api(self.client)
        self.coordination = client.CoordinationV1Api(self.client)

    # --- DurableRuns ---------------------------------------------------------------

    def get_run(self, namespace: str, name: str) -> dict[str, Any] | None:
        try:
            return dict(self.custom.get_namespaced_custom_object(api.GROUP, api.VERSION, namespace, api.PLURAL, name))
        except ApiException as error:
            if error.status == 404:
                return None
            raise

    def list_runs_page(self, namespace: str | None, token: str | None) -> tuple[list[dict[str, Any]], str | None]:
        """One page of the runs of ``namespace`` (None: every namespace) and the token of the next (None: the
        last). Paged as client-go's reflectors list: one LIST of 100,000 runs is gigabytes parsed at once."""
        kwargs: dict[str, Any] = {"limit": LIST_PAGE, **({"_continue": token} if token else {})}
        reply = (self.custom.list_cluster_custom_object(api.GROUP, api.VERSION, api.PLURAL, **kwargs)
                 if namespace is None else
                 self.custom.list_namespaced_custom_object(api.GROUP, api.VERSION, namespace, api.PLURAL, **kwargs))
        return list(reply["items"]), (reply.get("metadata") or {}).get("continue") or None

    def list_children(self, namespace: str, parent: str) -> list[dict[str, Any]]:
        reply = self.custom.list_namespaced_custom_object(api.GROUP, api.VERSION, namespace, api.PLURAL,
                                                          label_selector=f"{api.LABEL_PARENT}={parent}")
        return list(reply["items"])

    def create_run(self, run: dict[str, Any]) -> dict[str, Any] | None:
        """Create a DurableRun (a child, a schedule's): the run as the API server made it; None if one of that
        name exists."""
        try:
            return dict(self.custom.create_namespaced_custom_object(
                api.GROUP, api.VERSION, run["metadata"]["namespace"], api.PLURAL, run))
        except ApiException as error:
            if error.status == 409:
                return None
            raise

    def merge_patch_run(self, namespace: str, name: str, patch: dict[str, Any]) -> dict[str, Any] | None:
        """A merge patch of a DurableRun's spec or metadata; the run as written, None if it is gone."""
        try:
            return dict(self.custom.patch_namespaced_custom_object(
                api.GROUP, api.VERSION, namespace, api.PLURAL, name, patch,
                _content_type="application/merge-patch+json"))
        except ApiException as error:
            if error.status == 404:
                return None
            if error.status in (400, 409, 422):  # e.g. an event set meanwhile: decide again on fresh facts
                raise Conflict(f"{namespace}/{name} refused the change: {error.reason}: {_message(error)}") from None
            raise

    def patch_status(self, namespace: str, name: str, ops: list[dict[str, Any]]) -> dict[str, Any]:
        """Apply a guarded JSON patch to the status subresource; Conflict if a test op fails."""
        try:
            return dict(self.custom.patch_namespaced_custom_object_status(
                api.GROUP, api.VERSION, namespace, api.PLURAL, name, ops, _content_type=JSON_PATCH))
        except ApiException as error:
            if error.status in (409, 422):
                raise Conflict(f"status of {namespace}/{name} changed: {error.reason}") from None
            raise

    def set_run_finalizer(self, run: dict[str, Any], present: bool) -> dict[str, Any] | None:
        """Add or remove the operator's finalizer; the run as written (None if it is gone)."""
        meta = run["metadata"]
        finalizers = list(meta.get("finalizers") or [])
        if present == (api.RUN_FINALIZER in finalizers):
            return run
        updated = [*finalizers, api.RUN_FINALIZER] if present else [f for f in finalizers if f != api.RUN_FINALIZER]
        ops: list[dict[str, Any]] = [{"op": "test", "path": "/metadata/resourceVersion",
                                      "value": meta["resourceVersion"]},
                                     {"op": "add", "path": "/metadata/finalizers", "value": updated}]
        try:
            return dict(self.custom.patch_namespaced_custom_object(
                api.GROUP, api.VERSION, meta["namespace"], api.PLURAL, meta["name"], ops, _content_type=JSON_PATCH))
        except ApiException as error:
            if error.status in (409, 422):
                raise Conflict(f"{meta['namespace']}/{meta['name']} changed") from None
            if error.status != 404:
                raise
            return None

    def delete_run(self, namespace: str, name: str, uid: str) -> None:
        try:
            self.custom.delete_namespaced_custom_object(
                api.GROUP, api.VERSION, namespace, api.PLURAL, name,
                body=client.V1DeleteOptions(preconditions=client.V1Preconditions(uid=uid)))
        except ApiException as error:
            if error.status not in (404, 409):
                raise

    # --- pods ----------------------------------------------------------------------

    def list_pods(self, namespace: str, run_name: str) -> list[dict[str, Any]]:
        reply = self.core.list_namespaced_pod(namespace, label_selector=f"{api.LABEL_RUN}={run_name}")
        return [self.client.sanitize_for_serialization(p) for p in reply.items]

    def create_pod(self, pod: dict[str, Any]) -> dict[str, Any] | None:
        """Create the pod: as the API server made it, or None if it already exists (a repeated create of one
        attempt)."""
        try:
            made = self.core.create_namespaced_pod(pod["metadata"]["namespace"], pod)
        except ApiException as error:
            if error.status == 409:
                return None
            raise
        return dict(self.client.sanitize_for_serialization(made))

    @staticmethod
    def create_error(error: Exception) -> tuple[str, bool]:
        """What went wrong creating a pod, for humans, and whether it is permanent (trying again cannot help).

        Permanent: the API server refused the pod as malformed (400), invalid (422) or forbidden (403, e.g.
        by Pod Security admission; but not an exceeded quota, which frees up), or the client could not build
        the request from the template (ValueError, TypeError, ...). Anything else may pass: throttling, a
        server error, the API server unreachable.
        """
        if isinstance(error, ApiException):
            try:
                detail = str(json.loads(error.body)["message"])
            except (TypeError, ValueError, KeyError):
                detail = f"{error.status} {error.reason}"
            quota = error.status == 403 and "exceeded quota" in detail
            return detail, error.status in (400, 403, 422) and not quota
        if isinstance(error, OSError | HTTPError):
            return f"{type(error).__name__}: {error}", False
        return f"{type(error).__name__}: {error}", True

    def delete_pod(self, namespace: str, name: str) -> None:
        """Mark the pod as deleted by the operator (so it is not read as a disruption), then delete it, with its
        own grace period (which holds policy.stopGracePeriod: builders.runner_pod)."""
        patch = {"metadata": {"annotations": {api.ANNOTATION_DELETED_BY_OPERATOR: _now()}}}
        try:
            self.core.patch_namespaced_pod(name, namespace, patch)
            self.core.delete_namespaced_pod(name, namespace)
        except ApiException as error:
            if error.status != 404:
                raise

    def release_pod(self, namespace: str, name: str) -> None:
        """Remove the operator's finalizer once the pod's ending is recorded."""
        try:
            pod = self.core.read_namespaced_pod(name, namespace)
        except ApiException as error:
            if error.status == 404:
                return
            raise
        finalizers = list(pod.metadata.finalizers or [])
        if api.POD_FINALIZER not in finalizers:
            return
        index = finalizers.index(api.POD_FINALIZER)
        ops = [{"op": "test", "path": f"/metadata/finalizers/{index}", "value": api.POD_FINALIZER},
               {"op": "remove", "path": f"/metadata/finalizers/{index}"}]
        try:
            self.core.patch_namespaced_pod(name, namespace, ops, _content_type=JSON_PATCH)
        except ApiException as error:
            if error.status in (409, 422):
                raise Conflict(f"pod {namespace}/{name} changed") from None
            if error.status != 404:
                raise

    # --- Kueue (only with the integration on: settings.kueue) ----------------------------

    def get_workload(self, namespace: str, name: str) -> dict[str, Any] | None:
        try:
            return dict(self.custom.get_namespaced_custom_object(
                kueue.GROUP, kueue.VERSION, namespace, kueue.WORKLOADS, name))
        except ApiException as error:
            if error.status == 404:
                return None
            raise

    def create_workload(self, workload: dict[str, Any]) -> None:
        """Create a run's Workload; one of that name already there (a repeated create) is left as it is."""
        try:
            self.custom.create_namespaced_custom_object(
                kueue.GROUP, kueue.VERSION, workload["metadata"]["namespace"], kueue.WORKLOADS, workload)
        except ApiException as error:
            if error.status != 409:
                raise

    def delete_workload(self, namespace: str, name: str) -> None:
        """Delete a Workload: Kueue gives its quota back at once."""
        try:
            self.custom.delete_namespaced_custom_object(kueue.GROUP, kueue.VERSION, namespace, kueue.WORKLOADS, name)
        except ApiException as error:
            if error.status != 404:
                raise

    def get_cluster_object(self, plural: str, name: str) -> dict[str, Any] | None:
        """A cluster-scoped Kueue object (a ResourceFlavor, a WorkloadPriorityClass); None if there is none."""
        try:
            return dict(self.custom.get_cluster_custom_object(kueue.GROUP, kueue.VERSION, plural, name))
        except ApiException as error:
            if error.status == 404:
                return None
            raise

    # --- ModelQuotas -----------------------------------------------------------------

    def patch_quota_status(self, name: str, status: dict[str, Any]) -> None:
        """A merge patch of a ModelQuota's status (nothing if the quota is gone)."""
        try:
            self.custom.patch_cluster_custom_object_status(
                api.GROUP, api.VERSION, api.QUOTA_PLURAL, name, {"status": status},
                _content_type="application/merge-patch+json")
        except ApiException as error:
            if error.status != 404:
                raise

    # --- DurableRunSchedules ---------------------------------------------------------

    def list_scheduled_runs(self, namespace: str, schedule: str) -> list[dict[str, Any]]:
        """The runs labelled as ``schedule``'s (the caller keeps those it owns)."""
        reply = self.custom.list_namespaced_custom_object(api.GROUP, api.VERSION, namespace, api.PLURAL,
                                                          label_selector=schedules.run_selector(schedule))
        return list(reply["items"])

    def patch_schedule_status(self, namespace: str, name: str, status: dict[str, Any]) -> dict[str, Any] | None:
        """A merge patch of a DurableRunSchedule's status: the schedule as written (None if it is gone)."""
        try:
            return dict(self.custom.patch_namespaced_custom_object_status(
                api.GROUP, api.VERSION, namespace, api.SCHEDULE_PLURAL, name, {"status": status},
                _content_type="application/merge-patch+json"))
        except ApiException as error:
            if error.status != 404:
                raise
            return None

    # --- per-run RBAC --------------------------------------------------------------

    def ensure(self, obj: dict[str, Any]) -> None:
        """Create a ServiceAccount, Role or RoleBinding unless it exists."""
        namespace, kind = obj["metadata"]["namespace"], obj["kind"]
        create = {
            "ServiceAccount": self.core.create_namespaced_service_account,
            "Role": self.rbac.create_namespaced_role,
            "RoleBinding": self.rbac.create_namespaced_role_binding,
        }[kind]
        try:
            create(namespace, obj)
        except ApiException as error:
            if error.status != 409:
                raise

    # --- Secrets (the webhook ingress's keys and sources only) -------------------------

    def get_secret_data(self, namespace: str, name: str) -> dict[str, bytes] | None:
        """A Secret's entries, decoded; None if it does not exist or may not be read."""
        try:
            secret = self.core.read_namespaced_secret(name, namespace)
        except ApiException as error:
            if error.status in (403, 404):
                return None
            raise
        return {key: base64.b64decode(value) for key, value in (secret.data or {}).items()}

    def review_token(self, token: str, audience: str) -> tuple[str, dict[str, list[str]]] | None:
        """Who a ServiceAccount token (for ``audience``) authenticates: (username, extra), or None if it does not."""
        review = client.V1TokenReview(spec=client.V1TokenReviewSpec(token=token, audiences=[audience]))
        status = client.AuthenticationV1Api(self.client).create_token_review(review).status
        if status is None or not status.authenticated or status.user is None:
            return None
        if audience not in (status.audiences or []):
            return None
        return str(status.user.username or ""), {k: list(v) for k, v in (status.user.extra or {}).items()}

    # --- shard Leases (shards.py) ------------------------------------------------------

    def list_leases(self, namespace: str) -> list[dict[str, Any]]:
        reply = self.coordination.list_namespaced_lease(namespace)
        return [self.client.sanitize_for_serialization(lease) for lease in reply.items]

    def get_lease(self, namespace: str, name: str) -> dict[str, Any] | None:
        try:
            lease = self.coordination.read_namespaced_lease(name, namespace)
            return dict(self.client.sanitize_for_serialization(lease))
        except ApiException as error:
            if error.status == 404:
                return None
            raise

    def write_lease(self, namespace: str, name: str, read: dict[str, Any] | None, holder: str,
                    duration: float) -> None:
        """Hold (or, with holder "", release) the Lease ``name`` as last ``read`` (None: it did not exist);
        Conflict if it changed since: the resourceVersion guards the write, as client-go's leader election."""
        now = api.format_time(api.now(), precise=True)
        spec: dict[str, Any] = dict((read or {}).get("spec") or {})
        if spec.get("holderIdentity") != holder:
            spec["acquireTime"] = now
            spec["leaseTransitions"] = int(spec.get("leaseTransitions") or 0) + (1 if read else 0)
        spec.update(holderIdentity=holder or None, leaseDurationSeconds=max(1, round(duration)), renewTime=now)
        try:
            if read is None:
                self.coordination.create_namespaced_lease(namespace, {
                    "apiVersion": "coordination.k8s.io/v1", "kind": "Lease",
                    "metadata": {"name": name, "namespace": namespace}, "spec": spec})
            else:
                meta = {"name": name, "namespace": namespace,
                        "resourceVersion": read["metadata"]["resourceVersion"]}
                self.coordination.replace_namespaced_lease(name, namespace, {
                    "apiVersion": "coordination.k8s.io/v1", "kind": "Lease", "metadata": meta, "spec": spec})
        except ApiException as error:
            if error.status in (404, 409):
                raise Conflict(f"lease {namespace}/{name} changed") from None
            raise

    def delete_lease(self, namespace: str, name: str, resource_version: str) -> None:
        """Delete the Lease if it is still at ``resource_version``."""
        try:
            self.coordination.delete_namespaced_lease(name, namespace, body=client.V1DeleteOptions(
                preconditions=client.V1Preconditions(resource_version=resource_version)))
        except ApiException as error:
            if error.status not in (404, 409):
                raise

    # --- Events --------------------------------------------------------------------

    def post_event(self, run: dict[str, Any], kind: str, reason: str, message: str) -> None:
        meta = run["metadata"]
        self._post_event(meta["namespace"], {
            "apiVersion": api.API_VERSION, "kind": api.KIND, "name": meta["name"], "namespace": meta["namespace"],
            "uid": meta["uid"], "resourceVersion": meta.get("resourceVersion")}, kind, reason, message)

    def post_schedule_event(self, schedule: dict[str, Any], kind: str, reason: str, message: str) -> None:
        meta = schedule["metadata"]
        self._post_event(meta["namespace"], {
            "apiVersion": api.API_VERSION, "kind": api.SCHEDULE_KIND, "name": meta["name"],
            "namespace": meta["namespace"], "uid": meta["uid"]}, kind, reason, message)

    def post_quota_event(self, name: str, uid: str, kind: str, reason: str, message: str) -> None:
        """An Event on a ModelQuota (cluster-scoped: in the default namespace, where `kubectl describe` looks)."""
        self._post_event("default", {"apiVersion": api.API_VERSION, "kind": api.QUOTA_KIND, "name": name, "uid": uid},
                         kind, reason, message)

    def _post_event(self, namespace: str, involved: dict[str, Any], kind: str, reason: str, message: str) -> None:
        now = _now()
        event = {
            "apiVersion": "v1", "kind": "Event",
            "metadata": {"generateName": f"{involved['name']}.", "namespace": namespace},
            "involvedObject": involved,
            "type": kind, "reason": reason, "message": message[:1024],
            "source": {"component": api.REPORTING_INSTANCE},
            "reportingComponent": api.REPORTING_COMPONENT, "reportingInstance": api.REPORTING_INSTANCE,
            "firstTimestamp": now, "lastTimestamp": now, "count": 1, "action": reason,
        }
        try:
            self.core.create_namespaced_event(namespace, event)
        except ApiException as error:  # an Event is best effort: never fail a transition for it
            log.warning("could not post event %s on %s %s: %s", reason, involved["kind"], involved["name"],
                        error.reason)


def _message(error: ApiException) -> str:
    """The API server's own words (a Status message: which admission rule refused, say)."""
    try:
        return str(json.loads(error.body or "{}").get("message", ""))
    except ValueError:
        return ""


def _now() -> str:
    return api.format_time(api.now())
