"""The run browser (`kubectl durablerun ui`) in a real headless Chromium, against the test bed: the live list and
its filters, a run's page (a restart and a wait on its timeline), approving it from the page until it Succeeds,
aborting another; and what a request from anywhere but this server's own pages gets.

Set DURABLERUN_SCREENSHOTS=<dir> to save the list's and the run page's screenshots there (docs/images/).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from selenium import webdriver
from selenium.webdriver.common.by import By
from selenium.webdriver.support.select import Select

from durablerun import api
from durablerun_testbed import binaries, chromium, procs
from durablerun_testbed.testbed import TestBed
from tests.browser.pages import StartUI, answer, confirm, listed, open_link, rows, text, until
from tests.helpers.runs import Operator, RunEnv

pytestmark = pytest.mark.testbed


def labelled(runs: RunEnv, name: str, workflow: str, input: dict[str, Any], team: str) -> dict[str, Any]:
    manifest = runs.manifest(name, workflow, input)
    manifest["metadata"]["labels"] = {"team": team}
    return manifest


def screenshot(chrome: webdriver.Remote, name: str, height: int) -> None:
    folder = os.environ.get("DURABLERUN_SCREENSHOTS")
    if folder:
        chrome.set_window_size(1280, height)
        chrome.save_screenshot(str(Path(folder) / name))
        chrome.set_window_size(1400, 1000)


def test_list_filter_open_approve_and_abort(operator: Operator, runs: RunEnv, testbed: TestBed,
                                            start_ui: StartUI, chrome: webdriver.Remote,
                                            chromedriver: chromium.Chromedriver) -> None:
    ns = runs.namespace
    url = start_ui(testbed.kubeconfig, "--all-namespaces", "--credentials-from-secret",
                   "--trace-url", "http://127.0.0.1:16686/trace/{traceID}")
    chrome.get(url)
    # The list is live: runs created after the page loaded appear without a reload.
    runs.apply(labelled(runs, "review", "optest_flows:restart_then_approve", {}, "checkout"))
    runs.apply(labelled(runs, "long", "optest_flows:steps", {"steps": 300, "sleep": 0.2}, "search"))
    until(chrome, lambda: {f"{ns}/review", f"{ns}/long"} <= listed(chrome), "both new runs")
    runs.wait_phase("review", "Waiting", timeout=120)

    Select(chrome.find_element(By.NAME, "phase")).select_by_visible_text("Waiting")
    until(chrome, lambda: f"{ns}/review" in listed(chrome) and f"{ns}/long" not in listed(chrome),
          "only the waiting run with phase=Waiting")
    Select(chrome.find_element(By.NAME, "phase")).select_by_visible_text("any")
    label = chrome.find_element(By.NAME, "label")
    label.send_keys("team=search\n")
    until(chrome, lambda: f"{ns}/long" in listed(chrome) and f"{ns}/review" not in listed(chrome),
          "only the team=search run")
    label.clear()
    chrome.find_element(By.NAME, "age").send_keys("2x\n")
    until(chrome, lambda: "age:" in text(chrome, "#error"), "the bad age filter named")
    chrome.find_element(By.NAME, "age").clear()
    chrome.find_element(By.NAME, "label").send_keys("team\n")  # a label key alone: runs that have it
    until(chrome, lambda: {f"{ns}/review", f"{ns}/long"} <= listed(chrome), "both runs again")
    # Search (the words in a run's name or message) and sort.
    search = chrome.find_element(By.NAME, "q")
    search.send_keys(f"{ns} revi\n")
    until(chrome, lambda: listed(chrome) == {f"{ns}/review"}, "only the run the search names")
    search.clear()
    search.send_keys("\n")
    until(chrome, lambda: {f"{ns}/review", f"{ns}/long"} <= listed(chrome), "both runs once the search is cleared")

    def order() -> list[str]:
        return [row["data"]["run"] for row in rows(chrome, "runs")]

    Select(chrome.find_element(By.NAME, "sort")).select_by_visible_text("restarts, most first")
    until(chrome, lambda: order() == [f"{ns}/review", f"{ns}/long"], "the restarted run first")
    Select(chrome.find_element(By.NAME, "sort")).select_by_visible_text("name")
    until(chrome, lambda: order() == [f"{ns}/long", f"{ns}/review"], "by name")
    screenshot(chrome, "run-browser-list.png", 480)

    # The run's page: where it waits, the restart and the wait on its timeline, its Events and conditions.
    open_link(chrome, "review")
    until(chrome, lambda: 'Waiting for event "review"' in text(chrome, "#waiting"), "what the run waits for")
    until(chrome, lambda: {"restart", "wait"} <= {row["data"]["kind"] for row in rows(chrome, "timeline")},
          "the restart and the wait on the timeline")
    kinds = [(row["data"]["kind"], row["cells"][4]) for row in rows(chrome, "timeline")]
    assert [k for k in kinds if k[0] in ("step", "wait")] == [("step", "prepare"), ("step", "flaky"),
                                                              ("wait", "wait: review")], kinds
    assert runs.get("review")["status"]["restarts"] == 1
    # The restart's row names its cause, from the operator's Restarting Event (not only in the Events table).
    restart = until(chrome, lambda: next((row for row in rows(chrome, "timeline") if row["data"]["kind"] == "restart"
                                          and "Crash:" in row["cells"][7]), None), "the restart's cause on its row")
    assert "resumed the run" in restart["cells"][7]
    until(chrome, lambda: rows(chrome, "events"), "the run's Events")
    assert "Progressing" in text(chrome, "#conditions")
    trace_id = runs.get("review")["status"]["traceID"]
    assert chrome.find_element(By.ID, "trace").get_attribute("href") == f"http://127.0.0.1:16686/trace/{trace_id}"
    screenshot(chrome, "run-browser-run.png", 900)
    # `kubectl durablerun timeline` draws the same model: the same cause on the same restart.
    drawn = subprocess.run([sys.executable, "-m", "durablerun.kubectl", "--kubeconfig", str(testbed.kubeconfig),
                            "-n", ns, "timeline", "review", "--credentials-from-secret", "-o", "json"],
                           env={**testbed.env(), "KUBECTL": str(binaries.kubectl())}, capture_output=True, text=True,
                           timeout=120, check=False)
    assert drawn.returncode == 0, drawn.stderr
    assert [e["causes"] for e in json.loads(drawn.stdout)["entries"] if e["kind"] == "restart"] == [["Crash"]]

    # Approve from the page: the awaited event's form, a confirmation, and the run resumes to Succeeded.
    form = chrome.find_element(By.ID, "event-form")
    assert form.find_element(By.NAME, "event").get_attribute("value") == "review"
    payload = form.find_element(By.NAME, "payload")
    payload.clear()
    payload.send_keys('{"approved": true, "by": "dana"}')
    chrome.find_element(By.ID, "send-event").click()
    assert "Events are write-once" in confirm(chrome)
    until(chrome, lambda: "event 'review' sent" in text(chrome, "#result"), "the plugin's answer")
    until(chrome, lambda: text(chrome, "#phase") == "Succeeded", "the run Succeeded", timeout=120)
    assert runs.get("review")["spec"]["events"]["review"] == {"approved": True, "by": "dana"}
    assert '"by": "dana"' in text(chrome, "#output")
    assert runs.executions("flaky") == 2  # the crash and the restart
    assert runs.executions("prepare") == 1  # replayed from the journal, not run again
    # The crashed attempt's logs, from the run's store (its pod is gone): the runner's own lines, kept by the
    # pod's shipper from outside the runner.
    until(chrome, lambda: chrome.find_element(By.CSS_SELECTOR, "#log-attempts [data-attempt='1']").click() or True,
          "attempt 1's logs listed")
    until(chrome, lambda: "lease acquired" in text(chrome, "#logs"), "attempt 1's stored logs")
    assert text(chrome, "#logs-summary").startswith("attempt 1: ")
    # The attempt that took the event in is drawn as a resume, not as a second red crash beside the real one.
    until(chrome, lambda: "resume" in {row["data"]["kind"] for row in rows(chrome, "timeline")} or None,
          "the resume after the wait on the timeline", timeout=60)
    new_attempts = [(row["data"]["kind"], row["cells"][7]) for row in rows(chrome, "timeline")
                    if row["data"]["kind"] in ("restart", "resume")]
    assert [kind for kind, _ in new_attempts] == ["restart", "resume"], new_attempts
    assert "after its wait for event 'review'" in new_attempts[1][1], new_attempts
    # Read again if the page redraws the timeline between finding a bar and asking its colour.
    colour = until(chrome, lambda: {kind: chrome.find_element(By.CSS_SELECTOR, f"#timeline tr.kind-{kind} .bar")
                                    .value_of_css_property("background-color") for kind in ("restart", "resume")},
                   "the timeline's bars")
    assert colour["restart"] == "rgba(207, 34, 46, 1)", colour  # --bad: the crash
    assert colour["resume"] != colour["restart"], colour
    # A finished run is offered nothing the operator would refuse or ignore: no event, suspend, abort or retry.
    until(chrome, lambda: not chrome.find_element(By.ID, "event-form").is_displayed(), "no event form once done")
    assert offered(chrome) == []

    # Fork from a step: a new run with this one's journal up to the step, which executes it on.
    from_step(chrome, "publish", "fork")
    assert 'before step "publish"' in answer(chrome, "review-fork")
    until(chrome, lambda: "forked from review before step 'publish'" in text(chrome, "#result"), "the fork's answer")
    forked = runs.wait_phase("review-fork", "Succeeded", "Failed", "Aborted", timeout=120)
    assert forked["status"]["phase"] == "Succeeded", forked["status"].get("message")
    assert (runs.executions("prepare"), runs.executions("publish")) == (1, 2)  # the fork ran publish, not prepare
    # Rerun the finished run itself from the step: its journal from there on dropped, the step run again.
    from_step(chrome, "publish", "rerun")
    assert "archived and dropped" in confirm(chrome)
    until(chrome, lambda: "rerun from step 'publish'" in text(chrome, "#result"), "the rerun's answer")
    procs.wait_for(lambda: runs.executions("publish") == 3, timeout=120, what="publish run again by the rerun")
    assert runs.wait_phase("review", "Succeeded", timeout=120)["status"]["phase"] == "Succeeded"
    assert runs.executions("prepare") == 1

    # Suspend and resume the other from its page, then abort it: the question says the Saga grace applies.
    chrome.get(f"{url}runs/{ns}/long")
    until(chrome, lambda: text(chrome, "#phase") == "Running", "the long run Running")
    chrome.find_element(By.CSS_SELECTOR, "[data-action=suspend]").click()
    assert "next step boundary" in confirm(chrome)
    until(chrome, lambda: text(chrome, "#phase") == "Suspended", "the run Suspended", timeout=120)
    assert runs.get("long")["spec"]["suspend"] is True
    until(chrome, lambda: offered(chrome) == ["resume", "abort"], "resume offered for a suspended run")
    chrome.find_element(By.CSS_SELECTOR, "[data-action=resume]").click()
    confirm(chrome)
    until(chrome, lambda: text(chrome, "#phase") == "Running", "the run Running again", timeout=120)
    assert runs.get("long")["spec"]["suspend"] is False
    chrome.find_element(By.CSS_SELECTOR, "[data-action=abort]").click()
    assert "abortGracePeriod" in confirm(chrome)
    until(chrome, lambda: "abort requested" in text(chrome, "#result"), "the abort's answer")
    until(chrome, lambda: text(chrome, "#phase") == "Aborted", "the run Aborted", timeout=120)
    assert runs.get("long")["status"]["phase"] == "Aborted"
    until(chrome, lambda: offered(chrome) == ["retry"], "only retry offered for an aborted run")
    # Retried from its journal: it runs on from where it was aborted.
    chrome.find_element(By.CSS_SELECTOR, "[data-action=retry]").click()
    assert "Finished steps are not executed again" in confirm(chrome)
    until(chrome, lambda: text(chrome, "#phase") == "Running", "the retried run Running", timeout=120)
    assert runs.executions("s1") == 1

    # Chromium and chromedriver listen on loopback only.
    addresses = chromium.listening(chromedriver.pids())
    assert addresses, "chromedriver listens somewhere"
    assert all(a.startswith(("127.0.0.1:", "::1:")) for a in addresses), addresses


def from_step(chrome: webdriver.Remote, step: str, how: str) -> None:
    """Click the timeline's button to rerun or fork from ``step`` (again if the timeline was redrawn under it)."""
    until(chrome, lambda: chrome.find_element(
        By.CSS_SELECTOR, f"#timeline [data-from-step='{step}'][data-how='{how}']").click() or True,
        f"{how} from step {step}")


