"""The DurableRun CustomResourceDefinition, generated from the API models.

``durablerun.resource`` (with the child-run and signal models of ``durablerun.relations``) is the one
source of the resource's shape; this module turns its pydantic models into the structural OpenAPI v3
schema the API server validates and defaults with, and adds the printer columns. ``spec.template`` gets
the real PodTemplateSpec schema, converted from the Kubernetes OpenAPI
(swagger.json) that ``hack/generate.py`` reads and passes in. ``hack/generate.py``
writes the result into deploy/ and the chart; a test fails when those are stale.
"""

from __future__ import annotations

import copy
import inspect
import re
from typing import Any

from durablerun import api, quotas, resource, schedules

# Keys of pydantic's JSON schema that have no place in a CRD schema.
_DROPPED_KEYS = ("title",)


def _inline(schema: dict[str, Any], defs: dict[str, Any]) -> dict[str, Any]:
    """Resolve $refs, collapse Optional[X] to X, and drop what Kubernetes rejects."""
    if "$ref" in schema:
        target = copy.deepcopy(defs[schema["$ref"].split("/")[-1]])
        extra = {k: v for k, v in schema.items() if k != "$ref"}
        return _inline({**target, **extra}, defs)
    if "anyOf" in schema:
        options = [o for o in schema["anyOf"] if o.get("type") != "null"]
        if len(options) != 1:
            raise ValueError(f"a CRD schema cannot express a union: {schema}")
        outer = {k: v for k, v in schema.items() if k != "anyOf"}
        merged = {**_inline(options[0], defs), **outer}
        if merged.get("default", "unset") is None:
            del merged["default"]
        return _inline(merged, defs)
    out: dict[str, Any] = {}
    for key, value in schema.items():
        if key in _DROPPED_KEYS:
            continue
        if key == "properties":
            out[key] = {name: _inline(prop, defs) for name, prop in value.items()}
        elif key in ("items", "additionalProperties") and isinstance(value, dict):
            out[key] = _inline(value, defs)
        else:
            out[key] = value
    if out.get("x-kubernetes-preserve-unknown-fields"):
        out.pop("additionalProperties", None)
        out["type"] = "object"
    if out.get("type") == "object" and out.get("additionalProperties") is True:
        del out["additionalProperties"]
        out["x-kubernetes-preserve-unknown-fields"] = True
    if "enum" in out and "type" not in out:
        out["type"] = "string"
    return out


def _default_nested_objects(schema: dict[str, Any]) -> None:
    """Default an absent nested object to {} so the API server fills in its own defaults.

    (spec.policy omitted entirely still gets maxRestarts: 3 and the rest.)
    """
    for prop in schema.get("properties", {}).values():
        if prop.get("type") == "object" and "properties" in prop:
            if not prop.get("required"):
                prop.setdefault("default", {})
            _default_nested_objects(prop)


# --- spec.template: the PodTemplateSpec of the Kubernetes OpenAPI ----------------------------

POD_TEMPLATE_SPEC = "io.k8s.api.core.v1.PodTemplateSpec"
_REF = "#/definitions/"
# Keywords of the Kubernetes OpenAPI kept in the CRD; the rest (x-kubernetes-patch-*, x-kubernetes-unions, ...)
# are for strategic merge patch and clients, and a CRD schema cannot hold them.
_KEPT = ("type", "format", "description", "properties", "items", "additionalProperties", "required",
         "x-kubernetes-list-type", "x-kubernetes-list-map-keys", "x-kubernetes-map-type")
# resource.Quantity as controller-gen writes it: a number or a string (cpu: 1, memory: 1Gi), the string
# refused at apply unless it is a quantity.
_QUANTITY = {
    "anyOf": [{"type": "integer"}, {"type": "string"}],
    "pattern": r"^(\+|-)?(([0-9]+(\.[0-9]*)?)|(\.[0-9]+))(([KMGTPE]i)|[numkMGTPE]|([eE](\+|-)?(([0-9]+(\.[0-9]*)?)"
               r"|(\.[0-9]+))))?$",
    "x-kubernetes-int-or-string": True,
}
# The API server needs every key of a list-type map to be required or defaulted. These are the ones the
# Kubernetes OpenAPI leaves optional; the values are the API server's own defaults.
_MAP_KEY_DEFAULTS = {"protocol": "TCP", "name": ""}


