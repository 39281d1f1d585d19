"""Optional dependencies: the S3 store and the in-pod runner are extras of the package.

Importing ``durablerun`` loads neither boto3 nor the kubernetes client; a
feature that needs one calls :func:`require` first, so a lean install fails
with the ``pip install`` line that fixes it instead of a bare ImportError.
"""

from __future__ import annotations

import importlib.util

from durablerun import errors


def require(extra: str, feature: str, *modules: str) -> None:
    """Raise ConfigError naming ``durable-run[extra]`` if any of ``modules`` is not installed."""
    missing = [m for m in modules if importlib.util.find_spec(m) is None]
    if missing:
        raise errors.ConfigError(
            f"{feature} needs {', '.join(missing)}, which this installation lacks: "
            f"pip install 'durable-run[{extra}]'"
        )
