"""The public surface is pinned: changing it is a deliberate act."""

from __future__ import annotations

import ast
import importlib
from pathlib import Path

import durablerun

PUBLIC = {
    "durablerun": [
        "AbortReason", "ChildRunFailed", "ConfigError", "CorruptionError", "DivergenceError", "DurableContext",
        "DurableRunError", "EventTimeout", "FencedError", "InputMismatchError",
        "NonRetryableError", "Outcome", "Policy", "ResultNotSerializableError",
        "ResultTooLargeError", "StepError", "StoreError", "WorkflowError", "__version__",
    ],
    "durablerun.engine": [
        "SDK_VERSION", "AttemptResult", "EngineConfig", "Run", "RunStarted", "Totals",
        "WaitingFor", "input_hash", "load_workflow",
    ],
    "durablerun.stores": [
        "LAYOUT_VERSION", "CheckpointInfo", "EventInfo", "RunInfo", "RunRef", "S3Options",
        "Store", "Totals", "open_store", "store_from_checkpoint",
    ],
    "durablerun.streams": [
        "POLL_FIRST_SECONDS", "POLL_MAX_SECONDS", "Advance", "Chunk", "Read", "RunStream", "Standing", "StoreCache",
        "next_wait", "open_run_stream", "stream_name_error",
    ],
    "durablerun.sinks": ["EventKind", "JsonLinesSink", "ProgressEvent", "ProgressSink"],
    "durablerun.cli": ["main"],
    "durablerun.pod": ["main"],
    "durablerun.kubectl": ["complete_main", "main"],
    "durablerun.testing": ["ChildStub", "FamilyRun", "ReplayReport", "WorkflowTest", "replay_run"],
    "durablerun.llm": [
        "PRICES", "PRICES_AS_OF", "Price", "UnpricedModelError", "Usage", "charge", "charge_response", "cost",
        "metered", "price_for", "read_usage", "set_price",
    ],
    "durablerun.agents": ["Saga", "SideEffect", "Tool", "bound_history", "tool"],
    "durablerun.errors": [
        "ChildRunFailed", "ConfigError", "CorruptionError", "DivergenceError", "DurableRunError", "EventTimeout",
        "FencedError", "InputMismatchError", "NonRetryableError", "ResultNotSerializableError",
        "ResultTooLargeError", "StepError", "StoreAccessError", "StoreError",
        "StoreNotFoundError", "StoreUnavailableError", "WorkflowError", "WorkflowLoadError",
        "WorkflowNotFoundError",
    ],
}

# The agent-framework adapters (extras): their classes subclass the frameworks' own, so they live
# in their modules rather than behind a thin one; their surface is pinned all the same.
INTEGRATIONS = {
    "durablerun.integrations.pydantic_ai": ["DurableRunDurability", "run", "stream_text"],
    "durablerun.integrations.langgraph": ["run_graph"],
}

CONTEXT_METHODS = [
    "add_cost", "continue_as_new", "gather", "idempotency_key", "now", "patched", "run_id",
    "run_child", "set_total_steps", "signal", "sleep", "start_child", "step", "stream", "stream_url", "uuid",
    "wait_for_event", "webhook_url",
]


def test_export_lists_are_pinned() -> None:
    for module_name, names in PUBLIC.items():
        module = importlib.import_module(module_name)
        assert sorted(module.__all__) == sorted(names), module_name
        for name in names:
            assert hasattr(module, name), (module_name, name)


def test_integration_export_lists_are_pinned() -> None:
    for module_name, names in INTEGRATIONS.items():
        module = importlib.import_module(module_name)
        assert sorted(module.__all__) == sorted(names), module_name
        for name in names:
            assert hasattr(module, name), (module_name, name)


def test_durable_context_surface_is_pinned() -> None:
    public = sorted(n for n in dir(durablerun.DurableContext) if not n.startswith("_"))
    assert public == sorted(CONTEXT_METHODS)


def test_public_modules_are_thin_and_internals_private() -> None:
    for module_name in PUBLIC:
        module = importlib.import_module(module_name)
        for name in module.__all__:
            obj = getattr(module, name)
            origin = getattr(obj, "__module__", module_name) or module_name
            assert origin.startswith(("durablerun._private", "durablerun.api", "durablerun.relations",
                                      "durablerun.resource", "durablerun.errors", "builtins")) or name in (
                "__version__", "SDK_VERSION", "LAYOUT_VERSION", "PRICES", "PRICES_AS_OF", "POLL_FIRST_SECONDS",
                "POLL_MAX_SECONDS"), (module_name, name, origin)


def test_public_modules_are_facades() -> None:
    """A public module names things (re-exports, an entry point); what does the work lives under _private.

    api, relations, resource, quotas, schedules, errors and webhooks are the exception: they are the contract
    itself (docs/architecture.md)."""
    for path in Path(durablerun.__file__).parent.glob("*.py"):
        if path.stem in ("api", "relations", "resource", "quotas", "schedules", "errors", "webhooks", "_version",
                         "__main__"):
            continue
        defined = [n.name for n in ast.parse(path.read_text()).body
                   if isinstance(n, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef)]
        assert not defined, f"durablerun/{path.name} defines {defined}: move them under durablerun._private"
