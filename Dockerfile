# syntax=docker/dockerfile:1
# Bindery image: the operator (`bindery run`, the ENTRYPOINT) and the reference resource manager
# (`bindery rm serve`, used by the Helm chart with command: [bindery]).
#
# Two stages: the builder turns the source into wheels (the project's and all of its
# dependencies'); the final stage installs them offline from a bind mount, so neither the
# source, nor the wheels, nor a pip cache, nor any build tool end up in a layer of the image.
# tests/chart/test_dockerfile.py lints this file with hadolint and runs these exact RUN steps in
# a clean virtualenv, then runs the ENTRYPOINT with --help.

# The builder stage is never shipped, so it carries no OCI labels.
# hadolint ignore=DL3049
FROM python:3.11-slim AS builder
ENV PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PYTHONDONTWRITEBYTECODE=1
WORKDIR /src
# hatchling needs README.md (project.readme), contract/ and crds/ (force-included into the wheel as
# bindery/rm/openapi.yaml and bindery/controller/resourcemanagers.bindery.dev.yaml).
COPY pyproject.toml README.md ./
COPY contract/ contract/
COPY crds/ crds/
COPY operator/ operator/
RUN python -m pip wheel --wheel-dir /wheelhouse ".[rm,tracing]"

FROM python:3.11-slim
ARG VERSION=0.1.0
LABEL org.opencontainers.image.title="bindery" \
      org.opencontainers.image.description="Kubernetes scheduler that delegates placement to an external resource manager" \
      org.opencontainers.image.version="${VERSION}" \
      org.opencontainers.image.licenses="Apache-2.0" \
      org.opencontainers.image.source="https://github.com/bindery-dev/bindery" \
      org.opencontainers.image.documentation="https://github.com/bindery-dev/bindery#install" \
      org.opencontainers.image.base.name="docker.io/library/python:3.11-slim"
# HOME: UID 10001 has no passwd entry; /tmp is writable (an emptyDir in the chart, whose root
# filesystem is read-only), and ~/.kube/config is looked up there (absent: in-cluster config).
ENV PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    HOME=/tmp
# The wheels are bind-mounted from the builder for this one step, so they never become a layer.
# setuptools and wheel are build tools the runtime does not need.
RUN --mount=type=bind,from=builder,source=/wheelhouse,target=/wheelhouse \
    python -m pip install --no-index --find-links=/wheelhouse "kube-bindery[rm,tracing]==${VERSION}" \
    && python -m pip uninstall --yes setuptools wheel
# Numeric, so the kubelet can verify runAsNonRoot without reading /etc/passwd; matches the chart's
# podSecurityContext.runAsUser.
USER 10001:10001
EXPOSE 8080
ENTRYPOINT ["bindery", "run"]
