"""Prometheus and promtool from Debian's packages, started by the test bed."""

from __future__ import annotations

import subprocess
from collections.abc import Iterator

import pytest
from prometheus_client import CollectorRegistry, Gauge, start_http_server

from durablerun_testbed import binaries, procs
from tests.helpers.session import StartPrometheus


@pytest.fixture
def exporter() -> Iterator[tuple[int, Gauge]]:
    registry = CollectorRegistry()
    gauge = Gauge("durablerun_testbed_probe", "A value the test sets.", registry=registry)
    port = procs.free_port()
    server, thread = start_http_server(port, addr="127.0.0.1", registry=registry)
    yield port, gauge
    server.shutdown()
    thread.join()


def test_prometheus_scrapes_a_target(
    start_prometheus: StartPrometheus, exporter: tuple[int, Gauge]
) -> None:
    port, gauge = exporter
    gauge.set(42)
    prometheus = start_prometheus([f"127.0.0.1:{port}"])
    result = procs.wait_for(lambda: prometheus.query("durablerun_testbed_probe"),
                            timeout=30, what="the scraped sample")
    assert result[0]["value"][1] == "42"


def test_promtool_is_installed() -> None:
    out = subprocess.run([str(binaries.find("promtool")), "--version"], capture_output=True, text=True, check=True)
    assert "promtool" in out.stdout + out.stderr
