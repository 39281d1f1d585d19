"""The ingress's own metrics, counted by every route (and by the stream connections while they last)."""

from __future__ import annotations

from prometheus_client import Counter, Gauge, Histogram

REQUESTS = Counter("durablerun_webhook_requests", "Webhook requests by outcome.", ["outcome"])
LATENCY = Histogram("durablerun_webhook_request_seconds", "Time to answer a webhook request.",
                    buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5))
OUTCOMES = ("delivered", "duplicate", "unauthorized", "gone", "conflict", "bad_request", "too_large",
            "rate_limited", "error", "key_issued", "streamed", "stream_busy", "slow_reader")
STREAMS_OPEN = Gauge("durablerun_stream_connections", "Server-Sent Events connections open now.")
for _outcome in OUTCOMES:
    REQUESTS.labels(_outcome)
