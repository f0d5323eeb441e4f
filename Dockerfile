# syntax=docker/dockerfile:1
# gpu-efficiency-operator image: one image for the operator (`gpu-efficiency run`, the default)
# and the node agent (`gpu-efficiency agent`).
#
#   docker build -t gpu-efficiency-operator:0.1.0 .
#
# The base is pinned by tag. For a release, pin it by digest as well so rebuilds are reproducible:
#   docker buildx imagetools inspect python:3.11-slim-bookworm   # prints "Digest: sha256:..."
#   docker build --build-arg PYTHON_IMAGE=python:3.11-slim-bookworm@sha256:<digest> .
ARG PYTHON_IMAGE=python:3.11-slim-bookworm

# --- 1. build the wheel of this package (no dependencies) -------------------------------------
FROM ${PYTHON_IMAGE} AS wheel
ENV PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PYTHONDONTWRITEBYTECODE=1
WORKDIR /src
COPY pyproject.toml README.md ./
COPY operator ./operator
RUN pip wheel --no-deps --wheel-dir /wheels .

# --- 2. install the wheel and its dependencies into a virtual environment ---------------------
FROM ${PYTHON_IMAGE} AS venv
ENV PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1
# The venv gets no pip or setuptools of its own: the stage's pip installs into it (--python).
RUN python -m venv --without-pip /opt/venv
# The dependencies come only from requirements.lock: every version pinned and every file checked
# against its sha256 (--require-hashes), so a re-published or tampered release fails the build.
# Regenerate it after changing pyproject's dependencies (see the file's header).
COPY requirements.lock /tmp/requirements.lock
# Binary wheels only: the runtime image has no compiler, so nothing may need one.
# pip byte-compiles here, so the read-only runtime never has to write .pyc files.
RUN pip --python /opt/venv/bin/python install --require-hashes --only-binary=:all: -r /tmp/requirements.lock
COPY --from=wheel /wheels /wheels
# Our own wheel without dependencies: they are all installed above, from the lock.
RUN pip --python /opt/venv/bin/python install --no-deps --only-binary=:all: /wheels/*.whl \
 && rm -rf /wheels /tmp/requirements.lock

# --- 3. runtime: non-root, no build tools, read-only root filesystem friendly ------------------
FROM ${PYTHON_IMAGE} AS runtime
ARG VERSION=0.1.0
LABEL org.opencontainers.image.title="gpu-efficiency-operator" \
      org.opencontainers.image.description="Finds idle and underused GPUs from DCGM signals and acts on them safely" \
      org.opencontainers.image.version="${VERSION}" \
      org.opencontainers.image.licenses="Apache-2.0"
# The system pip/setuptools are not needed at runtime.
RUN python -m pip uninstall -y pip setuptools wheel 2>/dev/null; rm -rf /root/.cache
COPY --from=venv /opt/venv /opt/venv
ENV PATH=/opt/venv/bin:$PATH \
    PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    HOME=/tmp
# 65532 is the conventional "nonroot" uid; the chart runs the operator with the same ids.
USER 65532:65532
WORKDIR /tmp
# 8080 operator /metrics, 8081 operator /healthz and /readyz, 9400 agent endpoints.
EXPOSE 8080 8081 9400
ENTRYPOINT ["gpu-efficiency"]
CMD ["run"]
