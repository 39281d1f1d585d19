"""Options of the S3 backend (kept apart so importing them does not import boto3)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class S3Options:
    """How to reach the bucket. Credentials default to boto3's usual chain."""

    endpoint_url: str | None = None
    region: str | None = None
    server_side_encryption: str | None = None
    kms_key_id: str | None = None
    access_key: str | None = None
    secret_key: str | None = None
    session_token: str | None = None
    #: Attempts per request (botocore standard mode: throttling, 5xx, timeouts).
    max_attempts: int = 8
    #: Outer retries when the server cannot be reached at all, with backoff.
    unreachable_retries: int = 6
    connect_timeout: float = 5.0
    read_timeout: float = 30.0
