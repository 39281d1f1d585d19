"""The contract's names are written once, in ``durablerun.api`` (or ``resource``, ``relations``), imported elsewhere.

A copy of ``"durablerun.dev/run"`` or ``"DURABLERUN_EPOCH"`` in another module is a second
definition that a rename would miss. This test reads the Python source of runner/, operator/,
hack/, bench/ and tests/ and fails, naming file:line, on a string literal (docstrings aside) that
spells one of them:

* the API group, version and apiVersion, the CRD's name, every label, annotation and finalizer
  key, and the Events' reporting component;
* every ``DURABLERUN_*`` environment variable: the contract's (``api.Env``, ``api.OperatorEnv``) only
  from api; a tool's own knob (the test bed's, the benchmarks', a test tier's) only in the one
  module that defines it (TOOL_KNOBS);
* run phases and attempt outcomes, outside tests/ and the test bed's process node. Those words are
  also Kubernetes' pod phases (the process node implements a kubelet), condition types and Event
  reasons, so a scan cannot tell them apart everywhere; and a test asserting what a user sees may
  spell the value it expects. ``test_the_contract_spells_these_values`` below pins them once.

A line that must spell one of these words for another meaning (a column header that happens to be a phase's
name) says so with a ``# literal-ok: <why>`` comment.

Not scanned: Markdown (docs are for people and must spell the names), YAML and templates (the chart
and the generated manifests cannot import Python: tests/install/test_chart.py checks the env names
the chart sets against api, tests/test_generated.py that the generated files match their source), and
the golden journals (recorded data that must not change).
"""

from __future__ import annotations

import ast
import re
from collections.abc import Iterator
from pathlib import Path

from durablerun import api

REPO = Path(__file__).resolve().parent.parent
ROOTS = ("runner", "operator", "hack", "bench", "tests")
#: The contract: the names and encodings (api.py), the resource's models (resource.py) and the child-run and
#: signal requests its status carries (relations.py).
CONTRACT_MODULES = ("runner/durablerun/api.py", "runner/durablerun/resource.py", "runner/durablerun/relations.py")
THIS = "tests/test_contract_literals.py"

_DR_FLOWS, _DBOS_FLOWS = "bench/durablerun_bench/dr_flows.py", "bench/durablerun_bench/dbos_flows.py"
#: A tool's own environment variable (not part of the contract): the one module that defines it. The benchmark's
#: DBOS flows keep their own copy: they must not import durablerun (their process measures DBOS alone), and
#: durablerun_bench.replay asserts the two agree.
TOOL_KNOBS: dict[str, tuple[str, ...]] = {
    "DURABLERUN_CACHE": ("hack/durablerun_testbed/binaries.py",),
    "DURABLERUN_TESTBED_ID": ("hack/durablerun_testbed/procs.py",),
    "DURABLERUN_BENCH_MARK": (_DR_FLOWS, _DBOS_FLOWS),
    "DURABLERUN_BENCH_CRASH": (_DR_FLOWS, _DBOS_FLOWS),
    "DURABLERUN_BENCH_STEP_MARKS": (_DR_FLOWS,),
    "DURABLERUN_SKIP_REAL_NODE": ("tests/helpers/session.py",),
    "DURABLERUN_KILL_EXAMPLES": ("tests/sdk/test_kill_resume.py",),
    "DURABLERUN_KUEUE_RUNS": ("tests/kueue/test_latency.py",),
    "DURABLERUN_KILL_SEED": ("tests/sdk/test_kill_resume.py",),
    "DURABLERUN_KILL_DEBUG": ("tests/sdk/test_kill_resume.py",),
    "DURABLERUN_SCREENSHOTS": ("tests/browser/test_run_browser.py",),
    "DURABLERUN_CRASH_AT": ("runner/durablerun/_private/storage/backends/base.py",),
}
# Where phase and outcome words are Kubernetes' own (pod phases, container reasons), not a run's.
PHASE_WORDS_ARE_KUBERNETES = ("hack/durablerun_testbed/processnode/",)

ENV_NAME = re.compile(r"DURABLERUN_[A-Z0-9_]+")


def _names(holder: type) -> set[str]:
    return {v for k, v in vars(holder).items() if k.isupper() and isinstance(v, str) and v.startswith("DURABLERUN_")}


CONTRACT_ENV = _names(api.Env) | _names(api.OperatorEnv)
#: Strings that may not appear inside any literal (label keys also as selectors: "durablerun.dev/run=x").
KEYS = {api.API_VERSION, api.CRD_NAME, api.LABEL_RUN, api.LABEL_EPOCH, api.LABEL_PARENT, api.POD_FINALIZER,
        api.RUN_FINALIZER, api.ANNOTATION_ABORT, api.ANNOTATION_RETRY, api.ANNOTATION_SUSPENDED_BY_PARENT,
        api.ANNOTATION_ABORTED_BY_PARENT, api.REPORTING_COMPONENT, api.LABEL_NAME, api.LABEL_COMPONENT,
        api.LABEL_SCHEDULE, api.ANNOTATION_SCHEDULED_TIME, api.SCHEDULE_CRD_NAME, api.QUOTA_CRD_NAME,
        api.LABEL_MANAGED_BY}
#: Strings that may not be a whole literal.
WHOLE = {api.GROUP, api.VERSION, f"{api.VERSION}.{api.GROUP}"}
WORDS = {p.value for p in api.Phase} | {o.value for o in api.Outcome}