def _first_sentence(text: str) -> str:
    """A description's first sentence: enough for `kubectl explain`, and the CRD stays small enough for a
    client-side `kubectl apply` (its last-applied annotation holds the whole object, at most 256 KiB)."""
    line = text.strip().split("\n")[0]
    match = re.match(r"(.+?\.)(\s|$)", line)
    return match.group(1) if match else line


def _object_meta(description: str | None) -> dict[str, Any]:
    """Template metadata: labels and annotations are all that is copied onto the pod (the operator names it)."""
    string_map = {"type": "object", "additionalProperties": {"type": "string"}}
    out: dict[str, Any] = {"type": "object", "properties": {
        "labels": {**string_map, "description": "Labels for the pod."},
        "annotations": {**string_map, "description": "Annotations for the pod."},
    }}
    if description:
        out["description"] = description
    return out


def _structural(schema: dict[str, Any], definitions: dict[str, Any], stack: tuple[str, ...]) -> dict[str, Any]:
    """One node of the Kubernetes OpenAPI as a structural CRD schema: refs resolved, every node typed."""
    description = _first_sentence(schema["description"]) if schema.get("description") else None
    out: dict[str, Any]
    if "$ref" in schema:
        name = schema["$ref"].removeprefix(_REF)
        if name == "io.k8s.apimachinery.pkg.api.resource.Quantity":
            out = copy.deepcopy(_QUANTITY)
        elif name == "io.k8s.apimachinery.pkg.util.intstr.IntOrString":
            out = {"x-kubernetes-int-or-string": True}
        elif name == "io.k8s.apimachinery.pkg.apis.meta.v1.ObjectMeta":
            return _object_meta(description)
        elif name in stack:
            raise ValueError(f"{name} is recursive: a CRD schema cannot express it ({' -> '.join(stack)})")
        else:
            out = _structural(definitions[name], definitions, (*stack, name))
        if description:
            out["description"] = description
        return out
    out = {}
    for key, value in schema.items():
        if key not in _KEPT:
            continue
        if key == "properties":
            out[key] = {field: _structural(prop, definitions, stack) for field, prop in value.items()}
        elif key in ("items", "additionalProperties") and isinstance(value, dict):
            out[key] = _structural(value, definitions, stack)
        elif key == "description":
            out[key] = description
        else:
            out[key] = copy.deepcopy(value)
    if out.get("format") == "int-or-string":
        raise ValueError(f"an int-or-string outside IntOrString: {schema}")
    if "type" not in out:
        raise ValueError(f"a node without a type has no structural schema: {schema}")
    item: dict[str, Any] = out.get("items") or {}
    keys: list[str] = out.get("x-kubernetes-list-map-keys", [])
    for key in keys:
        if key not in item.get("required", []):
            item["properties"][key]["default"] = _MAP_KEY_DEFAULTS[key]
    return out


def pod_template_schema(definitions: dict[str, Any]) -> dict[str, Any]:
    """spec.template's schema: the PodTemplateSpec of ``definitions`` (the Kubernetes OpenAPI's), structural.

    A typo (``containres``, ``imagee``) is then an unknown field the API server refuses at apply, and
    ``kubectl explain durablerun.spec.template.spec.containers`` works. Two changes to what a Pod accepts:
    ``containers`` is optional (the operator adds the runner container), and the metadata holds labels
    and annotations only.
    """
    schema = _structural({"$ref": _REF + POD_TEMPLATE_SPEC}, definitions, ())
    schema["properties"]["spec"]["required"].remove("containers")
    if not schema["properties"]["spec"]["required"]:
        del schema["properties"]["spec"]["required"]
    return schema


#: At most this many events in spec.events: a run holds every event it was sent (names are add-only), and each
#: finished child run adds one (durablerun.child.<child>), so the count bounds what the map can grow to. 500
#: events of ~100 bytes make a ~100 KiB run (bench/RESULTS.md); etcd refuses an object over 1.5 MiB, and then
#: every write of the run fails, its runner's lease renewals included.
EVENTS_MAX = 2000


