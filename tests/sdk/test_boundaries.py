"""Module boundaries of the SDK, checked from the source (import-linter style).

* The SDK never imports the operator, kopf, or the test bed.
* Storage backends know bytes and keys only: they never import each other
  (besides the shared base/options) nor the record layer, engine or context.
* The record layer (journal) does not know the engine.
* Only the S3 backend imports boto3/botocore, so the rest loads without it.
"""

from __future__ import annotations

import ast
from pathlib import Path

import durablerun

PKG = Path(durablerun.__file__).parent


def _imports(path: Path) -> set[str]:
    tree = ast.parse(path.read_text(), str(path))
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module:
            names.add(node.module)
            names.update(f"{node.module}.{a.name}" for a in node.names)
    return names


def _modules() -> dict[str, set[str]]:
    out = {}
    for path in PKG.rglob("*.py"):
        rel = path.relative_to(PKG.parent).with_suffix("")
        out[".".join(rel.parts).removesuffix(".__init__")] = _imports(path)
    return out


def test_the_sdk_never_imports_the_operator_or_the_test_bed() -> None:
    for module, imports in _modules().items():
        bad = {i for i in imports
               if i.split(".")[0] in ("durablerun_operator", "kopf", "durablerun_testbed")}
        assert not bad, (module, bad)


def test_backends_are_unaware_of_each_other_and_of_the_layers_above() -> None:
    allowed = {"durablerun._private.backends.base", "durablerun._private.backends.options",
               "durablerun._private.backends"}
    above = ("durablerun._private.journal", "durablerun._private.core",
             "durablerun._private.engine", "durablerun._private.context",
             "durablerun._private.stores")
    for module, imports in _modules().items():
        if not module.startswith("durablerun._private.backends."):
            continue
        siblings = {i for i in imports if i.startswith("durablerun._private.backends.")
                    and not any(i == a or i.startswith(a + ".") for a in allowed)}
        assert not siblings, (module, siblings)
        assert not {i for i in imports if i.startswith(above)}, module


def test_the_record_layer_does_not_know_the_engine() -> None:
    imports = _modules()["durablerun._private.journal"]
    assert not {i for i in imports if i.startswith(("durablerun._private.core",
                                                    "durablerun._private.engine"))}


def test_only_the_s3_backend_imports_boto() -> None:
    for module, imports in _modules().items():
        if module == "durablerun._private.backends.s3":
            continue
        boto = {i for i in imports if i.split(".")[0] in ("boto3", "botocore", "mypy_boto3_s3")}
        assert not boto, (module, boto)
