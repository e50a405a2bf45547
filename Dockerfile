# syntax=docker/dockerfile:1
# Bindery image: the operator (`bindery run`, the ENTRYPOINT) and the reference resource manager
# (`bindery rm serve`, used by the Helm chart with command: [bindery]).
#
# Two stages: the builder makes a virtualenv in /opt/bindery holding exactly the packages of
# requirements.lock (hash-checked, binary wheels only) and the project itself, then removes pip and
# setuptools from it; the final stage copies only that virtualenv onto a clean base, so neither the
# source, nor wheels, nor a pip cache, nor any build tool end up in a layer of the image.
# scripts/image builds this same file daemonless (buildah) and tests/image runs the result.
#
# BASE_IMAGE: the Python the image runs on. The default is the official python:3.11-slim (Debian
# bookworm), pinned by digest: docker.io/library/python:3.11.10-slim-bookworm@sha256:5148c0e4…,
# the digest several public Dockerfiles pin (nalabelle/build images/digests.Dockerfile, and others
# building it for arm64 too, so a multi-arch index). It was read there, not pulled: the machines
# that test this image reach no registry, so scripts/image passes a locally made Debian bookworm
# base with python3 (3.11) instead. Any base with python3 >= 3.11 and its venv module works.
ARG BASE_IMAGE=docker.io/library/python:3.11.10-slim-bookworm@sha256:5148c0e4bbb64271bca1d3322360ebf4bfb7564507ae32dd639322e4952a6b16

# The builder stage is never shipped, so it carries no OCI labels.
# hadolint ignore=DL3049
FROM ${BASE_IMAGE} AS builder
ENV PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1
WORKDIR /src
# The dependencies first, so that a source change does not download them again.
COPY requirements.lock ./
RUN python3 -m venv /opt/bindery \
    && /opt/bindery/bin/python -m pip install --require-hashes --only-binary=:all: --no-deps \
        -r requirements.lock
# hatchling needs README.md (project.readme), contract/ and crds/ (force-included into the wheel as
# bindery/rm/openapi.yaml and bindery/controller/resourcemanagers.bindery.dev.yaml).
COPY pyproject.toml README.md ./
COPY contract/ contract/
COPY crds/ crds/
COPY operator/ operator/
# --no-deps: the lock is the whole dependency set; `pip check` fails the build if it does not
# satisfy the project's requirements. pip and setuptools are build tools the runtime does not need.
RUN /opt/bindery/bin/python -m pip install --no-deps . \
    && /opt/bindery/bin/python -m pip check \
    && /opt/bindery/bin/python -m pip uninstall --yes pip setuptools

FROM ${BASE_IMAGE}
ARG BASE_IMAGE
ARG VERSION=0.1.0
LABEL org.opencontainers.image.title="bindery" \
      org.opencontainers.image.description="Kubernetes scheduler that delegates placement to an external resource manager" \
      org.opencontainers.image.version="${VERSION}" \
      org.opencontainers.image.licenses="Apache-2.0" \
      org.opencontainers.image.source="https://github.com/bindery-dev/bindery" \
      org.opencontainers.image.documentation="https://github.com/bindery-dev/bindery#install" \
      org.opencontainers.image.base.name="${BASE_IMAGE}"
# HOME: UID 10001 has no passwd entry; /tmp is writable (an emptyDir in the chart, whose root
# filesystem is read-only), and ~/.kube/config is looked up there (absent: in-cluster config).
ENV PATH=/opt/bindery/bin:$PATH \
    PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    HOME=/tmp
# Only the virtualenv: its python is a symlink to the base's python3, the same in both stages.
COPY --from=builder /opt/bindery /opt/bindery
# Numeric, so the kubelet can verify runAsNonRoot without reading /etc/passwd; matches the chart's
# podSecurityContext.runAsUser.
USER 10001:10001
EXPOSE 8080
ENTRYPOINT ["bindery", "run"]