def _bounded(spec: dict[str, Any], status: dict[str, Any]) -> None:
    """Refuse at apply time what would grow a DurableRun without bound (docs/bad-input.md)."""
    spec["properties"]["events"]["maxProperties"] = EVENTS_MAX
    # ctx.start_child refuses the child past api.CHILDREN_MAX first, saying what to do; this is the backstop.
    for field in ("childRequests", "children"):
        status["properties"][field]["maxProperties"] = api.CHILDREN_MAX
    status["properties"]["childrenCreated"]["maxItems"] = api.CHILDREN_MAX


def _schema_of(model: type[Any]) -> dict[str, Any]:
    schema = model.model_json_schema()
    out = _inline(schema, schema.get("$defs", {}))
    out.pop("$defs", None)
    out["description"] = inspect.cleandoc(model.__doc__ or "")
    return out


def _run_spec_schema(kubernetes_definitions: dict[str, Any]) -> dict[str, Any]:
    spec = _schema_of(resource.DurableRunSpec)
    _default_nested_objects(spec)
    spec["properties"]["template"] = {**pod_template_schema(kubernetes_definitions),
                                      "description": spec["properties"]["template"]["description"]}
    return spec


def openapi_schema(kubernetes_definitions: dict[str, Any]) -> dict[str, Any]:
    """The DurableRun's schema; ``kubernetes_definitions``: the Kubernetes OpenAPI's (for spec.template)."""
    spec = _run_spec_schema(kubernetes_definitions)
    status = _schema_of(resource.DurableRunStatus)
    _bounded(spec, status)
    return {
        "type": "object",
        "description": (
            "A durable run: a Python workflow executed step by step by a runner pod, every "
            "step journaled before the next starts, resumed from its journal after any crash."
        ),
        "required": ["spec"],
        "properties": {
            "apiVersion": {"type": "string"},
            "kind": {"type": "string"},
            "metadata": {"type": "object"},
            "spec": spec,
            "status": status,
        },
    }


PRINTER_COLUMNS: list[dict[str, Any]] = [
    {"name": "Phase", "type": "string", "jsonPath": ".status.phase",
     "description": "Pending, Queued, Running, Waiting, Suspended, Backoff, Succeeded, Failed or Aborted."},
    {"name": "Step", "type": "string", "jsonPath": ".status.progress.stepName",
     "description": "The step running now, or the last one the run reached."},
    {"name": "Progress", "type": "string", "jsonPath": ".status.progress.summary",
     "description": 'Steps done: "5/12" when the workflow declares a total, else "5 steps".'},
    {"name": "Cost", "type": "string", "jsonPath": ".status.cost.usd", "description": "Cost so far in US dollars."},
    {"name": "Restarts", "type": "integer", "jsonPath": ".status.restarts",
     "description": "Restarts after crashes, OOM kills and expired leases (held against maxRestarts)."},
    {"name": "Suspended", "type": "boolean", "jsonPath": ".spec.suspend",  # literal-ok: a column's title
     "description": "spec.suspend: true stops the run at its next step boundary."},
    {"name": "Age", "type": "date", "jsonPath": ".metadata.creationTimestamp",
     "description": "Time since the DurableRun was created."},
    {"name": "Reason", "type": "string", "jsonPath": ".status.reason", "priority": 1,
     "description": "Why a Running run's pod cannot start (ImagePullBackOff, ...), or why the run Failed or was "
                    "Aborted."},
    {"name": "Steps", "type": "integer", "jsonPath": ".status.progress.completedSteps", "priority": 1,
     "description": "Steps journaled so far."},
    {"name": "Pod", "type": "string", "jsonPath": ".status.pod", "priority": 1,
     "description": "The current (or last) attempt's pod."},
    {"name": "Children", "type": "string", "jsonPath": ".status.childrenTotal.summary", "priority": 1,
     "description": "Child runs finished of those created (ctx.start_child)."},
    {"name": "Child Cost", "type": "string", "jsonPath": ".status.childrenTotal.usd", "priority": 1,
     "description": "The child runs' cost in US dollars; it counts toward policy.costCeilingUSD."},
    {"name": "Run ID", "type": "string", "jsonPath": ".spec.checkpoint.runId", "priority": 1,
     "description": "spec.checkpoint.runId: the run id whose journal the run continues (none: its own)."},
    {"name": "Trace", "type": "string", "jsonPath": ".status.traceID", "priority": 1,
     "description": "The run's OpenTelemetry trace id: look it up in the tracing backend."},
    {"name": "Queue", "type": "string", "priority": 1,
     "jsonPath": ".metadata.labels." + api.LABEL_QUEUE_NAME.replace(".", "\\."),
     "description": "The Kueue LocalQueue the run is admitted through (its kueue.x-k8s.io/queue-name label)."},
    {"name": "Image", "type": "string", "jsonPath": ".status.pin.image", "priority": 1,
     "description": "The runner image the run is pinned to, by digest (kubectl durablerun upgrade moves it)."},
]


