"""What the operator's import rules (.importlinter, `make lint`) cannot say, checked from the source.

* The decisions never read the clock: they are handed ``now``.
* No class is over 300 lines without a written reason.

The layers, the decisions' purity (no client, no kopf, nothing that does IO) and which modules may talk to
the API server or import kopf are import-linter contracts (docs/architecture.md).
"""

from __future__ import annotations

import ast
from pathlib import Path

import durablerun_operator

PKG = Path(durablerun_operator.__file__).parent
OP = "durablerun_operator"
#: The modules the contract "decisions-pure" holds to no IO; the same ones must not read the clock.
PURE_PACKAGES = ("decide", "builders", "kueue", "crd", "wakeups", "overload", "cron", "ticks")


def _sources() -> dict[str, ast.Module]:
    out = {}
    for path in PKG.rglob("*.py"):
        name = ".".join(path.relative_to(PKG.parent).with_suffix("").parts).removesuffix(".__init__")
        parts = name.split(".")
        if len(parts) > 1 and parts[1] in PURE_PACKAGES:
            out[name] = ast.parse(path.read_text(), str(path))
    return out


def test_the_decisions_never_read_the_clock() -> None:
    """decide is handed ``now``: a decision made twice on the same facts is the same decision."""
    sources = _sources()
    assert f"{OP}.decide.lifecycle" in sources
    for module in sorted(sources):
        for node in ast.walk(sources[module]):
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
                assert node.func.attr not in ("now", "utcnow", "today", "time", "monotonic"), (
                    f"{module}:{node.lineno} reads the clock ({ast.unparse(node.func)})")


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
