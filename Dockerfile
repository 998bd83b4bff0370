# syntax=docker/dockerfile:1
# The webhook service: `make image` builds it (docker or podman; amd64 and arm64 where the builder
# can). Two stages: the first installs the locked dependencies (requirements.lock, every one
# checked against its sha256) and the service's wheel into a virtualenv; the second is a plain
# slim Python with that virtualenv copied in, no pip, no compilers, no tests, no sources but the
# package.
#
# The base, by tag: `make image` resolves the tag to its digest with the engine and builds from
# `python:3.11-slim-bookworm@sha256:...` (BASE_DIGEST= pins a digest you approved), and records
# both in the image's base.name/base.digest labels. No digest is written here: none could be
# checked from this repository's machines (no registry is reachable), and a digest copied from
# elsewhere would be a pin nobody verified.
#
# Why not distroless (gcr.io/distroless/python3-debian12): its Python is Debian 12's 3.11 at
# /usr/bin, while this virtualenv is made by, and its bin/python links to, the official image's
# 3.11 at /usr/local/bin. A virtualenv only runs on the interpreter, at the path, that made it,
# so the switch needs the first stage rebuilt on Debian's python3.11 (apt packages whose versions
# must match the ones distroless happened to ship), and distroless's python3 image states it has
# no ctypes support, which nothing here can check our compiled dependencies against without an
# engine to run the image. Until that is done and run once, the final stage is the slim image
# with its installer removed (it keeps dash and dpkg: docs/tasks/image.md).
ARG PYTHON_IMAGE=python:3.11-slim-bookworm

FROM ${PYTHON_IMAGE} AS build
WORKDIR /src
COPY requirements.lock pyproject.toml README.md ./
COPY webhook ./webhook
# Every dependency ships manylinux wheels (amd64 and arm64), so no compiler is needed here either:
# --only-binary makes a missing wheel an error rather than a build from source. The service's own
# wheel goes in without dependencies: the lock file brought them all.
RUN python -m venv /opt/webhook \
 && /opt/webhook/bin/pip install --no-cache-dir --no-compile --require-hashes --only-binary=:all: \
      -r requirements.lock \
 && python -m pip wheel --no-cache-dir --no-deps --wheel-dir /wheels . \
 && /opt/webhook/bin/pip install --no-cache-dir --no-compile --no-deps /wheels/*.whl \
 && /opt/webhook/bin/pip uninstall --yes pip setuptools \
 && /opt/webhook/bin/python -m compileall -q -j 0 --invalidation-mode unchecked-hash /opt/webhook/lib

FROM ${PYTHON_IMAGE}
# pyproject.toml's version: `make image` passes it, and `make stamp` writes it here for a plain
# `docker build` (tests/test_release.py fails while they differ).
ARG VERSION=0.1.0
ARG SOURCE=unknown
ARG PYTHON_IMAGE
ARG BASE_DIGEST=unresolved
LABEL org.opencontainers.image.title="trainjob-scheduling-webhook" \
      org.opencontainers.image.description="Gang and topology scheduling for Kubeflow TrainJobs: admission webhooks and reconciler" \
      org.opencontainers.image.version="${VERSION}" \
      org.opencontainers.image.source="${SOURCE}" \
      org.opencontainers.image.licenses="Apache-2.0" \
      org.opencontainers.image.base.name="${PYTHON_IMAGE}" \
      org.opencontainers.image.base.digest="${BASE_DIGEST}"
# No installer in the image: the base's pip, setuptools and wheel (their scripts, and all of its
# site-packages: the service runs from its own virtualenv) and ensurepip go; tests/test_image.py
# lists what may stay. The base ships the standard library without bytecode: compile it here, as
# the virtualenv was (hash-checked .pyc files stay valid whatever the copied files' times).
RUN rm -rf /usr/local/bin/pip* /usr/local/bin/wheel /usr/local/lib/python3.11/ensurepip \
           /usr/local/lib/python3.11/site-packages/* \
 && python -m compileall -q -j 0 --invalidation-mode unchecked-hash /usr/local/lib/python3.11
COPY --from=build /opt/webhook /opt/webhook
# A read-only root filesystem works: bytecode was compiled above, and the only thing written at
# run time (the self-managed certificate pair) goes under $TMPDIR, an emptyDir at /tmp.
ENV PATH=/opt/webhook/bin:$PATH \
    PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    HOME=/tmp \
    TMPDIR=/tmp
USER 65532:65532
WORKDIR /tmp
# webhooks (TLS), metrics (TLS), probes (HTTP)
EXPOSE 9443 8443 8081
ENTRYPOINT ["/opt/webhook/bin/trainjob-scheduling-webhook", "serve"]
