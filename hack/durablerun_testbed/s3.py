"""A real S3 server on loopback: MinIO built from its Go module (hack/build-binaries.sh).

MinIO's PutObject honours ``If-None-Match: *`` and ``If-Match: <etag>`` under a
namespace lock, so two concurrent writers are tested for real.
"""

from __future__ import annotations

import secrets
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from durablerun_testbed import binaries, procs

REGION = "us-east-1"


@dataclass
class S3Server:
    workdir: Path
    testbed_id: str
    process: procs.ManagedProcess | None = None
    port: int = 0
    access_key: str = ""
    secret_key: str = ""
    region: str = REGION
    #: Where MinIO listens: loopback, or a real node's pod network (``realnode``).
    address: str = "127.0.0.1"
    #: More environment for MinIO, e.g. MINIO_KMS_SECRET_KEY for server-side encryption.
    extra_env: dict[str, str] = field(default_factory=dict)

    @property
    def endpoint_url(self) -> str:
        return f"http://{self.address}:{self.port}"

    def start(self) -> S3Server:
        self.port = procs.free_port()
        self.access_key = "testbed-" + secrets.token_hex(4)
        self.secret_key = secrets.token_hex(16)
        self._launch()
        return self

    def restart(self) -> S3Server:
        """Start again after ``stop()``: same port, credentials and data, as a server coming back."""
        self._launch()
        return self

    def _launch(self) -> None:
        data = self.workdir / "data"
        data.mkdir(parents=True, exist_ok=True)
        env = {
            "PATH": "/usr/bin:/bin",
            "HOME": str(self.workdir),
            "MINIO_ROOT_USER": self.access_key,
            "MINIO_ROOT_PASSWORD": self.secret_key,
            "MINIO_REGION": self.region,
            "MINIO_BROWSER": "off",
            "MINIO_UPDATE": "off",
            "MINIO_CI_CD": "1",
            **self.extra_env,
        }
        self.process = procs.ManagedProcess(
            "minio",
            [
                str(binaries.find("minio")), "server", "--quiet",
                "--address", f"{self.address}:{self.port}",
                "--console-address", f"127.0.0.1:{procs.free_port()}",
                str(data),
            ],
            log_path=self.workdir / "minio.log",
            env=env,
            testbed_id=self.testbed_id,
        )
        procs.wait_for(self._ready, timeout=60, what=f"MinIO at {self.endpoint_url}")

    def _ready(self) -> bool:
        assert self.process
        self.process.check_alive()
        with urllib.request.urlopen(f"{self.endpoint_url}/minio/health/ready", timeout=2) as r:
            return bool(r.status == 200)

    def check_alive(self) -> None:
        assert self.process
        self.process.check_alive()

    def client(self) -> Any:
        """A boto3 S3 client for this server."""
        import boto3
        from botocore.config import Config

        return boto3.client(
            "s3",
            endpoint_url=self.endpoint_url,
            aws_access_key_id=self.access_key,
            aws_secret_access_key=self.secret_key,
            region_name=self.region,
            config=Config(retries={"max_attempts": 2, "mode": "standard"}),
        )

    def create_bucket(self, name: str) -> str:
        self.client().create_bucket(Bucket=name)
        return name

    def stop(self) -> None:
        if self.process is not None:
            self.process.stop()
