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

# RelabelConfig fields of the Prometheus Operator's CRDs and their names in a Prometheus config.
_RELABEL_FIELDS = {"sourceLabels": "source_labels", "separator": "separator", "targetLabel": "target_label",
                   "regex": "regex", "modulus": "modulus", "replacement": "replacement", "action": "action"}


def _relabel(configs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [{_RELABEL_FIELDS[k]: (v.lower() if k == "action" else v) for k, v in c.items()} for c in configs]


@dataclass(frozen=True)
class ServiceMonitorTarget:
    """A ServiceMonitor (as rendered by the chart) and the Service and pod it finds, for a static scrape.

    The Prometheus Operator turns a ServiceMonitor endpoint into a scrape job whose targets carry the
    labels ``namespace``, ``service``, ``pod``, ``container``, ``endpoint`` and ``job`` (the Service's
    ``jobLabel`` label, else its name); the endpoint's ``honorLabels`` decides who wins when a scraped
    series has a label of the same name. This builds the same job with the target given statically.
    """

    monitor: dict[str, Any]
    service: dict[str, Any]
    pod: str
    container: str = "operator"

    def scrape_config(self, targets: list[str]) -> dict[str, Any]:
        spec = self.monitor["spec"]
        endpoint = spec["endpoints"][0]
        service_meta = self.service["metadata"]
        job = (service_meta.get("labels") or {}).get(spec.get("jobLabel", ""), service_meta["name"])
        labels = {"namespace": self.monitor["metadata"]["namespace"], "service": service_meta["name"],
                  "pod": self.pod, "container": self.container, "endpoint": endpoint["port"], "job": job}
        config: dict[str, Any] = {
            "job_name": f"serviceMonitor/{self.monitor['metadata']['namespace']}/{self.monitor['metadata']['name']}/0",
            "honor_labels": bool(endpoint.get("honorLabels", False)),
            "metrics_path": endpoint.get("path", "/metrics"),
            "static_configs": [{"targets": targets, "labels": labels}],
            "relabel_configs": _relabel(endpoint.get("relabelings") or []),
            "metric_relabel_configs": _relabel(endpoint.get("metricRelabelings") or []),
        }
        return config


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
        service_monitor: ServiceMonitorTarget | None = None,
    ) -> Prometheus:
        """Scrape ``targets`` (host:port) every ``scrape_interval``, evaluating ``rule_files``.

        With ``service_monitor``, the targets are scraped as the Prometheus Operator scrapes that
        ServiceMonitor's first endpoint (its target labels, honorLabels and relabelings).
        """
        self.workdir.mkdir(parents=True, exist_ok=True)
        scrape = (service_monitor.scrape_config(targets) if service_monitor else
                  {"job_name": "durablerun-operator", "static_configs": [{"targets": targets}]})
        config = {
            "global": {"scrape_interval": scrape_interval, "evaluation_interval": evaluation_interval},
            "rule_files": [str(p) for p in rule_files or []],
            "scrape_configs": [scrape],
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
