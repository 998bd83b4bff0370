# syntax=docker/dockerfile:1
# The webhook service: `make image` builds it (docker or podman). Two stages: the first builds the
# wheel and installs it with its dependencies into a virtualenv; the second is a plain slim Python
# with that virtualenv copied in, no pip, no compilers, no tests, no sources but the package.
ARG PYTHON_IMAGE=python:3.11-slim-bookworm

FROM ${PYTHON_IMAGE} AS build
WORKDIR /src
COPY pyproject.toml README.md ./
COPY webhook ./webhook
# Every dependency ships manylinux wheels (amd64 and arm64), so no compiler is needed here either.
RUN python -m pip wheel --no-cache-dir --no-deps --wheel-dir /wheels . \
 && python -m venv /opt/webhook \
 && /opt/webhook/bin/pip install --no-cache-dir --no-compile /wheels/*.whl \
 && /opt/webhook/bin/pip uninstall --yes pip setuptools \
 && /opt/webhook/bin/python -m compileall -q -j 0 --invalidation-mode unchecked-hash /opt/webhook/lib

FROM ${PYTHON_IMAGE}
ARG VERSION=0.1.0
ARG SOURCE=unknown
LABEL org.opencontainers.image.title="trainjob-scheduling-webhook" \
      org.opencontainers.image.description="Gang and topology scheduling for Kubeflow TrainJobs: admission webhooks and reconciler" \
      org.opencontainers.image.version="${VERSION}" \
      org.opencontainers.image.source="${SOURCE}" \
      org.opencontainers.image.licenses="Apache-2.0"
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
