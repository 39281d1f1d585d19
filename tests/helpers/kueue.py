"""Kueue's API version and waiting for a Kueue object to be Active: what the Kueue tests and the real node's share."""

from __future__ import annotations

import json
from typing import Any

from durablerun_testbed import procs
from durablerun_testbed.testbed import TestBed

V1BETA2 = "kueue.x-k8s.io/v1beta2"


def condition(testbed: TestBed, resource: str, name: str, type_: str, namespace: str | None = None) -> Any:
    """The condition ``type_`` of a Kueue object (None while it has none)."""
    scope = ["-n", namespace] if namespace else []
    result = testbed.kubectl("get", resource, name, *scope, "-o", "json", check=False)
    if result.returncode != 0:
        return None
    conditions = json.loads(result.stdout).get("status", {}).get("conditions", [])
    return next((c for c in conditions if c["type"] == type_), None)


def wait_active(testbed: TestBed, resource: str, name: str, namespace: str | None = None,
                timeout: float = 60) -> dict[str, Any]:
    active: dict[str, Any] = procs.wait_for(
        lambda: (c := condition(testbed, resource, name, "Active", namespace)) and c["status"] == "True" and c,
        timeout=timeout, what=f"{resource} {name} to be Active")
    return active
