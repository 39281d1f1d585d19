"""The runner pod carries the stop grace its policy asks for: the steps in flight's time to finish when the
runner is stopped (SIGTERM), and a pod grace period that holds it (docs/operator.md, "Stopping at a step
boundary")."""

from __future__ import annotations

from typing import Any

import pytest

from durablerun import api
from durablerun_operator import builders
from durablerun_operator.config import Settings
from tests.operator.run_bodies import body

#: (policy.stopGracePeriod, the template's terminationGracePeriodSeconds) -> (the pod's, the runner's stop grace)
CASES = {
    "defaults: 30 s, 20 s for the steps": (None, None, 30, "20"),
    "a longer template grace: longer for the steps": (None, 120, 120, "110"),
    "a short template grace: the default, a suspension is not bound by it": (None, 5, 5, "20"),
    "stopGracePeriod raises the pod's grace": ("5m", None, 310, "300"),
    "a longer template grace is kept": ("1m", 600, 600, "60"),
    "0s: steps cancelled at once": ("0s", None, 30, "0"),
}


@pytest.mark.parametrize("case", list(CASES))
def test_the_pod_grace_holds_the_stop_grace_and_the_runner_is_told_it(case: str) -> None:
    stop, template_grace, pod_grace, runner_grace = CASES[case]
    pod_spec: dict[str, Any] = {"containers": [{"name": "runner", "image": "localhost/wf:1"}]}
    if template_grace is not None:
        pod_spec["terminationGracePeriodSeconds"] = template_grace
    spec: dict[str, Any] = {"template": {"spec": pod_spec}}
    if stop is not None:
        spec["policy"] = {"stopGracePeriod": stop}
    pod = builders.runner_pod(body({"phase": "Pending"}, spec=spec), 1, Settings())
    env = {e["name"]: e.get("value") for e in pod["spec"]["containers"][0]["env"]}
    assert (pod["spec"]["terminationGracePeriodSeconds"], env[api.Env.STOP_GRACE_SECONDS]) == (pod_grace,
                                                                                                 runner_grace)
