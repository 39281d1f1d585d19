#!/usr/bin/env python3
"""`make release`: everything a release publishes, built into dist/ (or --dist DIR).

  dist/durable_run-<v>-py3-none-any.whl, durable_run-<v>.tar.gz   `python -m build` of the sources
  dist/images/{operator,runner}-<v>.oci.tar                     the images (hack/build-images.sh), OCI
                                                                archives `skopeo copy` / `crane push` can push
  dist/durable-run-<v>.tgz                                      the chart (`helm package`), its values pinning
                                                                both images by digest
  dist/SHA256SUMS

An image's digest is its manifest's, read from the archive's index.json: the digest the registry reports
once the archive is pushed unchanged, so the packaged chart runs exactly the images built here.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parent.parent
CHART = REPO / "charts" / "durable-run"
# What an sdist is built from (as the images' .dockerignore files let through).
SOURCES = ["pyproject.toml", "README.md", "LICENSE", "runner", "operator"]
IMAGES = ("operator", "runner")
# Where each image's digest goes in values.yaml: (the key's indentation, the image's values path).
DIGEST_KEYS = {"operator": ("  ", "image.digest"), "runner": ("    ", "runner.image.digest")}

sys.path.insert(0, str(REPO / "hack"))
from durablerun_testbed import binaries  # noqa: E402


def python_packages(dist: Path, scratch: Path) -> None:
    """Wheel and sdist, built from a copy of the sources (the build leaves nothing in the checkout)."""
    source = scratch / "src"
    source.mkdir()
    for name in SOURCES:
        if (REPO / name).is_dir():
            shutil.copytree(REPO / name, source / name, ignore=shutil.ignore_patterns("__pycache__", "*.pyc",
                                                                                       "*.egg-info"))
        else:
            shutil.copy2(REPO / name, source / name)
    # No isolation: the build backend comes from this venv (pinned in hack/constraints.txt).
    subprocess.run([sys.executable, "-m", "build", "--no-isolation", "--outdir", str(dist), str(source)],
                   check=True, stdout=subprocess.DEVNULL)


def manifest_digest(archive: Path) -> str:
    """The digest of the one image manifest in an OCI archive."""
    with tarfile.open(archive) as tar:
        member = tar.extractfile("index.json")
        assert member is not None
        manifests = json.load(member)["manifests"]
    if len(manifests) != 1:
        raise ValueError(f"{archive} holds {len(manifests)} manifests, not one image")
    return str(manifests[0]["digest"])


def images(dist: Path, version: str) -> dict[str, tuple[str, str]]:
    """The images as OCI archives in dist/images; name -> (reference, digest)."""
    subprocess.run([str(REPO / "hack" / "build-images.sh"), *IMAGES], check=True)
    (dist / "images").mkdir()
    built = {}
    for name in IMAGES:
        archive, reference = (REPO / ".images" / f"{name}.current").read_text().split()
        target = dist / "images" / f"{name}-{version}.oci.tar"
        shutil.copyfile(archive, target)
        built[name] = (reference, manifest_digest(target))
    return built


def chart(dist: Path, scratch: Path, digests: dict[str, str]) -> Path:
    """The chart packaged, with values.yaml pinning each image by digest (comments and all else kept)."""
    copy = scratch / CHART.name
    shutil.copytree(CHART, copy)
    values = (copy / "values.yaml").read_text()
    for name, digest in digests.items():
        indent, path = DIGEST_KEYS[name]
        values, count = re.subn(rf'^{indent}digest: ""$', f'{indent}digest: "{digest}"', values, flags=re.M)
        if count != 1:
            raise ValueError(f"values.yaml: expected one empty {path} (indented {len(indent)}), found {count}")
    parsed = yaml.safe_load(values)
    landed = {"operator": parsed["image"]["digest"], "runner": parsed["runner"]["image"]["digest"]}
    if any(landed[name] != digest for name, digest in digests.items()):
        raise ValueError(f"values.yaml: the digests landed in the wrong keys: {landed}")
    (copy / "values.yaml").write_text(values)
    with tempfile.TemporaryDirectory(prefix="durablerun-helm-") as home:
        env = {**os.environ, "HELM_CACHE_HOME": f"{home}/cache", "HELM_CONFIG_HOME": f"{home}/config",
               "HELM_DATA_HOME": f"{home}/data"}
        subprocess.run([str(binaries.find("helm")), "package", str(copy), "--destination", str(dist)], env=env,
                       check=True, stdout=subprocess.DEVNULL)
    chart_yaml = yaml.safe_load((CHART / "Chart.yaml").read_text())
    return dist / f"{chart_yaml['name']}-{chart_yaml['version']}.tgz"


def checksums(dist: Path) -> None:
    lines = []
    for path in sorted(p for p in dist.rglob("*") if p.is_file() and p.name != "SHA256SUMS"):
        digest = hashlib.sha256()
        with path.open("rb") as f:
            for block in iter(lambda: f.read(1 << 20), b""):
                digest.update(block)
        lines.append(f"{digest.hexdigest()}  {path.relative_to(dist)}")
    (dist / "SHA256SUMS").write_text("\n".join(lines) + "\n")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--dist", type=Path, default=REPO / "dist", help="output directory (emptied first)")
    parser.add_argument("--skip-images", action="store_true",
                        help="no image archives, and the chart keeps its tags (for a quick check of the rest)")
    args = parser.parse_args()
    dist: Path = args.dist.resolve()
    shutil.rmtree(dist, ignore_errors=True)
    dist.mkdir(parents=True)
    version = yaml.safe_load((CHART / "Chart.yaml").read_text())["appVersion"]
    with tempfile.TemporaryDirectory(prefix="durablerun-release-") as scratch:
        python_packages(dist, Path(scratch))
        built = {} if args.skip_images else images(dist, version)
        packaged = chart(dist, Path(scratch), {name: digest for name, (_, digest) in built.items()})
    checksums(dist)
    for name, (reference, digest) in built.items():
        print(f"{name}: {reference} {digest}")
    print(f"chart: {packaged.relative_to(dist)}; everything in {dist} (SHA256SUMS)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
