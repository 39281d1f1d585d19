"""Module boundaries of the operator, checked from the source (pure, no test bed).

* The decisions (``decide`` and its modules) and the builders import no
  Kubernetes client, no kopf and nothing that does IO, and never read the
  clock: they are pure functions of what they are handed.
* Only ``kube`` talks to the API server; only the kopf wiring imports kopf.
* The operator's layers point one way and have no circle (docs/architecture.md).
"""

from __future__ import annotations

import ast
from pathlib import Path

import durablerun_operator

PKG = Path(durablerun_operator.__file__).parent
OP = "durablerun_operator"

# Modules (top-level names) that reach the network, processes, files, threads or an event loop.
IO = {"kubernetes", "kubernetes_asyncio", "urllib3", "kopf", "aiohttp", "httpx", "requests", "socket", "ssl",
      "select", "urllib", "http", "subprocess", "multiprocessing", "threading", "concurrent", "asyncio", "os",
      "io", "shutil", "pathlib", "tempfile", "logging", "time", "prometheus_client", "wsgiref"}
PURE = {f"{OP}.builders", f"{OP}.kueue", f"{OP}.crd", f"{OP}.decide", f"{OP}.decide.facts", f"{OP}.decide.clocks",
        f"{OP}.decide.transition", f"{OP}.decide.aborts", f"{OP}.decide.family", f"{OP}.decide.lifecycle",
        f"{OP}.wakeups", f"{OP}.overload"}


def _sources() -> dict[str, ast.Module]:
    out = {}
    for path in PKG.rglob("*.py"):
        name = ".".join(path.relative_to(PKG.parent).with_suffix("").parts).removesuffix(".__init__")
        out[name] = ast.parse(path.read_text(), str(path))
    return out


def _imported(tree: ast.Module, modules: set[str]) -> set[str]:
    """Every module ``tree`` imports, wherever (TYPE_CHECKING and function bodies included): a name imported
    from a package counts as its submodule when it is one."""
    found: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module:
            for alias in node.names:
                sub = f"{node.module}.{alias.name}"
                found.add(sub if sub in modules else node.module)
    return found


def test_the_decisions_import_no_client_no_kopf_and_nothing_that_does_io() -> None:
    sources = _sources()
    assert set(sources) >= PURE, PURE - set(sources)
    for module in sorted(PURE):
        imports = _imported(sources[module], set(sources))
        io = {i for i in imports if i.split(".")[0] in IO}
        assert not io, f"{module} imports {sorted(io)}: the decisions must stay pure"
        # Within the operator: other pure modules, and config for the Settings value the builders take.
        inner = {i for i in imports if i.startswith(f"{OP}.") and i not in PURE | {f"{OP}.config"}}
        assert not inner, f"{module} imports {sorted(inner)}, which talk to the outside"


def test_the_decisions_never_read_the_clock() -> None:
    """decide is handed ``now``: a decision made twice on the same facts is the same decision."""
    sources = _sources()
    for module in sorted(PURE):
        for node in ast.walk(sources[module]):
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
                assert node.func.attr not in ("now", "utcnow", "today", "time", "monotonic"), (
                    f"{module}:{node.lineno} reads the clock ({ast.unparse(node.func)})")


def test_only_kube_talks_to_the_api_server_and_only_the_wiring_imports_kopf() -> None:
    sources = _sources()
    for module, tree in sources.items():
        tops = {i.split(".")[0] for i in _imported(tree, set(sources))}
        if module != f"{OP}.kube":
            assert not tops & {"kubernetes", "kubernetes_asyncio", "urllib3"}, f"{module} talks to the API server"
        if module not in (f"{OP}.handlers", f"{OP}.__main__"):
            assert "kopf" not in tops, f"{module} imports kopf"


# The operator's layers, lowest first (docs/architecture.md). A module may import its own layer and the ones
# below it, never one above; a module not listed belongs to the top layer.
LAYERS: list[set[str]] = [
    {f"{OP}.config", f"{OP}.crd"},
    {f"{OP}.builders"},
    {f"{OP}.kueue"},
    {f"{OP}.decide.facts"},
    {f"{OP}.decide.clocks"},
    {f"{OP}.decide.transition"},
    {f"{OP}.decide.aborts", f"{OP}.decide.family"},
    {f"{OP}.decide.lifecycle"},
    {f"{OP}.decide"},
    {f"{OP}.wakeups", f"{OP}.overload"},
    {f"{OP}.kube", f"{OP}.metrics", f"{OP}.tracing"},
    {f"{OP}.workqueue", f"{OP}.shards"},
    {f"{OP}.integrations"},
    {f"{OP}.integrations.kueue"},
    {f"{OP}.holds", f"{OP}.schedule"},
    {f"{OP}.executor"},
    {f"{OP}.reconciler"},
    {f"{OP}.handlers", f"{OP}.__main__"},
]


def _graph() -> dict[str, set[str]]:
    sources = _sources()
    modules = set(sources)
    return {name: {i for i in _imported(tree, modules) if i in modules and i != name}
            for name, tree in sources.items()}


def _layer(module: str) -> int:
    return next((i for i, members in enumerate(LAYERS) if module in members), len(LAYERS))


def test_the_operators_layers_point_one_way() -> None:
    upward = sorted((m, d) for m, deps in _graph().items() for d in deps if _layer(d) > _layer(m))
    assert not upward, f"imports that run up the operator's layers (docs/architecture.md): {upward}"


def test_the_operators_imports_have_no_circle() -> None:
    graph, done = _graph(), set()

    def visit(module: str, path: tuple[str, ...]) -> None:
        if module in path:
            raise AssertionError("import circle: " + " -> ".join((*path[path.index(module):], module)))
        if module not in done:
            for dep in sorted(graph[module]):
                visit(dep, (*path, module))
            done.add(module)

    for module in sorted(graph):
        visit(module, ())


# A class a reader must hold in their head at once: over this many lines, the class says why (a comment just
# above it or in its first lines, starting with CLASS_REASON), or it is split along its jobs (docs/architecture.md).
MAX_CLASS_LINES = 300
CLASS_REASON = "# Over 300 lines:"


def test_no_class_is_over_300_lines_without_a_written_reason() -> None:
    long = []
    for path in sorted(PKG.rglob("*.py")):
        lines = path.read_text().splitlines()
        for node in ast.walk(ast.parse("\n".join(lines), str(path))):
            if isinstance(node, ast.ClassDef) and node.end_lineno is not None:
                size = node.end_lineno - node.lineno + 1
                head = lines[max(0, node.lineno - 4): node.lineno + 10]  # just above it, or in its first lines
                if size > MAX_CLASS_LINES and not any(line.strip().startswith(CLASS_REASON) for line in head):
                    long.append(f"{path.relative_to(PKG.parent)}: {node.name} ({size} lines)")
    assert not long, f"classes over {MAX_CLASS_LINES} lines with no written reason: {long}"
