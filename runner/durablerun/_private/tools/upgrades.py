"""``kubectl durablerun upgrade``: move a run to new code deliberately, and only to code that replays its journal.

The plugin asks; the operator checks and decides. It writes the ``durablerun.dev/upgrade`` annotation (the image,
who asks, whether to check only) and waits for the operator's verdict in ``status.upgradeCheck``: the operator runs
a one-off pod of that image, with the run's own ServiceAccount, store credentials and restricted security, that
replays the run's journal (``durablerun replay``), and moves ``status.pin`` only on a clean replay. A divergence, a
workflow that raises, an image that cannot start: printed, and nothing changes. A hand-written annotation goes
through the same check. docs/operator.md, "Upgrading code under running runs".
"""

from __future__ import annotations

import json
import os
import time
from typing import Any

from durablerun import api
from durablerun._private.tools.kubeapi import KIND_REF, RESOURCE, Kubectl, PluginError


def who(kube: Kubectl) -> str:
    """The user as the API server knows them (kubectl auth whoami), else $USER."""
    found = kube("auth", "whoami", "-o", "jsonpath={.status.userInfo.username}", check=False)
    return found.stdout.strip() if found.returncode == 0 and found.stdout.strip() else os.environ.get("USER", "?")


def ask(kube: Kubectl, run_name: str, image: str, *, check_only: bool, by: str) -> str:
    """Write the request (a new value each time, so asking again is checked again); the value written."""
    run = kube.run(run_name)
    status = run.get("status") or {}
    if not (status.get("pin") or {}).get("image"):
        raise PluginError(f"{run_name} is not pinned to an image yet (no attempt has reported one): its next attempt "
                          "runs spec.template's image; there is nothing to move")
    if status.get("phase") == api.Phase.RUNNING:
        raise PluginError(f"{run_name} is Running: an attempt is adding to its journal, which the check would not "
                          f"cover. Upgrade it while it waits, or suspend it first (kubectl durablerun suspend "
                          f"{run_name})")
    value = json.dumps({"image": image, "by": by, "dryRun": check_only, "at": api.format_time(api.now())},
                       separators=(",", ":"))
    kube("annotate", RESOURCE, run_name, f"{api.ANNOTATION_UPGRADE}={value}", "--overwrite")
    return value


def verdict(kube: Kubectl, run_name: str, value: str, deadline: float) -> dict[str, Any]:
    """The run's status once the operator answered request ``value`` (status.upgradeCheck no longer Checking)."""
    while True:
        status = kube.run(run_name).get("status") or {}
        check = status.get("upgradeCheck") or {}
        if check.get("request") == value and check.get("state") != api.UpgradeState.CHECKING:
            return dict(status)
        if time.monotonic() > deadline:
            raise PluginError(f"{run_name}: the operator gave no verdict in time (status.upgradeCheck: "
                              f"{check.get('state', 'none')}); the check goes on: kubectl get dr {run_name} -o "
                              "jsonpath='{.status.upgradeCheck}'")
        time.sleep(1)


def report(run_name: str, image: str, status: dict[str, Any], *, check_only: bool) -> str:
    """One line for a clean replay; PluginError (the run unchanged) for anything else."""
    check, pin = status["upgradeCheck"], status.get("pin") or {}
    if check["state"] != api.UpgradeState.REPLAYS:
        raise PluginError(f"{run_name}: {image} refused; nothing changed.\n{check.get('message', '')}")
    digest = check.get("digest")
    if check_only:
        return f"{KIND_REF}/{run_name}: {image} ({digest}) replays the journal cleanly (--check: nothing changed)"
    moved = pin.get("request") == check["request"] and pin.get("since") == check.get("finishTime")  # by this check
    if not moved:
        return f"{KIND_REF}/{run_name} already runs {digest}"
    return (f"{KIND_REF}/{run_name} upgraded: {image} ({digest}) replays the journal cleanly; the next attempt runs "
            f"it instead of {pin['previous']}")


def upgrade(kube: Kubectl, run_name: str, image: str, *, check_only: bool, timeout: float) -> str:
    """Ask the operator to check ``image`` against the run's journal and, unless ``check_only``, move the run."""
    value = ask(kube, run_name, image, check_only=check_only, by=who(kube))
    return report(run_name, image, verdict(kube, run_name, value, time.monotonic() + timeout), check_only=check_only)


def upgrade_selected(kube: Kubectl, selector: str, image: str, *, check_only: bool, timeout: float) -> tuple[int, str]:
    """The bulk form: each run the label selector names, checked and moved on its own (the checks run side by
    side); (runs refused, report)."""
    names = [r["metadata"]["name"] for r in kube.json("get", RESOURCE, "-l", selector).get("items") or []]
    if not names:
        raise PluginError(f"no DurableRun matches -l {selector}")
    by = who(kube)
    asked: dict[str, str | PluginError] = {}
    for name in names:
        try:
            asked[name] = ask(kube, name, image, check_only=check_only, by=by)
        except PluginError as e:
            asked[name] = e
    deadline = time.monotonic() + timeout
    lines, refused = [], 0
    for name, value in asked.items():
        try:
            if isinstance(value, PluginError):
                raise value
            lines.append(report(name, image, verdict(kube, name, value, deadline), check_only=check_only))
        except PluginError as e:
            refused += 1
            lines.append(f"{KIND_REF}/{name} refused: {e}")
    return refused, "\n".join(lines)
