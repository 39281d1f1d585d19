"""The pydantic-ai research agent (examples/pydantic_ai_research) in a runner pod on the real node.

Its image is built the way a user builds one (`hack/build-images.sh workflow DIR` with DIR's
requirements.txt pip-installed), and it talks to the scripted model server on the node's bridge
address, the only address a pod reaches. The agent SIGKILLed mid-conversation resumes without asking
for a finished turn again; a runaway agent is stopped by its cost ceiling with no code of its author's.
"""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from typing import Any

import pytest

from durablerun_testbed import binaries
from durablerun_testbed.llmserver import LLMServer, load_script
from durablerun_testbed.realnode import build_workflow_image
from durablerun_testbed.testbed import TestBed
from tests.realnode.helpers import RealRuns

EXAMPLE = binaries.REPO_ROOT / "examples" / "pydantic_ai_research"


@pytest.fixture(scope="session")
def agent_image(real_bed: TestBed, tmp_path_factory: pytest.TempPathFactory) -> str:
    """examples/pydantic_ai_research in an image FROM the runner image, with pydantic-ai pip-installed."""
    stage = tmp_path_factory.mktemp("agent-image") / "agent-image"
    shutil.copytree(EXAMPLE, stage / "pydantic_ai_research", ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy(binaries.REPO_ROOT / "hack" / "constraints.txt", stage / "constraints.txt")
    (stage / "requirements.txt").write_text("-c constraints.txt\npydantic-ai-slim[openai]\n")
    archive, ref = build_workflow_image(stage)
    assert real_bed.real_node
    real_bed.real_node.import_image(archive)
    return ref


@pytest.fixture
def model_server(real_bed: TestBed, request: pytest.FixtureRequest) -> Iterator[LLMServer]:
    assert real_bed.real_node
    turns, repeat = load_script(str(EXAMPLE / request.param))
    with LLMServer(turns, repeat_last=repeat, host=real_bed.real_node.network.gateway) as server:
        yield server


def agent_run(runs: RealRuns, name: str, image: str, server: LLMServer, **policy: Any) -> dict[str, Any]:
    manifest = runs.manifest(name, "pydantic_ai_research:research", {"question": "durable execution"}, policy=policy)
    runner = manifest["spec"]["template"]["spec"]["containers"][0]
    runner["image"] = image
    runner["env"] = [{"name": "OPENAI_BASE_URL", "value": server.openai_base_url},
                     {"name": "OPENAI_API_KEY", "value": "local"}]
    return manifest


@pytest.mark.parametrize("model_server", ["script.json"], indirect=True)
def test_a_killed_agent_resumes_without_asking_for_a_finished_turn_again(
        real_bed: TestBed, real_runs: RealRuns, agent_image: str, model_server: LLMServer) -> None:
    assert real_bed.real_node
    model_server.hold(1)  # the second model turn stays in flight until released
    real_runs.apply(agent_run(real_runs, "agent", agent_image, model_server))
    model_server.wait_for(lambda requests: any(r["turn"] == 1 for r in requests), timeout=180,
                          what="the agent's second model request")
    pod = real_runs.status("agent")["pod"]
    real_bed.real_node.kill_container(real_runs.running_container_id(pod))
    model_server.release()
    status = real_runs.wait_phase("agent", "Succeeded", "Failed", "Aborted", timeout=180)
    assert status["phase"] == "Succeeded", status
    assert status["restarts"] == 1
    # Turn 0 was journaled before the kill: never requested again. Turn 1 was in flight: asked twice.
    assert model_server.turns() == [0, 1, 1, 2], model_server.requests
    assert float(status["cost"]["usd"]) > 0, status  # charged from the usage the model reported


@pytest.mark.parametrize("model_server", ["runaway.json"], indirect=True)
def test_a_runaway_agent_is_stopped_by_its_cost_ceiling(
        real_runs: RealRuns, agent_image: str, model_server: LLMServer) -> None:
    real_runs.apply(agent_run(real_runs, "runaway", agent_image, model_server, costCeilingUSD="0.05"))
    status = real_runs.wait_phase("runaway", "Succeeded", "Failed", "Aborted", timeout=180)
    assert (status["phase"], status.get("abortReason")) == ("Aborted", "BudgetExhausted"), status
    assert float(status["cost"]["usd"]) >= 0.05, status
    assert len(model_server.requests) < 20, "the ceiling did not stop the agent"
