"""An operator's /metrics, scraped, and one run's sample in it."""

from __future__ import annotations

import urllib.request

from prometheus_client.parser import text_string_to_metric_families

from tests.helpers.runs import Operator


def scrape(operator: Operator) -> dict[tuple[str, frozenset[tuple[str, str]]], float]:
    with urllib.request.urlopen(f"http://127.0.0.1:{operator.metrics_port}/metrics", timeout=5) as reply:
        text = reply.read().decode()
    return {(s.name, frozenset(s.labels.items())): s.value
            for family in text_string_to_metric_families(text) for s in family.samples}


def run_metric(samples: dict[tuple[str, frozenset[tuple[str, str]]], float], metric: str, namespace: str,
               name: str, **labels: str) -> float | None:
    key = (metric, frozenset({"namespace": namespace, "name": name, **labels}.items()))
    return samples.get(key)
