# syntax=docker/dockerfile:1
#
# The durable-run runner: the SDK with its `s3`, `pod`, `otel` and `quotas` extras (pydantic,
# boto3, the kubernetes client, redis; no kopf), as uid 65532. It is the base for
# your workflow images:
#
#   FROM ghcr.io/durable-run/runner:0.1.0
#   COPY --chown=65532:65532 agents/ /app/agents/       # importable: /app is on PYTHONPATH
#
# and a DurableRun names `workflow: agents.research:run` and that image in
# spec.template (docs/install.md has the version with pip-installed dependencies).
# Build from the repository root:
#
#   docker build -f deploy/images/runner.Dockerfile -t ghcr.io/durable-run/runner:0.1.0 .
#
# Pin the base by digest when you publish:
# `--build-arg PYTHON_IMAGE=python:3.11.13-slim-bookworm@sha256:...`.
ARG PYTHON_IMAGE=python:3.11.13-slim-bookworm

FROM ${PYTHON_IMAGE} AS build
ENV PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1
RUN python -m venv /opt/durable-run
WORKDIR /src
COPY pyproject.toml README.md LICENSE ./
COPY hack/constraints.txt hack/constraints.txt
COPY runner/ runner/
# pyproject.toml declares both packages, so the build needs the operator's
# directory too; without kopf (the `operator` extra is not installed) it is inert.
COPY operator/ operator/
# The S3 store, the in-pod runner (`durablerun pod`) and tracing (OpenTelemetry); not the operator.
RUN /opt/durable-run/bin/pip install --constraint hack/constraints.txt ".[s3,pod,otel,quotas]"

FROM ${PYTHON_IMAGE}
COPY --from=build /opt/durable-run /opt/durable-run
# HOME is /tmp: the operator mounts an emptyDir there and keeps / read-only.
ENV PATH=/opt/durable-run/bin:$PATH \
    PYTHONUNBUFFERED=1 \
    PYTHONDONTWRITEBYTECODE=1 \
    PYTHONPATH=/app \
    HOME=/tmp
WORKDIR /app
# Numeric, so the kubelet can verify runAsNonRoot.
USER 65532:65532
# The operator sets the command of runner pods (`durablerun pod`) unless the
# run's template sets one; this default does the same.
ENTRYPOINT ["durablerun"]
CMD ["pod"]
