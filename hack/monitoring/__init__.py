"""durable-run's alerts and Grafana dashboard, from one source (the kubernetes-mixin way).

``config`` holds what both share (selectors, thresholds, the runbook base URL),
``alerts`` builds the Prometheus rule groups, ``dashboard`` the Grafana
dashboard, and ``render`` turns them into the files ``hack/generate.py``
writes: deploy/monitoring/ and the chart's files/. ``rules_test.yaml`` beside
them holds the ``promtool test rules`` unit tests of the generated rules.
"""
