"""Generated files (the CRD, ...) match their one source."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parent.parent


def test_generated_files_are_fresh() -> None:
    spec = importlib.util.spec_from_file_location("generate", REPO / "hack" / "generate.py")
    assert spec
    assert spec.loader
    generate = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(generate)
    stale = [
        str(path.relative_to(REPO))
        for path, content in generate.outputs().items()
        if not path.exists() or path.read_text() != content
    ]
    assert not stale, f"stale generated files, run `make generate`: {stale}"


def test_the_crd_fits_a_client_side_apply() -> None:
    """`kubectl apply` (client-side) stores the whole object in an annotation of at most 256 KiB."""
    crd = next(doc for doc in yaml.safe_load_all((REPO / "deploy/crd/durableruns.durablerun.dev.yaml").read_text())
               if doc["kind"] == "CustomResourceDefinition")
    size = len(json.dumps(crd, separators=(",", ":")))
    assert size < 262144 - 16384, f"the CRD is {size} bytes of JSON: trim spec.template's descriptions"