def _key_in(text: str) -> str | None:
    for key in KEYS:
        at = text.find(key)
        after = text[at + len(key):at + len(key) + 1]
        # A key, not the start of a longer name: "durablerun.dev/run" but not "durablerun.dev/runner".
        if at >= 0 and not (after.isalnum() or after in ("_", ".")):
            return key
    return None


def _docstrings(tree: ast.AST) -> set[int]:
    ids = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef) and node.body:
            first = node.body[0]
            if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant):
                ids.add(id(first.value))
    return ids


def _python_files() -> Iterator[tuple[str, Path]]:
    for root in ROOTS:
        for path in sorted((REPO / root).rglob("*.py")):
            rel = path.relative_to(REPO).as_posix()
            if "/.venv/" in f"/{rel}" or "/build/" in f"/{rel}" or rel in (*CONTRACT_MODULES, THIS):
                continue
            yield rel, path


def copies() -> list[str]:
    """Every literal copy of a contract name outside api, as 'file:line: what'."""
    found = []
    for rel, path in _python_files():
        source = path.read_text()
        tree = ast.parse(source, rel)
        skip = _docstrings(tree)
        excused = {n for n, line in enumerate(source.splitlines(), 1) if "# literal-ok:" in line}
        words_count = not rel.startswith(("tests/", *PHASE_WORDS_ARE_KUBERNETES))
        for node in ast.walk(tree):
            if not (isinstance(node, ast.Constant) and isinstance(node.value, str)) or id(node) in skip \
                    or node.lineno in excused:
                continue
            text, where = node.value, f"{rel}:{node.lineno}"
            key = _key_in(text)
            if key or text in WHOLE:
                found.append(f"{where}: {key or text!r} (use durablerun.api's constant)")
            for name in ENV_NAME.findall(text):
                if name in CONTRACT_ENV:
                    found.append(f"{where}: {name} (use durablerun.api.Env / OperatorEnv)")
                elif rel not in TOOL_KNOBS.get(name, ()):
                    home = TOOL_KNOBS.get(name)
                    found.append(f"{where}: {name} " + (f"(import it from {home[0]})" if home else
                                                        "(a contract name belongs in durablerun.api; a tool's "
                                                        "own knob gets one home in TOOL_KNOBS)"))
            if words_count and text in WORDS:
                found.append(f"{where}: {text!r} (use durablerun.api.Phase / Outcome)")
    return found


def test_no_contract_name_is_written_outside_api() -> None:
    found = copies()
    assert not found, "contract names written outside durablerun.api:\n" + "\n".join(found)


def test_the_scan_sees_a_copy() -> None:
    """The scan itself works: it finds a copy in a literal and in an f-string, and not in a docstring."""
    source = ('"""Sets DURABLERUN_EPOCH."""\n'
              'a = {"DURABLERUN_EPOCH": "1"}\n'
              'b = f"durablerun.dev/run={a}"\n'
              'c = "Waiting"\n')
    tree = ast.parse(source)
    skip = _docstrings(tree)
    texts = [n.value for n in ast.walk(tree)
             if isinstance(n, ast.Constant) and isinstance(n.value, str) and id(n) not in skip]
    assert [t for t in texts if ENV_NAME.search(t)] == ["DURABLERUN_EPOCH"]
    assert [_key_in(t) for t in texts if _key_in(t)] == [api.LABEL_RUN]
    assert [t for t in texts if t in WORDS] == ["Waiting"]
    assert _key_in("durablerun.dev/runner") is None


def test_every_tool_knob_lives_where_the_table_says() -> None:
    for name, homes in TOOL_KNOBS.items():
        for home in homes:
            assert name in (REPO / home).read_text(), f"{name} is no longer defined in {home}: update TOOL_KNOBS"


def test_the_contract_spells_these_values() -> None:
    """The wire values themselves, pinned once: a rename in api is a change of the contract, and fails here."""
    assert (api.GROUP, api.VERSION, api.API_VERSION, api.KIND, api.CRD_NAME) == (
        "durablerun.dev", "v1alpha1", "durablerun.dev/v1alpha1", "DurableRun", "durableruns.durablerun.dev")
    assert (api.LABEL_RUN, api.LABEL_EPOCH, api.LABEL_PARENT) == (
        "durablerun.dev/run", "durablerun.dev/epoch", "durablerun.dev/parent")
    assert (api.ANNOTATION_ABORT, api.ANNOTATION_RETRY, api.REPORTING_COMPONENT) == (
        "durablerun.dev/abort", "durablerun.dev/retry", "durablerun.dev/operator")
    assert [p.value for p in api.Phase] == [
        "Pending", "Queued", "Running", "Waiting", "Suspended", "Backoff", "Succeeded", "Failed", "Aborted"]
    assert (api.LABEL_QUEUE_NAME, api.LABEL_PRIORITY_CLASS) == (
        "kueue.x-k8s.io/queue-name", "kueue.x-k8s.io/priority-class")
    assert [o.value for o in api.Outcome] == [
        "Completed", "Failed", "UsageError", "Aborted", "Suspended", "Waiting", "Fenced"]
    assert [c.value for c in api.ConditionType] == ["Progressing", "Suspended", "Complete", "Failed", "UpgradeReplays"]
    assert [s.value for s in api.UpgradeState] == ["Checking", "Replays", "Refused"]
    assert (api.Env.EPOCH, api.Env.CLUSTER, api.OperatorEnv.CLUSTER, api.OperatorEnv.CLUSTER_OLD_NAME) == (
        "DURABLERUN_EPOCH", "DURABLERUN_CLUSTER", "DURABLERUN_CLUSTER", "DURABLERUN_CLUSTER_NAME")
