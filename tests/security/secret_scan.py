"""Scanning bytes for secret values, raw and base64-encoded."""

from __future__ import annotations

import base64


def forms(secret: str) -> list[bytes]:
    return [secret.encode(), base64.b64encode(secret.encode())]


def leaks(data: bytes, values: dict[str, str]) -> list[str]:
    return [name for name, value in values.items() if any(form in data for form in forms(value))]