ADMISSION_POLICY = f"{api.PLURAL}.{api.GROUP}"
STATUS_ADMISSION_POLICY = f"{api.PLURAL}-status.{api.GROUP}"


def admission_policy() -> list[dict[str, Any]]:
    """The ValidatingAdmissionPolicies (and their bindings), installed with the CRD: the first keeps spec.input
    and set events immutable, and a Queued or Running run's Kueue queue label fixed (updates of DurableRuns, not
    of their status); the second holds a runner's status writes to its own attempt and fields."""
    labels = {api.LABEL_NAME: api.APP_NAME}
    spec_policy = _policy(ADMISSION_POLICY, api.PLURAL, labels, [
        (resource.INPUT_RULE, resource.INPUT_IMMUTABLE),
        (resource.EVENTS_RULE, resource.EVENTS_IMMUTABLE),
        (resource.QUEUE_LABEL_RULE, resource.QUEUE_LABEL_FIXED),
    ])
    # The runner's status writes: only the current attempt, and never the operator's fields (resource.RUNNER_WRITER:
    # the operator's, people's and other controllers' writes are not matched). It costs each renewal about 1.5 ms
    # of API server CPU (bench/RESULTS.md, "What one status write costs the API server").
    status_policy = _policy(STATUS_ADMISSION_POLICY, f"{api.PLURAL}/status", labels, [
        (resource.CURRENT_ATTEMPT_RULE, resource.CURRENT_ATTEMPT_ONLY),
        *((resource.operator_only_rule(field), resource.operator_only_message(field))
          for field in resource.OPERATOR_ONLY_FIELDS),
    ])
    status_policy["spec"]["matchConditions"] = [{"name": "from-the-runs-runner", "expression": resource.RUNNER_WRITER}]
    return [spec_policy, _binding(ADMISSION_POLICY, labels), status_policy, _binding(STATUS_ADMISSION_POLICY, labels)]


def _policy(name: str, resources: str, labels: dict[str, str], rules: list[tuple[str, str]]) -> dict[str, Any]:
    """A policy on UPDATEs of ``resources``; each rule (expression, message) refuses with Invalid (422), as a
    failed test op of a guarded patch does (a runner takes it as fenced)."""
    return {
        "apiVersion": "admissionregistration.k8s.io/v1",
        "kind": "ValidatingAdmissionPolicy",
        "metadata": {"name": name, "labels": labels},
        "spec": {
            "failurePolicy": "Fail",
            "matchConstraints": {"resourceRules": [{
                "apiGroups": [api.GROUP], "apiVersions": ["*"], "operations": ["UPDATE"], "resources": [resources],
            }]},
            "validations": [{"expression": rule, "message": message, "reason": "Invalid"} for rule, message in rules],
        },
    }


def _binding(policy: str, labels: dict[str, str]) -> dict[str, Any]:
    return {
        "apiVersion": "admissionregistration.k8s.io/v1",
        "kind": "ValidatingAdmissionPolicyBinding",
        "metadata": {"name": policy, "labels": labels},
        "spec": {"policyName": policy, "validationActions": ["Deny"]},
    }


