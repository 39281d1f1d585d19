"""Debian's Prometheus on loopback, scraping given targets; promtool beside it."""

from __future__ import annotations

import json
import urllib.parse
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from durablerun_testbed import binaries, procs


@dataclass
class Prometheus:
    workdir: Path
    testbed_id: str
    process: procs.ManagedProcess | None = None
    port: int = 0

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(
        self,
        targets: list[str],
        *,
        rule_files: list[Path] | None = None,
        scrape_interval: str = "1s",
        evaluation_interval: str = "1s",
    ) -> Prometheus:
        """Scrape ``targets`` (host:port) every ``scrape_interval``, evaluating ``rule_files``."""
        self.workdir.mkdir(parents=True, exist_ok=True)
        config = {
            "global": {"scrape_interval": scrape_interval, "evaluation_interval": evaluation_interval},
            "rule_files": [str(p) for p in rule_files or []],
            "scrape_configs": [{"job_name": "durablerun-operator", "static_configs": [{"targets": targets}]}],
        }
        config_path = self.workdir / "prometheus.yml"
        config_path.write_text(yaml.safe_dump(config))
        self.port = procs.free_port()
        self.process = procs.ManagedProcess(
            "prometheus",
            [str(binaries.find("prometheus")), f"--config.file={config_path}",
             f"--storage.tsdb.path={self.workdir / 'data'}",
             f"--web.listen-address=127.0.0.1:{self.port}", "--web.enable-lifecycle"],
            log_path=self.workdir / "prometheus.log",
            testbed_id=self.testbed_id,
        )
        procs.wait_for(self._ready, timeout=30, what=f"Prometheus at {self.url}")
        return self

    def _ready(self) -> bool:
        assert self.process
        self.process.check_alive()
        with urllib.request.urlopen(f"{self.url}/-/ready", timeout=2) as response:
            return bool(response.status == 200)

    def api(self, path: str, **params: str) -> Any:
        """GET /api/v1/<path>; returns ``data`` or raises with Prometheus's error."""
        query = urllib.parse.urlencode(params)
        with urllib.request.urlopen(f"{self.url}/api/v1/{path}?{query}", timeout=10) as response:
            body = json.load(response)
        if body.get("status") != "success":
            raise RuntimeError(f"Prometheus {path} failed: {body}")
        return body["data"]

    def query(self, promql: str) -> list[dict[str, Any]]:
        result: list[dict[str, Any]] = self.api("query", query=promql)["result"]
        return result

    def stop(self) -> None:
        if self.process:
            self.process.stop()
