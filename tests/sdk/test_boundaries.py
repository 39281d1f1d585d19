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
    above = ("durablerun._private.journal", "durablerun._private.core", "durablerun._private.model",
             "durablerun._private.replay", "durablerun._private.workers", "durablerun._private.writer",
             "durablerun._private.engine", "durablerun._private.context",
             "durablerun._private.sagas", "durablerun._private.results",
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


# The runner's layers, lowest first (docs/architecture.md). A module may import its own layer
# and the ones below it, never one above; a module not listed belongs to the top layer.
LAYERS: list[tuple[str, set[str]]] = [
    ("contract", {"durablerun.api", "durablerun.relations", "durablerun.resource", "durablerun.errors",
                  "durablerun._version", "durablerun._private", "durablerun._private.backends"}),
    ("encoding", {"durablerun._private.codec", "durablerun._private.layout",
                  "durablerun._private.halts", "durablerun._private.extras",
                  "durablerun._private.webhooks"}),
    ("model", {"durablerun._private.model"}),
    ("storage", {"durablerun._private.backends.base", "durablerun._private.backends.options",
                 "durablerun._private.backends.fs", "durablerun._private.backends.memory",
                 "durablerun._private.backends.s3", "durablerun._private.journal",
                 "durablerun._private.stores", "durablerun._private.owner"}),
    ("progress", {"durablerun._private.sinks"}),
    ("replay", {"durablerun._private.replay"}),
    ("runtime", {"durablerun._private.workers", "durablerun._private.writer", "durablerun._private.results",
                 "durablerun._private.sagas", "durablerun._private.core", "durablerun._private.children",
                 "durablerun._private.context", "durablerun._private.loading", "durablerun._private.engine",
                 "durablerun._private.tracing", "durablerun._private.spanexport"}),
    ("front", {"durablerun._private.display", "durablerun._private.arguments", "durablerun._private.inspection",
               "durablerun._private.cli", "durablerun._private.lease", "durablerun._private.pod",
               "durablerun._private.kubectl", "durablerun._private.timeline", "durablerun._private.kubeapi",
               "durablerun._private.browser", "durablerun._private.replayer", "durablerun._private.reruns",
               "durablerun._private.family", "durablerun._private.upgrades"}),
]
#: Public modules the private ones may import: the contract. Every other public module is a façade over
#: ``_private`` (it re-exports names, or starts a command) and nothing under ``_private`` imports it.
CONTRACT_MODULES = {"durablerun.api", "durablerun.relations", "durablerun.resource", "durablerun.errors",
                    "durablerun._version"}


def _graph() -> dict[str, set[str]]:
    """Module -> the runner modules it imports (TYPE_CHECKING imports included)."""
    modules = set(_modules())
    graph: dict[str, set[str]] = {}
    for path in PKG.rglob("*.py"):
        name = ".".join(path.relative_to(PKG.parent).with_suffix("").parts).removesuffix(".__init__")
        deps: set[str] = set()
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("durablerun"):
                for alias in node.names:
                    full = f"{node.module}.{alias.name}"
                    deps.add(full if full in modules else node.module)
            elif isinstance(node, ast.Import):
                deps.update(a.name for a in node.names if a.name in modules)
        graph[name] = {d for d in deps if d in modules and d != name}
    return graph


def _layer(module: str) -> int:
    return next((i for i, (_, members) in enumerate(LAYERS) if module in members), len(LAYERS))


def test_the_runners_layers_point_one_way() -> None:
    upward = [(m, d) for m, deps in _graph().items() for d in deps if _layer(d) > _layer(m)]
    assert not upward, f"imports that run up the layers (docs/architecture.md): {upward}"


def test_the_runners_imports_have_no_circle() -> None:
    graph = _graph()
    done: set[str] = set()

    def visit(module: str, path: list[str]) -> None:
        if module in path:
            raise AssertionError("import circle: " + " -> ".join([*path[path.index(module):], module]))
        if module in done:
            return
        for dep in sorted(graph[module]):
            visit(dep, [*path, module])
        done.add(module)

    for module in sorted(graph):
        visit(module, [])


def test_private_modules_never_import_the_public_facades() -> None:
    public = {m for m in _modules() if not m.startswith("durablerun._private")} - CONTRACT_MODULES
    backwards = [(m, d) for m, deps in _graph().items() if m.startswith("durablerun._private")
                 for d in deps if d in public]
    assert not backwards, f"a private module imports a public façade: {backwards}"
