"""Reading a Queued run's position from Kueue's visibility API answers (kubeapi.queue_position): which Workload
is the run's, paging past Kueue's 1,000 a request, and an API that does not answer. The real API on the test
bed: tests/kueue/test_queue_position.py."""

from __future__ import annotations

import json
import subprocess
from typing import Any

from durablerun import api
from durablerun._private.tools import kubeapi


def run(phase: str = "Queued", queue: str | None = "lq") -> dict[str, Any]:
    labels = {api.LABEL_QUEUE_NAME: queue} if queue else {}
    return {"metadata": {"name": "r", "namespace": "ns", "uid": "u-r", "labels": labels},
            "status": {"phase": phase}}


def pending(uid: str, local: int, cluster: int) -> dict[str, Any]:
    return {"metadata": {"name": f"durablerun-x-{uid}", "ownerReferences": [{"kind": api.KIND, "uid": uid}]},
            "positionInLocalQueue": local, "positionInClusterQueue": cluster}


class Answers:
    """Stands in for the user's kubectl: each ``get --raw`` gets the next answer; the paths are kept."""

    def __init__(self, *answers: tuple[int, str]) -> None:
        self.answers, self.paths = list(answers), list[str]()

    def __call__(self, *argv: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        assert argv[:2] == ("get", "--raw")
        assert not check
        self.paths.append(argv[2])
        code, text = self.answers.pop(0)
        return subprocess.CompletedProcess(argv, code, text if code == 0 else "", "" if code == 0 else text)


def page(*items: dict[str, Any]) -> tuple[int, str]:
    return 0, json.dumps({"kind": "PendingWorkloadsSummary", "items": list(items)})


def position(kube: Answers, body: dict[str, Any]) -> kubeapi.QueuePosition | None:
    return kubeapi.queue_position(kube, body)


def test_the_runs_own_workload_gives_the_position() -> None:
    kube = Answers(page(pending("u-other", 0, 0), pending("u-r", 1, 3)))
    assert position(kube, run()) == kubeapi.QueuePosition("lq", local=1, cluster=3)
    assert kube.paths == [f"{kubeapi.VISIBILITY_API}/namespaces/ns/localqueues/lq/pendingworkloads"
                          "?limit=1000&offset=0"]
    assert position(Answers(page(pending("u-r", 0, 0))), run()).describe() == (
        "lq, position 0 in the LocalQueue and 0 in its ClusterQueue (the pending Workloads ahead of this run's)")


def test_a_position_past_the_first_thousand_is_found_on_the_next_page() -> None:
    full = page(*(pending(f"u{i}", i, i) for i in range(kubeapi.VISIBILITY_LIMIT)))
    kube = Answers(full, page(pending("u-r", 1000, 1002)))
    assert position(kube, run()) == kubeapi.QueuePosition("lq", local=1000, cluster=1002)
    assert kube.paths[1].endswith("offset=1000")


def test_no_position_says_why_and_is_not_an_error() -> None:
    absent = position(Answers(page(pending("u-other", 0, 0))), run())
    assert absent is not None
    assert absent.local is None
    assert "Kueue lists no pending Workload of this run" in absent.describe()
    refused = position(Answers((1, "Error from server (NotFound): the server could not find the requested "
                                   "resource")), run())
    assert refused is not None
    assert refused.describe() == ("lq, position unknown: Kueue's visibility API did not answer: Error from server "
                                  "(NotFound): the server could not find the requested resource")


def test_only_a_queued_run_in_a_queue_is_looked_up() -> None:
    kube = Answers()
    assert position(kube, run(phase="Running")) is None
    assert position(kube, run(queue=None)) is None
    assert kube.paths == []