def offered(chrome: webdriver.Remote) -> list[str]:
    """The actions the run's page offers (its buttons shown)."""
    return [b.get_attribute("data-action") for b in chrome.find_elements(By.CSS_SELECTOR, "[data-action]")
            if b.is_displayed()]


def request(url: str, *, data: bytes | None = None, headers: dict[str, str] | None = None) -> tuple[int, str]:
    req = urllib.request.Request(url, data=data, headers=headers or {}, method="POST" if data is not None else "GET")
    try:
        with urllib.request.urlopen(req, timeout=10) as response:
            return response.status, response.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode()


def test_only_this_servers_pages_may_act(runs: RunEnv, testbed: TestBed, start_ui: StartUI) -> None:
    runs.apply(runs.manifest("idle", "optest_flows:approval"))
    url = start_ui(testbed.kubeconfig, "-n", runs.namespace)
    action = f"{url}api/runs/{runs.namespace}/idle/suspend"
    status, body = request(action, data=b"{}")
    assert (status, "X-Durablerun-Token" in json.loads(body)["error"]) == (403, True), body
    page = request(f"{url}runs/{runs.namespace}/idle")[1]
    token = page.split('name="durablerun-token" content="')[1].split('"')[0]
    # Another site's name for 127.0.0.1 (DNS rebinding) gets nothing, token or not.
    assert request(action, data=b"{}", headers={"X-Durablerun-Token": token, "Host": "evil.example"})[0] == 421
    assert request(f"{url}api/runs", headers={"Host": "evil.example"})[0] == 421
    # Another site's page (another local port is one) reads nothing and holds no change feed open.
    for site in ("cross-site", "same-site"):
        assert request(f"{url}api/changes", headers={"Sec-Fetch-Site": site})[0] == 403
        assert request(f"{url}api/runs", headers={"Sec-Fetch-Site": site})[0] == 403
    assert runs.get("idle")["spec"]["suspend"] is False
    status, body = request(action, data=b"{}", headers={"X-Durablerun-Token": token})
    assert (status, runs.get("idle")["spec"]["suspend"]) == (200, True), body
    bad = request(f"{url}api/runs?phase=Sleeping")
    assert bad[0] == 400
    assert "phase: Sleeping is not a phase" in bad[1]


