"""Jaeger v2 (all-in-one, in-memory storage) on loopback: an OTLP collector and its query API for the tracing tests
and the sandbox's tour.

Every listener is on 127.0.0.1 on a free port: OTLP over HTTP and gRPC (or, for the real node's pods, the
pod bridge's address: ``otlp_host``), the query service's HTTP API (``/api/traces/<id>``) and gRPC, and the
health check. Jaeger's own telemetry is off, so nothing else
listens and the only traces stored are the ones the tests send.
"""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from durablerun_testbed import binaries, procs


@dataclass
class Jaeger:
    workdir: Path
    testbed_id: str
    process: procs.ManagedProcess | None = None
    otlp_http_port: int = 0
    otlp_grpc_port: int = 0
    query_port: int = 0
    health_port: int = 0
    #: Where the OTLP receivers listen: loopback, or the real node's bridge address for its pods to reach.
    otlp_host: str = "127.0.0.1"

    @property
    def otlp_endpoint(self) -> str:
        """What ``OTEL_EXPORTER_OTLP_ENDPOINT`` is set to (OTLP over HTTP)."""
        return f"http://{self.otlp_host}:{self.otlp_http_port}"

    @property
    def query_url(self) -> str:
        return f"http://127.0.0.1:{self.query_port}"

    def config(self) -> dict[str, Any]:
        def at(port: int) -> str:
            return f"127.0.0.1:{port}"

        grpc_query = procs.free_port()
        return {
            "service": {
                "extensions": ["jaeger_storage", "jaeger_query", "healthcheckv2"],
                "pipelines": {"traces": {"receivers": ["otlp"], "processors": ["batch"],
                                         "exporters": ["jaeger_storage_exporter"]}},
                # No metrics endpoint of its own (it would listen on a port of its choosing).
                "telemetry": {"metrics": {"level": "none"}, "logs": {"level": "info"}},
            },
            "extensions": {
                "jaeger_storage": {"backends": {"memory_store": {"memory": {"max_traces": 10000}}}},
                "jaeger_query": {"storage": {"traces": "memory_store"}, "enable_tracing": False,
                                 "http": {"endpoint": at(self.query_port)}, "grpc": {"endpoint": at(grpc_query)}},
                "healthcheckv2": {"use_v2": True, "http": {"endpoint": at(self.health_port)}},
            },
            "receivers": {"otlp": {"protocols": {
                "http": {"endpoint": f"{self.otlp_host}:{self.otlp_http_port}"},
                "grpc": {"endpoint": f"{self.otlp_host}:{self.otlp_grpc_port}"}}}},
            # Spans reach storage within a tenth of a second of arriving.
            "processors": {"batch": {"timeout": "100ms"}},
            "exporters": {"jaeger_storage_exporter": {"trace_storage": "memory_store"}},
        }

    def start(self) -> Jaeger:
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.otlp_http_port, self.otlp_grpc_port = procs.free_port(), procs.free_port()
        self.query_port, self.health_port = procs.free_port(), procs.free_port()
        config_path = self.workdir / "jaeger.yaml"
        config_path.write_text(yaml.safe_dump(self.config()))
        self.process = procs.ManagedProcess(
            "jaeger", [str(binaries.find("jaeger")), "--config", str(config_path)],
            log_path=self.workdir / "jaeger.log", testbed_id=self.testbed_id)
        procs.wait_for(self._ready, timeout=60, what=f"Jaeger's query API at {self.query_url}")
        return self

    def _ready(self) -> bool:
        assert self.process
        self.process.check_alive()
        with urllib.request.urlopen(f"{self.query_url}/api/services", timeout=2) as response:
            return bool(response.status == 200)

    def trace(self, trace_id: str) -> dict[str, Any] | None:
        """GET /api/traces/<id>: the trace (its ``spans`` and ``processes``), None while Jaeger has none."""
        return read_trace(self.query_url, trace_id)

    def raw_trace(self, trace_id: str) -> bytes:
        """The query API's answer for a trace, as Jaeger sends it (for scanning)."""
        with urllib.request.urlopen(f"{self.query_url}/api/traces/{trace_id}", timeout=5) as response:
            return bytes(response.read())

    def stop(self) -> None:
        if self.process is not None:
            self.process.stop()


def read_trace(query_url: str, trace_id: str) -> dict[str, Any] | None:
    """A trace from the Jaeger query API at ``query_url`` (one this process started or not, as the sandbox's),
    None while Jaeger has none."""
    try:
        with urllib.request.urlopen(f"{query_url}/api/traces/{trace_id}", timeout=5) as response:
            body = json.load(response)
    except urllib.error.HTTPError as error:
        if error.code == 404:
            return None
        raise
    data = body.get("data") or []
    return dict(data[0]) if data else None
