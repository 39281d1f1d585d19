"""A user whose RBAC allows only reading: the run browser shows the runs but no action buttons (it asks the API
server, a SelfSubjectAccessReview), and an action forced from the page fails with the API server's message."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from selenium import webdriver
from selenium.webdriver.common.by import By

from durablerun import api
from durablerun_testbed.testbed import TestBed
from tests.browser.pages import StartUI, confirm, listed, open_link, text, until
from tests.helpers.runs import RunEnv

pytestmark = pytest.mark.testbed


def viewer_kubeconfig(testbed: TestBed, namespace: str, directory: Path) -> Path:
    """A kubeconfig with a real token of a ServiceAccount bound to a Role that may only read runs and Events."""
    assert testbed.controlplane
    rbac = [
        {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": "viewer", "namespace": namespace}},
        {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "Role",
         "metadata": {"name": "durablerun-viewer", "namespace": namespace},
         "rules": [{"apiGroups": [api.GROUP], "resources": [api.PLURAL], "verbs": ["get", "list", "watch"]},
                   {"apiGroups": [""], "resources": ["events"], "verbs": ["get", "list"]}]},
        {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding",
         "metadata": {"name": "durablerun-viewer", "namespace": namespace},
         "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "durablerun-viewer"},
         "subjects": [{"kind": "ServiceAccount", "name": "viewer", "namespace": namespace}]},
    ]
    testbed.kubectl("apply", "-f", "-", input=yaml.safe_dump_all(rbac))
    token = testbed.kubectl("create", "token", "viewer", "-n", namespace, "--duration=10m").stdout.strip()
    path = directory / "viewer.kubeconfig"
    path.write_text(yaml.safe_dump(testbed.controlplane.kubeconfig_dict(
        f"system:serviceaccount:{namespace}:viewer", token)))
    path.chmod(0o600)
    return path


def test_a_reader_sees_no_actions_and_a_forced_one_is_refused(
        runs: RunEnv, testbed: TestBed, start_ui: StartUI, chrome: webdriver.Remote, tmp_path: Path) -> None:
    ns = runs.namespace
    runs.apply(runs.manifest("review", "optest_flows:approval"))
    url = start_ui(viewer_kubeconfig(testbed, ns, tmp_path), "-n", ns)
    chrome.get(url)
    until(chrome, lambda: f"{ns}/review" in listed(chrome), "the run, to its reader")
    open_link(chrome, "review")
    until(chrome, lambda: text(chrome, "#facts"), "the run's facts")
    actions = chrome.find_element(By.ID, "actions")
    assert not actions.is_displayed()
    assert not any(b.is_displayed() for b in chrome.find_elements(By.CSS_SELECTOR, "[data-action]"))

    # Shown anyway (as a user could in the browser's dev tools), the button's change is refused by the API server.
    chrome.execute_script("document.getElementById('actions').hidden = false")
    chrome.find_element(By.CSS_SELECTOR, "[data-action=suspend]").click()
    confirm(chrome)
    until(chrome, lambda: "forbidden" in text(chrome, "#result"), "the API server's refusal")
    refusal = text(chrome, "#result")
    assert f'User "system:serviceaccount:{ns}:viewer" cannot patch resource "{api.PLURAL}"' in refusal, refusal
    assert "error" in (chrome.find_element(By.ID, "result").get_attribute("class") or "")
    assert runs.get("review")["spec"]["suspend"] is False