def feed(url: str) -> Iterator[int]:
    """The versions a change feed tells, as they come (its keepalives skipped); a read waits 30 s at most."""
    with urllib.request.urlopen(url, timeout=30) as response:
        assert response.headers["Content-Type"] == "text/event-stream"
        for line in response:
            if line.startswith(b"data: "):
                yield int(line[len(b"data: "):])


def test_the_change_feeds_tell_a_runs_page_every_change_and_the_list_only_what_it_shows(
        runs: RunEnv, testbed: TestBed, start_ui: StartUI) -> None:
    runs.apply(runs.manifest("fed", "optest_flows:approval"))  # no operator: only this test changes it
    url = start_ui(testbed.kubeconfig, "-n", runs.namespace)
    procs.wait_for(lambda: json.loads(request(f"{url}api/runs")[1])["total"] == 1, timeout=30,
                   what="the watch to see the run")
    listed, watched = feed(f"{url}api/changes"), feed(f"{url}api/changes?run={runs.namespace}/fed")
    list_version, run_version = next(listed), next(watched)  # told at once on connecting
    at = api.format_time(api.now())
    # A lease renewal: the run's page is told (its lease, its progress); the list shows nothing of it.
    runs.patch_status("fed", {"epoch": 1, "lease": {"holder": "fed-a1", "epoch": 1, "acquireTime": at,
                                                    "renewTime": at}})
    assert next(watched) > run_version
    runs.patch_status("fed", {"phase": api.Phase.RUNNING})
    assert next(listed) == list_version + 1  # the phase, and not the renewal before it
    assert request(f"{url}api/changes?run=fed")[0] == 400  # NAMESPACE/NAME