def custom_resource_definition(kubernetes_definitions: dict[str, Any]) -> dict[str, Any]:
    """The CRD; ``kubernetes_definitions``: the definitions of the Kubernetes OpenAPI (swagger.json)."""
    return {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {
            "name": f"{api.PLURAL}.{api.GROUP}",
            "labels": {api.LABEL_NAME: api.APP_NAME},
        },
        "spec": {
            "group": api.GROUP,
            "scope": "Namespaced",
            "names": {
                "kind": api.KIND,
                "listKind": f"{api.KIND}List",
                "plural": api.PLURAL,
                "singular": api.SINGULAR,
                "shortNames": [api.SHORT_NAME],
                "categories": ["all"],
            },
            "versions": [
                {
                    "name": api.VERSION,
                    "served": True,
                    "storage": True,
                    "subresources": {"status": {}},
                    "additionalPrinterColumns": PRINTER_COLUMNS,
                    "schema": {"openAPIV3Schema": openapi_schema(kubernetes_definitions)},
                }
            ],
        },
    }


# --- ModelQuota ------------------------------------------------------------------------------------------------

QUOTA_PRINTER_COLUMNS: list[dict[str, Any]] = [
    {"name": "Models", "type": "string", "jsonPath": ".spec.models", "description": quotas.ModelQuotaSpec.model_fields[
        "models"].description},
    {"name": "Tokens/min", "type": "string", "jsonPath": ".status.tokens",
     "description": "Tokens taken in the last minute's window, of tokensPerMinute."},
    {"name": "Requests/min", "type": "string", "jsonPath": ".status.requests",
     "description": "Requests taken in the last minute's window, of requestsPerMinute."},
    {"name": "In flight", "type": "integer", "jsonPath": ".status.inFlight",
     "description": "Calls granted and not yet settled."},
    {"name": "Waiting", "type": "integer", "jsonPath": ".status.runsWaiting",  # literal-ok: a column's title
     "description": "Runs Waiting, with no pod, for room in the quota."},
    {"name": "Age", "type": "date", "jsonPath": ".metadata.creationTimestamp",
     "description": "Time since the ModelQuota was created."},
    {"name": "Namespaces", "type": "string", "jsonPath": ".spec.namespaces", "priority": 1,
     "description": "The namespaces whose runs it covers (none: every namespace)."},
    {"name": "Cooling down until", "type": "string", "jsonPath": ".status.coolingDownUntil", "priority": 1,
     "description": "A provider refused a call (429): no call goes until then."},
]


def quota_custom_resource_definition() -> dict[str, Any]:
    """The ModelQuota CRD (durablerun.quotas): cluster-scoped, its spec refused at apply unless it limits
    something."""
    spec = _schema_of(quotas.ModelQuotaSpec)
    spec["x-kubernetes-validations"] = [{"rule": quotas.LIMIT_RULE, "message": quotas.LIMIT_MISSING}]
    return {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {"name": api.QUOTA_CRD_NAME, "labels": {api.LABEL_NAME: api.APP_NAME}},
        "spec": {
            "group": api.GROUP,
            "scope": "Cluster",
            "names": {"kind": api.QUOTA_KIND, "listKind": f"{api.QUOTA_KIND}List", "plural": api.QUOTA_PLURAL,
                      "singular": api.QUOTA_SINGULAR, "shortNames": [api.QUOTA_SHORT_NAME]},
            "versions": [{
                "name": api.VERSION, "served": True, "storage": True,
                "subresources": {"status": {}},
                "additionalPrinterColumns": QUOTA_PRINTER_COLUMNS,
                "schema": {"openAPIV3Schema": {
                    "type": "object",
                    "description": "Limits on model calls (tokens and requests per minute, calls at once) that the "
                                   "runs of the namespaces it covers share (docs/agents.md, \"Model quotas\").",
                    "required": ["spec"],
                    "properties": {"apiVersion": {"type": "string"}, "kind": {"type": "string"},
                                   "metadata": {"type": "object"}, "spec": spec,
                                   "status": _schema_of(quotas.ModelQuotaStatus)},
                }},
            }],
        },
    }


# --- DurableRunSchedule ---------------------------------------------------------------------------------------

