# syntax=docker/dockerfile:1
#
# The durable-run operator: `python -m durablerun_operator`, as uid 65532.
# Build from the repository root (operator.Dockerfile.dockerignore keeps the
# context to what the build needs):
#
#   docker build -f deploy/images/operator.Dockerfile -t ghcr.io/durable-run/operator:0.1.0 .
#
# Installs the project with its `operator` extra (kopf, the kubernetes client,
# prometheus-client) at the versions the test suite ran with
# (hack/constraints.txt). Pin the base by digest when you publish:
# `--build-arg PYTHON_IMAGE=python:3.11.13-slim-bookworm@sha256:...`.
ARG PYTHON_IMAGE=python:3.11.13-slim-bookworm

FROM ${PYTHON_IMAGE} AS build
ENV PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1
RUN python -m venv /opt/durable-run
WORKDIR /src
COPY pyproject.toml README.md LICENSE ./
COPY hack/constraints.txt hack/constraints.txt
COPY runner/ runner/
COPY operator/ operator/
RUN /opt/durable-run/bin/pip install --constraint hack/constraints.txt ".[operator,otel,quotas,s3]"

FROM ${PYTHON_IMAGE}
COPY --from=build /opt/durable-run /opt/durable-run
# HOME is /tmp: the chart mounts an emptyDir there and keeps / read-only.
ENV PATH=/opt/durable-run/bin:$PATH \
    PYTHONUNBUFFERED=1 \
    PYTHONDONTWRITEBYTECODE=1 \
    HOME=/tmp
WORKDIR /tmp
# Numeric, so the kubelet can verify runAsNonRoot.
USER 65532:65532
EXPOSE 8080 9090
# The chart sets the same command explicitly (and the arguments).
ENTRYPOINT ["python", "-m", "durablerun_operator"]