def test_a_run_waiting_on_its_budget_goes_on_with_one_click(operator: Operator, runs: RunEnv, testbed: TestBed,
                                                             start_ui: StartUI, chrome: webdriver.Remote) -> None:
    runs.apply(runs.manifest("asks", "optest_flows:steps", {"steps": 5, "sleep": 0.05, "usd": "0.10"},
                             policy={"askAt": {"costUSD": "0.25"}}))
    runs.wait_phase("asks", "Waiting", timeout=60)
    chrome.get(f"{start_ui(testbed.kubeconfig, '-n', runs.namespace)}runs/{runs.namespace}/asks")
    until(chrome, lambda: "raise policy.askAt.costUSD" in text(chrome, "#waiting"), "what the run waits for")
    assert "spent $0.30" in text(chrome, "#waiting")
    form = chrome.find_element(By.ID, "budget-form")
    form.find_element(By.NAME, "value").send_keys("0.35")
    chrome.find_element(By.ID, "raise-budget").click()
    assert "until policy.askAt.costUSD 0.35" in confirm(chrome)
    until(chrome, lambda: "budget set: policy.askAt.costUSD=0.35" in text(chrome, "#result"), "the plugin's answer")
    until(chrome, lambda: runs.executions("s3") == 1 and "spent $0.40" in text(chrome, "#waiting"),
          "one more step, then it asks again", timeout=90)
    chrome.find_element(By.ID, "lift-budget").click()
    assert "without asking again" in confirm(chrome)
    until(chrome, lambda: text(chrome, "#phase") == "Succeeded", "the run Succeeded", timeout=90)
    assert [runs.executions(f"s{i}") for i in range(5)] == [1] * 5


