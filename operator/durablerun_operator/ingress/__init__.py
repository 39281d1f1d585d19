"""The webhook ingress: authenticated HTTP POSTs become events on DurableRuns (docs/web.md).

An optional component with a Deployment and ServiceAccount of its own, run as
``python -m durablerun_operator.ingress``. ``auth`` checks capability tokens and
per-source signatures (pure), ``server`` serves HTTP, and the operator's ``kube``
module is the only one that talks to the API server.
"""
