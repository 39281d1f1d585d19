"""Generated files (the CRD, ...) match their one source."""

from __future__ import annotations

import importlib.util
from pathlib import Path

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
