"""Retrying a Failed or Aborted run from its journal with the durablerun.dev/retry annotation."""

from __future__ import annotations

from typing import Any

import pytest

from durablerun import api
from durablerun_testbed import procs
from tests.helpers.runs import Operator, RunEnv

pytestmark = pytest.mark.testbed
OPERATOR_PER_MODULE = True  # the tests asking for `operator` share one, each in its own namespace (conftest.py)


def annotate(runs: RunEnv, name: str, *pairs: str) -> None:
    runs.testbed.kubectl("annotate", "dr", name, "-n", runs.namespace, "--overwrite", *pairs)


def retried(runs: RunEnv, name: str, value: str, timeout: float = 90) -> dict[str, Any]:
    """The run once the retry ``value`` was acted on and the run finished again."""
    def done() -> dict[str, Any] | None:
        run = runs.get(name)
        status = run.get("status", {})
        return run if status.get("retry") == value and status.get("phase") in ("Succeeded", "Failed",
                                                                                 "Aborted") else None
    return procs.wait_for(done, timeout=timeout, what=f"{name} to finish after retry {value!r}")


def test_retry_of_a_failed_run_runs_the_failed_step_again_and_nothing_before_it(
        operator: Operator, runs: RunEnv) -> None:
    runs.apply(runs.manifest("fragile", "optest_flows:fragile"))
    run = runs.wait_phase("fragile", "Failed", timeout=60)
    assert "the dependency is down" in run["status"]["message"]
    assert (runs.executions("prepare"), runs.executions("fragile"), runs.executions("finish")) == (1, 1, 0)

    (runs.ledger_dir / "fixed").write_text("the dependency is back\n")
    annotate(runs, "fragile", f"{api.ANNOTATION_RETRY}=1")
    run = retried(runs, "fragile", "1")
    assert run["status"]["phase"] == "Succeeded", run["status"].get("message")
    assert run["status"]["retry"] == "1"
    assert run["status"]["attempt"] == 2
    # The journal replayed: the completed step was not executed again, the failed one was.
    assert (runs.executions("prepare"), runs.executions("fragile"), runs.executions("finish")) == (1, 2, 1)
    described = runs.testbed.kubectl("describe", "dr", "fragile", "-n", runs.namespace).stdout
    assert "Retrying" in described
    assert [e["reason"] for e in runs.events("fragile")].count("Retrying") == 1


def test_retry_gives_a_retry_limit_exceeded_run_a_new_restart_budget(operator: Operator, runs: RunEnv) -> None:
    runs.apply(runs.manifest("crashy", "optest_flows:fragile", {"crash": True}, policy={"maxRestarts": 1}))
    run = runs.wait_phase("crashy", "Aborted", timeout=90)
    assert run["status"]["abortReason"] == "RetryLimitExceeded"
    assert run["status"]["restarts"] == 2

    (runs.ledger_dir / "fixed").write_text("fixed\n")
    annotate(runs, "crashy", f"{api.ANNOTATION_RETRY}=after-the-fix")
    run = retried(runs, "crashy", "after-the-fix")
    assert run["status"]["phase"] == "Succeeded", run["status"].get("message")
    assert run["status"]["restarts"] == 0
    assert runs.executions("prepare") == 1
    assert runs.executions("finish") == 1


def test_a_user_abort_is_retried_only_without_the_abort_annotation(operator: Operator, runs: RunEnv) -> None:
    runs.apply(runs.manifest("stopped", "optest_flows:approval"))
    runs.wait_phase("stopped", "Waiting", timeout=60)
    annotate(runs, "stopped", f"{api.ANNOTATION_ABORT}=not now")
    assert runs.wait_phase("stopped", "Aborted", timeout=60)["status"]["abortReason"] == "UserRequested"

    # The abort request still stands: the retry is refused, with the command that does both.
    annotate(runs, "stopped", f"{api.ANNOTATION_RETRY}=1")
    refused = procs.wait_for(lambda: [e for e in runs.events("stopped") if e["reason"] == "RetryRefused"],
                             timeout=30, what="the RetryRefused Event")
    assert f"{api.ANNOTATION_ABORT}-" in refused[0]["message"]
    assert runs.get("stopped")["status"]["phase"] == "Aborted"

    annotate(runs, "stopped", f"{api.ANNOTATION_ABORT}-", f"{api.ANNOTATION_RETRY}=2")
    procs.wait_for(lambda: runs.get("stopped")["status"].get("retry") == "2", timeout=30, what="retry 2")
    runs.wait_phase("stopped", "Waiting", timeout=60)
    assert runs.executions("draft") == 1
