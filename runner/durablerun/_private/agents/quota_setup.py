"""This process's quota limiter, from its environment (docs/agents.md, "Model quotas").

``DURABLERUN_LLM_QUOTAS`` declares the quotas (JSON, or a file's path); ``DURABLERUN_LLM_QUOTA_REDIS``, if set,
names the Redis whose windows every runner shares (redis_windows); without it the windows are this process's
own (``durablerun run`` on a laptop). Read again whenever either changes.
"""

from __future__ import annotations

import os
from pathlib import Path

from durablerun import api, errors
from durablerun._private.agents import redis_windows
from durablerun._private.agents.quota import Limiter, parse_quotas

_LIMITER: Limiter | None = None
_LOADED_FROM: tuple[str | None, ...] | None = None
_SETTINGS = (api.Env.LLM_QUOTAS, api.Env.LLM_QUOTA_REDIS, api.Env.LLM_QUOTA_REDIS_PASSWORD,
             api.Env.LLM_QUOTA_UNAVAILABLE, api.Env.LLM_QUOTA_PRIORITY)


def limiter() -> Limiter | None:
    """The limiter of this process's quotas, or None if it declares none."""
    global _LIMITER, _LOADED_FROM
    settings = tuple(os.environ.get(name) or None for name in _SETTINGS)
    if settings != _LOADED_FROM:
        raw = settings[0]
        text = raw
        if raw is not None and not raw.lstrip().startswith("{"):
            try:
                text = Path(raw).read_text()
            except OSError as e:
                raise errors.ConfigError(f"{api.Env.LLM_QUOTAS}: cannot read {raw}: {e.strerror}") from None
        _LIMITER = Limiter(parse_quotas(text), windows=redis_windows.from_environment()) if text is not None \
            else None
        _LOADED_FROM = settings
    return _LIMITER
