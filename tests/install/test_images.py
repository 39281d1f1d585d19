"""The Dockerfiles, read as text: pinned base, non-root, the right extras, and in step with the chart.

tests/realnode builds these Dockerfiles unchanged (hack/build-images.sh) and
runs the images on a real kubelet; what is checked here is what a build does
not show: the published base, and that the text stays in step with the chart.
"""

from __future__ import annotations

import re
import sys
import tomllib

import pytest
import yaml

import durablerun
from durablerun_operator.config import Settings
from tests.helpers.clis import CHART

from .helpers import REPO

IMAGES = REPO / "deploy" / "images"


def instructions(name: str) -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) of a Dockerfile, continuation lines joined, comments dropped."""
    text = re.sub(r"\\\n\s*", " ", (IMAGES / name).read_text())
    pairs = []
    for line in text.splitlines():
        line = line.strip()
        if line and not line.startswith("#"):
            keyword, _, rest = line.partition(" ")
            pairs.append((keyword.upper(), rest.strip()))
    return pairs


def final_stage(name: str) -> list[tuple[str, str]]:
    steps = instructions(name)
    last_from = max(i for i, (keyword, _) in enumerate(steps) if keyword == "FROM")
    return steps[last_from:]


@pytest.mark.parametrize("name", ["operator.Dockerfile", "runner.Dockerfile"])
def test_image_is_pinned_small_and_non_root(name: str) -> None:
    steps = instructions(name)
    base = next(rest for keyword, rest in steps if keyword == "ARG" and rest.startswith("PYTHON_IMAGE="))
    image = base.split("=", 1)[1]
    # An exact patch release of the Python the project tests with, on a named Debian release.
    minor = f"{sys.version_info.major}.{sys.version_info.minor}"
    assert re.fullmatch(rf"python:{re.escape(minor)}\.\d+-slim-(bookworm|trixie)", image), image
    requires = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["requires-python"]
    assert requires == f">={minor}", "the images' Python and requires-python moved apart"
    final = final_stage(name)
    assert ("USER", "65532:65532") in final
    assert all(keyword != "RUN" for keyword, _ in final), "the final stage only copies the built venv"
    assert (IMAGES / f"{name}.dockerignore").exists()


def test_operator_image_installs_the_operator_and_runs_what_the_chart_runs() -> None:
    steps = instructions("operator.Dockerfile")
    assert any(k == "RUN" and '".[operator,otel,quotas,s3]"' in rest and "--constraint hack/constraints.txt" in rest
               for k, rest in steps)
    entrypoint = next(rest for k, rest in final_stage("operator.Dockerfile") if k == "ENTRYPOINT")
    deployment = (CHART / "templates" / "deployment.yaml").read_text()
    command = re.search(r"command: (\[.*\])", deployment)
    assert command
    assert yaml.safe_load(entrypoint) == yaml.safe_load(command.group(1)) == ["python", "-m", "durablerun_operator"]


def test_runner_image_installs_the_sdk_with_s3_the_pod_runner_tracing_and_shared_quotas() -> None:
    runs = [rest for k, rest in instructions("runner.Dockerfile") if k == "RUN"]
    install = next(rest for rest in runs if "pip install" in rest)
    assert install.endswith(' ".[s3,pod,otel,quotas]"'), (
        "the runner installs the S3 store, `durablerun pod`, OpenTelemetry and the Redis client of shared quotas "
        f"(both off until configured): {install}")
    assert "operator" not in install


def test_chart_image_defaults_match_the_project() -> None:
    chart = yaml.safe_load((CHART / "Chart.yaml").read_text())
    values = yaml.safe_load((CHART / "values.yaml").read_text())
    assert chart["appVersion"] == durablerun.__version__
    runner = values["runner"]["image"]
    assert f"{runner['repository']}:{chart['appVersion']}" == Settings().runner_image, (
        "the chart's default runner image and the operator's own default differ")
