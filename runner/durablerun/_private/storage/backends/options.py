"""Options of the S3 backend (kept apart so importing them does not import boto3)."""

from __future__ import annotations

from dataclasses import dataclass

#: Total attempts per S3 request when nothing configures them (standard mode backs off exponentially
#: with jitter between them, at most 20 s each).
DEFAULT_MAX_ATTEMPTS = 8


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
    #: Total attempts per request, by botocore's retry mode (throttling, 5xx, timeouts, lost
    #: connections). None: the AWS configuration decides (AWS_MAX_ATTEMPTS, max_attempts in
    #: ~/.aws/config), else DEFAULT_MAX_ATTEMPTS. The mode is AWS_RETRY_MODE's (standard by default).
    max_attempts: int | None = None
    connect_timeout: float = 5.0
    read_timeout: float = 30.0
