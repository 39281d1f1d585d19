"""The package as pip sees it: `python -m build` works, the metadata is what users rely on, and the
SDK installs and runs alone, without boto3 or the kubernetes client (they are the `s3` and `pod` extras).

The lean environment is a fresh venv holding the built wheel and exactly the distributions its
unconditional requirements need (linked from this venv, so no index is asked).
"""

from __future__ import annotations

import email.parser
import importlib.metadata
import json
import shutil
import subprocess
import sys
import tarfile
import venv
import zipfile
from collections.abc import Iterator
from email.message import Message
from pathlib import Path

import pytest
import yaml
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

import durablerun
from durablerun import api
from tests.helpers.clis import CHART

from .helpers import REPO

# What an sdist is built from (the same list the images' .dockerignore files let through).
SOURCES = ["pyproject.toml", "README.md", "LICENSE", "runner", "operator"]


@pytest.fixture(scope="module")
def dist(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """`python -m build` (sdist, then the wheel from the sdist) of a copy of the sources."""
    root = tmp_path_factory.mktemp("package")
    source = root / "src"
    for name in SOURCES:
        if (REPO / name).is_dir():
            shutil.copytree(REPO / name, source / name, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
        else:
            source.mkdir(exist_ok=True)
            shutil.copy2(REPO / name, source / name)
    # No isolation: the build backend (setuptools >= 77) comes from this venv, so no index is asked.
    result = subprocess.run([sys.executable, "-m", "build", "--no-isolation", "--outdir", str(root / "dist"),
                             str(source)], capture_output=True, text=True, timeout=300, check=False)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    return root / "dist"


def wheel_of(dist: Path) -> Path:
    (wheel,) = dist.glob("durable_run-*.whl")
    return wheel


def metadata_of(wheel: Path) -> Message:
    with zipfile.ZipFile(wheel) as archive:
        name = next(n for n in archive.namelist() if n.endswith(".dist-info/METADATA"))
        return email.parser.Parser().parsestr(archive.read(name).decode())


def test_the_wheel_and_sdist_carry_the_metadata_users_rely_on(dist: Path) -> None:
    wheel = wheel_of(dist)
    meta = metadata_of(wheel)
    assert meta["Name"] == "durable-run"
    assert meta["Version"] == durablerun.__version__
    assert meta["License-Expression"] == "Apache-2.0"
    assert meta.get_all("License-File") == ["LICENSE"]
    urls = dict(url.split(", ", 1) for url in meta.get_all("Project-URL") or [])
    assert {"Homepage", "Documentation", "Source", "Issues"} <= urls.keys(), urls
    assert "Programming Language :: Python :: 3.11" in (meta.get_all("Classifier") or [])
    # The SDK needs pydantic only; S3 and the pod runner are extras; the repository's tools are not.
    requires = [Requirement(r) for r in meta.get_all("Requires-Dist") or []]
    base = {r.name for r in requires if r.marker is None}
    assert base == {"pydantic"}, base
    by_extra = {extra: {r.name for r in requires if r.marker and r.marker.evaluate({"extra": extra})}
                for extra in meta.get_all("Provides-Extra") or []}
    assert by_extra == {"s3": {"boto3"}, "pod": {"kubernetes"},
                        "operator": {"aiohttp", "kopf", "kubernetes", "prometheus-client", "tzdata"},
                        "otel": {"opentelemetry-sdk", "opentelemetry-exporter-otlp-proto-http"},
                        "pydantic-ai": {"pydantic-ai-slim"}, "langgraph": {"langgraph"}, "quotas": {"redis"}},\
        by_extra
    with zipfile.ZipFile(wheel) as archive:
        names = archive.namelist()
        entry_points = archive.read(next(n for n in names if n.endswith("entry_points.txt"))).decode()
    assert "durablerun = durablerun.cli:main" in entry_points
    assert "kubectl-durablerun = durablerun.kubectl:main" in entry_points
    assert any(n.endswith(".dist-info/licenses/LICENSE") for n in names), names
    assert "durablerun/py.typed" in names
    # The run browser's pages ship in the package: it fetches nothing from elsewhere (docs/web.md).
    assets = {f"durablerun/_private/tools/browser_assets/{f}" for f in ("index.html", "run.html", "ui.css", "ui.js")}
    assert assets <= set(names), names
    (sdist,) = dist.glob("durable_run-*.tar.gz")
    with tarfile.open(sdist) as archive:
        members = {m.name.split("/", 1)[1] for m in archive.getmembers() if "/" in m.name}
    assert {"LICENSE", "pyproject.toml", "README.md", "runner/durablerun/_version.py"} <= members


def test_the_version_has_one_source() -> None:
    """runner/durablerun/_version.py; the chart (which Helm needs literally) is held to it here."""
    chart = yaml.safe_load((CHART / "Chart.yaml").read_text())
    assert chart["version"] == chart["appVersion"] == durablerun.__version__, (
        "bump charts/durable-run/Chart.yaml's version and appVersion with runner/durablerun/_version.py")
    assert importlib.metadata.version("durable-run") == durablerun.__version__


def closure(requirements: list[str]) -> Iterator[importlib.metadata.Distribution]:
    """The installed distributions ``requirements`` need, transitively, with no extras."""
    seen: set[str] = set()
    todo = [Requirement(r) for r in requirements]
    while todo:
        requirement = todo.pop()
        if requirement.marker and not requirement.marker.evaluate({"extra": ""}):
            continue
        name = canonicalize_name(requirement.name)
        if name in seen:
            continue
        seen.add(name)
        found = importlib.metadata.distribution(name)
        yield found
        todo.extend(Requirement(r) for r in found.requires or [])


@pytest.fixture(scope="module")
def lean(dist: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A fresh venv with the wheel and its base requirements only: its bin directory."""
    root = tmp_path_factory.mktemp("lean")
    venv.EnvBuilder(with_pip=False).create(root / "venv")
    python = root / "venv" / "bin" / "python"
    wheel = wheel_of(dist)
    installed = subprocess.run([sys.executable, "-m", "pip", "--python", str(python), "install", "--no-deps",
                                "--no-index", "--quiet", str(wheel)], capture_output=True, text=True,
                               timeout=120, check=False)
    assert installed.returncode == 0, installed.stderr
    base = [str(r) for r in map(Requirement, metadata_of(wheel).get_all("Requires-Dist") or []) if r.marker is None]
    linked = root / "base"
    linked.mkdir()
    for found in closure(base):
        site = Path(str(found.locate_file("")))
        for top in {Path(str(f)).parts[0] for f in found.files or [] if not str(f).startswith("..")}:
            if not (linked / top).exists():
                (linked / top).symlink_to(site / top)
    purelib = subprocess.run([str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                             capture_output=True, text=True, check=True).stdout.strip()
    (Path(purelib) / "base-requirements.pth").write_text(f"{linked}\n")
    return root / "venv" / "bin"


WORKFLOW = '''
from durablerun import DurableContext

def double(n):
    return n * 2

async def twice(ctx: DurableContext, input: dict) -> dict:
    first = await ctx.step("first", double, input["n"])
    second = await ctx.step("second", double, first)
    return {"result": second}
'''


def run(bin_dir: Path, *argv: str, cwd: Path, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(bin_dir / argv[0]), *argv[1:]], cwd=cwd, capture_output=True, text=True,
                          timeout=120, check=False,
                          env={"PATH": f"{bin_dir}:/usr/bin:/bin", "HOME": str(cwd), **(env or {})})


def test_the_sdk_installs_and_runs_without_boto3_or_the_kubernetes_client(lean: Path, tmp_path: Path) -> None:
    probe = run(lean, "python", "-c", (
        "import importlib.util, json, sys, durablerun, durablerun.engine, durablerun.stores, durablerun.testing\n"
        "print(json.dumps({'installed': [m for m in ('boto3', 'botocore', 'kubernetes', 'kopf')"
        " if importlib.util.find_spec(m)], 'version': durablerun.__version__}))"), cwd=tmp_path)
    assert probe.returncode == 0, probe.stderr
    assert json.loads(probe.stdout) == {"installed": [], "version": durablerun.__version__}

    version = run(lean, "durablerun", "--version", cwd=tmp_path)
    assert (version.returncode, version.stdout.strip()) == (0, f"durablerun {durablerun.__version__}")

    (tmp_path / "lean_flow.py").write_text(WORKFLOW)
    args = ["--run-id", "r1", "--store", f"file://{tmp_path}/runs"]
    done = run(lean, "durablerun", "run", "lean_flow:twice", *args, "--input", '{"n": 3}', "--quiet",
               cwd=tmp_path, env={"PYTHONPATH": str(tmp_path)})
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout) == {"result": 12}
    inspected = run(lean, "durablerun", "inspect", *args, "--json", cwd=tmp_path)
    assert [r["name"] for r in json.loads(inspected.stdout)["records"] if r["kind"] == "step"] == ["first", "second"]


def test_a_feature_of_a_missing_extra_names_the_extra(lean: Path, tmp_path: Path) -> None:
    s3 = run(lean, "durablerun", "inspect", "--run-id", "r1", "--store", "s3://bucket/runs", cwd=tmp_path)
    assert s3.returncode == 2, s3.stderr
    assert "needs boto3" in s3.stderr
    assert "pip install 'durable-run[s3]'" in s3.stderr

    env = {api.Env.NAMESPACE: "ns", api.Env.NAME: "run", api.Env.UID: "u", api.Env.EPOCH: "1",
           api.Env.POD_NAME: "run-a1", api.Env.TERMINATION_MESSAGE_PATH: str(tmp_path / "termination")}
    pod = run(lean, "durablerun", "pod", cwd=tmp_path, env=env)
    assert pod.returncode == 2, pod.stderr
    assert "pip install 'durable-run[pod]'" in pod.stderr


def test_importing_the_sdk_loads_neither_boto3_nor_the_kubernetes_client() -> None:
    """Where the extras are installed (this venv), importing the SDK's public modules loads none of them
    (nor an agent framework or an LLM client)."""
    probe = subprocess.run([sys.executable, "-c", (
        "import json, sys, durablerun, durablerun.engine, durablerun.stores, durablerun.testing, durablerun.kubectl\n"
        "import durablerun.llm, durablerun.integrations\n"
        "print(json.dumps(sorted({m.split('.')[0] for m in sys.modules} & {'boto3', 'botocore', 'kubernetes',"
        " 'pydantic_ai', 'langgraph', 'langchain_core', 'openai', 'anthropic'})))")],
        capture_output=True, text=True, timeout=60, check=False)
    assert probe.returncode == 0, probe.stderr
    assert json.loads(probe.stdout) == []
