"""Loading a workflow function: ``module:function``, and the version of its code (runtime layer)."""

from __future__ import annotations

import hashlib
import importlib
import inspect
import traceback
from collections.abc import Callable
from typing import Any

from durablerun import errors


def load_workflow(ref: str) -> Callable[..., Any]:
    """Import ``module:function``.

    Raises WorkflowNotFoundError (a usage error) when nothing by that name can
    be imported, and WorkflowLoadError (Failed) when the module raises on import.
    """
    module_name, sep, func_name = ref.partition(":")
    if not sep or not module_name or not func_name:
        raise errors.WorkflowNotFoundError(
            f"workflow {ref!r} must be MODULE:FUNCTION, e.g. agents.research:run"
        )
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as e:
        if e.name and (module_name == e.name or module_name.startswith(e.name + ".")):
            raise errors.WorkflowNotFoundError(
                f"workflow {ref!r}: no module named {e.name!r} (is it on PYTHONPATH / in the "
                "current directory, and is the name spelled right?)"
            ) from e
        raise errors.WorkflowLoadError(
            f"workflow module {module_name!r} failed to import: {type(e).__name__}: {e}"
        ) from e
    except Exception as e:
        tb = "".join(traceback.format_exception(e)[-3:]).strip()
        raise errors.WorkflowLoadError(
            f"workflow module {module_name!r} raised while being imported: "
            f"{type(e).__name__}: {e}\n{tb}"
        ) from e
    fn = getattr(module, func_name, None)
    if fn is None:
        raise errors.WorkflowNotFoundError(
            f"workflow {ref!r}: module {module_name!r} has no attribute {func_name!r}"
        )
    if not inspect.iscoroutinefunction(fn):
        raise errors.WorkflowNotFoundError(
            f"workflow {ref!r} must be an async function: async def {func_name}(ctx, input)"
        )
    return fn  # type: ignore[no-any-return]


def code_version_of(fn: Callable[..., Any]) -> str:
    try:
        source_file = inspect.getsourcefile(fn)
        if source_file:
            with open(source_file, "rb") as f:
                return hashlib.sha256(f.read()).hexdigest()[:16]
    except (OSError, TypeError):
        pass
    return "unknown"
