"""The generated alert rules: promtool accepts them, promtool's unit tests pass, and every alert is complete."""

from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from durablerun_testbed import binaries

REPO = Path(__file__).resolve().parents[2]
RULES = REPO / "deploy" / "monitoring" / "durablerun-rules.yaml"
CHART_RULES = REPO / "charts" / "durable-run" / "files" / "durablerun-rules.yaml"
RULES_TEST = REPO / "hack" / "monitoring" / "rules_test.yaml"
RUNBOOKS = REPO / "docs" / "runbooks.md"
RUNBOOK_BASE = "https://github.com/durable-run/durable-run/blob/main/docs/runbooks.md"
EXPECTED_ALERTS = {
    "DurableRunAborted", "DurableRunAbortedByUser", "DurableRunFailed", "DurableRunRestartLoop", "DurableRunStuck",
    "DurableRunBudgetNearCeiling", "DurableRunWaitingOnBudget", "DurableRunLeaseStale", "DurableRunOperatorDown",
    "DurableRunMassLeaseExpiry", "DurableRunQuotaSaturated", "DurableRunQuotaWindowsDown",
}


def promtool(*args: str, cwd: Path = REPO) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(binaries.find("promtool")), *args], cwd=cwd, capture_output=True, text=True,
                          check=False, timeout=120)


def alerting_rules(path: Path = RULES) -> list[dict[str, Any]]:
    body = yaml.safe_load(path.read_text())
    return [rule for group in body["groups"] for rule in group["rules"] if "alert" in rule]


@pytest.mark.parametrize("path", [RULES, CHART_RULES], ids=["deploy", "chart"])
def test_promtool_check_rules(path: Path) -> None:
    result = promtool("check", "rules", str(path))
    assert result.returncode == 0, result.stdout + result.stderr
    assert f"SUCCESS: {len(EXPECTED_ALERTS)} rules found" in result.stdout


def test_promtool_unit_tests_pass() -> None:
    # rules_test.yaml names the rule file relative to itself.
    result = promtool("test", "rules", RULES_TEST.name, cwd=RULES_TEST.parent)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "SUCCESS" in result.stdout


def test_every_alert_has_firing_and_quiet_unit_tests() -> None:
    cases: dict[str, dict[str, int]] = {}
    for test in yaml.safe_load(RULES_TEST.read_text())["tests"]:
        for case in test.get("alert_rule_test", []):
            counts = cases.setdefault(case["alertname"], {"firing": 0, "quiet": 0})
            counts["firing" if case.get("exp_alerts") else "quiet"] += 1
    assert set(cases) == EXPECTED_ALERTS
    for alert, counts in cases.items():
        assert counts["firing"], f"{alert} needs a case where it fires"
        assert counts["quiet"], f"{alert} needs a case where it must not fire"


def test_the_chart_ships_the_same_rules_as_deploy() -> None:
    assert yaml.safe_load(CHART_RULES.read_text()) == yaml.safe_load(RULES.read_text())
    assert set(yaml.safe_load(CHART_RULES.read_text())) == {"groups"}


def test_every_alert_is_complete_and_links_its_runbook_section() -> None:
    rules = alerting_rules()
    assert {rule["alert"] for rule in rules} == EXPECTED_ALERTS
    headings = {
        # GitHub's anchor of a heading: lowercased, punctuation dropped, spaces to dashes.
        re.sub(r"[^a-z0-9 -]", "", line.lstrip("#").strip().lower()).replace(" ", "-")
        for line in RUNBOOKS.read_text().splitlines() if line.startswith("## ")
    }
    for rule in rules:
        name = rule["alert"]
        assert re.fullmatch(r"\d+[smh]", rule["for"]), f"{name}: for"
        assert rule["labels"]["severity"], f"{name}: severity"
        annotations = rule["annotations"]
        assert annotations["summary"].endswith("."), f"{name}: summary"
        assert len(annotations["description"]) > len(annotations["summary"]), f"{name}: description"
        assert annotations["runbook_url"] == f"{RUNBOOK_BASE}#{name.lower()}"
        assert name.lower() in headings, f"docs/runbooks.md has no '## {name}' section"
    # Per-run alerts name the run: their expressions keep namespace and name (the operator's alerts are about it);
    # the quotas' alerts name the quota.
    for rule in rules:
        if rule["alert"].startswith("DurableRunQuota"):
            assert "by (quota)" in rule["expr"], rule["alert"]
        elif rule["alert"] not in ("DurableRunOperatorDown", "DurableRunMassLeaseExpiry"):
            assert "by (namespace, name" in rule["expr"], rule["alert"]


def test_every_alert_passes_the_policy() -> None:
    """What a linter such as pint would hold every alert to: a static severity from a known set (routing
    reads it: a template there cannot be routed on), summary, description, a runbook_url whose anchor is a
    section of docs/runbooks.md, and no label or annotation left empty."""
    headings = {
        re.sub(r"[^a-z0-9 -]", "", line.lstrip("#").strip().lower()).replace(" ", "-")
        for line in RUNBOOKS.read_text().splitlines() if line.startswith("## ")
    }
    for path in (RULES, CHART_RULES):
        for rule in alerting_rules(path):
            name = rule["alert"]
            assert rule["labels"]["severity"] in ("critical", "warning", "info"), f"{name}: severity"
            assert "{{" not in json.dumps(rule["labels"]), f"{name}: a templated label"
            annotations = rule["annotations"]
            assert {"summary", "description", "runbook_url"} <= set(annotations), f"{name}: annotations"
            assert all(str(value).strip() for value in [*rule["labels"].values(), *annotations.values()]), name
            base, _, anchor = annotations["runbook_url"].partition("#")
            assert base == RUNBOOK_BASE, f"{name}: runbook_url"
            assert anchor in headings, f"{name}: docs/runbooks.md has no section #{anchor}"


def test_a_templated_severity_is_refused_when_the_rules_are_generated() -> None:
    from monitoring import alerts

    with pytest.raises(ValueError, match="split the alert"):
        alerts.Alert(name="X", expr="up", for_="1m", severity="{{ $labels.level }}", summary="s.", description="d")