SCHEDULE_PRINTER_COLUMNS: list[dict[str, Any]] = [
    {"name": "Schedule", "type": "string", "jsonPath": ".spec.schedule", "description": "The cron expression."},
    {"name": "Time Zone", "type": "string", "jsonPath": ".spec.timeZone",
     "description": "The time zone the expression is read in."},
    {"name": "Suspend", "type": "boolean", "jsonPath": ".spec.suspend",
     "description": "true: no tick creates a run."},
    {"name": "Active", "type": "integer", "jsonPath": ".status.activeCount",
     "description": "Runs it created that have not finished."},
    {"name": "Last Schedule", "type": "date", "jsonPath": ".status.lastScheduleTime",
     "description": "The last tick that created a run."},
    {"name": "Next Schedule", "type": "string", "jsonPath": ".status.nextScheduleTime",
     "description": "The next tick."},
    {"name": "Age", "type": "date", "jsonPath": ".metadata.creationTimestamp",
     "description": "Time since the DurableRunSchedule was created."},
    {"name": "Policy", "type": "string", "jsonPath": ".spec.concurrencyPolicy", "priority": 1,
     "description": "Allow, Forbid or Replace."},
    {"name": "Last Success", "type": "date", "jsonPath": ".status.lastSuccessfulTime", "priority": 1,
     "description": "When a run of it last Succeeded."},
]


def _without_transition_rules(schema: dict[str, Any]) -> dict[str, Any]:
    """A copy of ``schema`` without the CEL rules that compare with the stored object (``oldSelf``): a run's
    immutable fields are the template's to change, for the runs to come."""
    out: dict[str, Any] = {}
    for key, value in schema.items():
        if key == "x-kubernetes-validations":
            kept = [rule for rule in value if "oldSelf" not in rule["rule"]]
            if kept:
                out[key] = kept
        elif isinstance(value, dict):
            out[key] = _without_transition_rules(value)
        else:
            out[key] = copy.deepcopy(value)
    return out


def _cel_list(items: list[str]) -> str:
    for item in items:
        if "'" in item or "\\" in item:
            raise ValueError(f"{item!r} cannot be written in a CEL string as it is")
    return "[" + ",".join(f"'{item}'" for item in items) + "]"


def schedule_custom_resource_definition(kubernetes_definitions: dict[str, Any], zones: list[str]) -> dict[str, Any]:
    """The DurableRunSchedule CRD (durablerun.schedules); ``zones``: the IANA time zones a schedule may name (the
    API server refuses any other at apply), ``kubernetes_definitions`` as for the DurableRun's."""
    spec = _schema_of(schedules.DurableRunScheduleSpec)
    template = spec["properties"]["runTemplate"]
    template["properties"]["spec"] = {**_without_transition_rules(_run_spec_schema(kubernetes_definitions)),
                                      "description": template["properties"]["spec"]["description"]}
    spec["properties"]["timeZone"]["x-kubernetes-validations"] = [
        {"rule": f"self in {_cel_list(sorted(zones))}", "message": schedules.TIME_ZONE_INVALID}]
    return {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {"name": api.SCHEDULE_CRD_NAME, "labels": {api.LABEL_NAME: api.APP_NAME}},
        "spec": {
            "group": api.GROUP,
            "scope": "Namespaced",
            "names": {"kind": api.SCHEDULE_KIND, "listKind": f"{api.SCHEDULE_KIND}List",
                      "plural": api.SCHEDULE_PLURAL, "singular": api.SCHEDULE_SINGULAR,
                      "shortNames": [api.SCHEDULE_SHORT_NAME], "categories": ["all"]},
            "versions": [{
                "name": api.VERSION, "served": True, "storage": True,
                "subresources": {"status": {}},
                "additionalPrinterColumns": SCHEDULE_PRINTER_COLUMNS,
                "schema": {"openAPIV3Schema": {
                    "type": "object",
                    "description": "DurableRuns created on a clock, as a CronJob creates Jobs (docs/operator.md, "
                                   "\"Scheduled runs\").",
                    "required": ["spec"],
                    "x-kubernetes-validations": [{"rule": schedules.NAME_RULE, "message": schedules.NAME_TOO_LONG}],
                    "properties": {"apiVersion": {"type": "string"}, "kind": {"type": "string"},
                                   "metadata": {"type": "object"}, "spec": spec,
                                   "status": _schema_of(schedules.DurableRunScheduleStatus)},
                }},
            }],
        },
    }