def shown_chunks(chrome: webdriver.Remote) -> list[list[str]]:
    """The stream panel's chunks as they are now: offset, standing and text of each."""
    return list(chrome.execute_script(
        "return [...document.querySelectorAll('#stream li')]"
        ".map(li => [li.dataset.offset, li.dataset.standing, li.textContent])"))


def test_a_runs_stream_is_listed_and_followed_live_with_superseded_output_marked(
        operator: Operator, runs: RunEnv, testbed: TestBed, start_ui: StartUI, chrome: webdriver.Remote) -> None:
    runs.apply(runs.manifest("teller", "optest_flows:reteller"))
    runs.wait_phase("teller", "Waiting", timeout=90)
    url = start_ui(testbed.kubeconfig, "-n", runs.namespace, "--credentials-from-secret")
    chrome.get(f"{url}runs/{runs.namespace}/teller")
    # The step's first try failed and was retried: what it wrote is there, marked as not counting.
    until(chrome, lambda: shown_chunks(chrome) == [["0", "superseded", "try 1\n"], ["1", "final", "try 2\n"]],
          "the stream's two chunks, the failed try's superseded")
    assert text(chrome, "#stream-names") == "story"
    assert "following" in text(chrome, "#stream-summary")
    superseded = chrome.find_element(By.CSS_SELECTOR, "#stream li[data-standing=superseded]")
    assert "line-through" in superseded.value_of_css_property("text-decoration")

    # Live: what the next attempt writes appears without a reload, and the panel stops following at the end.
    testbed.kubectl("patch", "dr", "teller", "-n", runs.namespace, "--type=merge",
                    "-p", json.dumps({"spec": {"events": {"go": True}}}))
    until(chrome, lambda: shown_chunks(chrome)[2:] == [["2", "final", "after the event\n"]],
          "the chunk written after the event", timeout=90)
    until(chrome, lambda: "finished" in text(chrome, "#stream-summary"), "the stream finished with its run",
          timeout=90)
    # The stream finishes once the runner's outcome is in the store, which is before the operator sets the phase.
    runs.wait_phase("teller", "Succeeded", timeout=60)
    assert len(shown_chunks(chrome)) == 3


def test_a_supervisors_children_are_a_tree_of_links_to_their_own_pages(
        operator: Operator, runs: RunEnv, testbed: TestBed, start_ui: StartUI, chrome: webdriver.Remote) -> None:
    runs.apply(runs.manifest("sup", "optest_children:supervisor", {"children": 2, "sleep": 0.1}))
    assert runs.wait_phase("sup", "Succeeded", "Failed", timeout=180)["status"]["phase"] == "Succeeded"
    url = start_ui(testbed.kubeconfig, "-n", runs.namespace)
    chrome.get(f"{url}runs/{runs.namespace}/sup")

    def tree() -> list[str]:
        return [a.text for a in chrome.find_elements(By.CSS_SELECTOR, "#children li a")]

    until(chrome, lambda: sorted(tree()) == ["sup-w0", "sup-w1"], "the children in the tree")
    assert text(chrome, "#children").count("Succeeded") == 2
    open_link(chrome, "sup-w1")
    until(chrome, lambda: text(chrome, "#title") == f"{runs.namespace} / sup-w1", "the child's own page")
    until(chrome, lambda: '"square": 1' in text(chrome, "#output"), "the child's result")
