# syntax=docker/dockerfile:1
# DiSAN service on an NVIDIA GPU: onnxruntime-gpu (CUDA execution provider), no torch.
#
#   docker build -f docker/service-gpu.Dockerfile -t disan-serve:gpu .
#   docker run --gpus all -p 8000:8000 disan-serve:gpu
#
# The CUDA major must match the onnxruntime-gpu pin in pyproject.toml: onnxruntime-gpu 1.31 is built
# for CUDA 13.0 + cuDNN 9 (1.27 and later need CUDA 13, up to 1.26 CUDA 12). A 13.0 runtime runs on
# every driver that supports CUDA 13 (>= 580). Ubuntu 24.04's python3 is 3.12 (>= 3.11).
# CUDA_IMAGE can name any base with python3 and apt-get: docker/ci-containers.sh builds this file on
# a machine without a GPU from a locally bootstrapped Debian base (docs/containers.md).
ARG CUDA_IMAGE=nvidia/cuda:13.0.2-cudnn-runtime-ubuntu24.04

# ---------------------------------------------------------------------------------------------
# builder: a virtualenv holding the package and its `serve` and `tracing` extras. pip, setuptools and the
# build-isolation environments stay in this stage; only /opt/venv is copied out.
FROM ${CUDA_IMAGE} AS builder
ENV DEBIAN_FRONTEND=noninteractive \
    PIP_DISABLE_PIP_VERSION_CHECK=1
# hadolint ignore=DL3008
RUN apt-get update \
    && apt-get install -y --no-install-recommends python3 python3-venv \
    && rm -rf /var/lib/apt/lists/*
# Apt versions are left to the pinned base image: pinning them breaks the build whenever
# Ubuntu ships a security update (that is what the DL3008 ignore above is for).
RUN python3 -m venv /opt/venv
ENV PATH=/opt/venv/bin:$PATH
WORKDIR /src
# Only what the package needs (see .dockerignore too): data and checkpoints never enter the image.
COPY pyproject.toml README.md ./
COPY disan/ disan/
COPY service/ service/
# A regular (non-editable) install: the image does not need the source tree afterwards.
RUN --mount=type=cache,target=/root/.cache/pip \
    pip install "./[serve,tracing]" \
    && pip uninstall -y pip

# ---------------------------------------------------------------------------------------------
# runtime: CUDA/cuDNN libraries + python3 + the venv, running as an unprivileged user.
FROM ${CUDA_IMAGE}
LABEL org.opencontainers.image.title="disan-serve (GPU)" \
      org.opencontainers.image.description="DiSAN sentence embeddings, NLI and sentiment over HTTP (onnxruntime-gpu)" \
      org.opencontainers.image.licenses="Apache-2.0"
ENV DEBIAN_FRONTEND=noninteractive
# Same python3 package as the builder, so the venv's interpreter symlink resolves.
# hadolint ignore=DL3008
RUN apt-get update \
    && apt-get install -y --no-install-recommends python3 \
    && rm -rf /var/lib/apt/lists/* \
    && groupadd --system --gid 10001 disan \
    && useradd --system --uid 10001 --gid 10001 --no-create-home --shell /usr/sbin/nologin disan
COPY --from=builder /opt/venv /opt/venv
WORKDIR /app
# The shipped bundle, owned by root and read-only for the service user (compose can mount another
# bundle over it, read-only). The service verifies its sha256 hashes at start-up.
COPY models/default/ models/default/
COPY docker/healthcheck.py /app/healthcheck.py
# DISAN_* are service settings (service/settings.py); flags given to `disan serve` win over them.
# DISAN_PROVIDERS=auto uses CUDA when it really loads (container started with a GPU), else CPU;
# docker-compose.yml sets `cuda` so a host without a working GPU fails loudly instead.
ENV PATH=/opt/venv/bin:$PATH \
    PYTHONUNBUFFERED=1 \
    PYTHONDONTWRITEBYTECODE=1 \
    DISAN_BUNDLE=/app/models/default \
    DISAN_HOST=0.0.0.0 \
    DISAN_PORT=8000 \
    DISAN_PROVIDERS=auto
# Numeric, so Kubernetes' runAsNonRoot can check it without reading /etc/passwd.
USER 10001:10001
EXPOSE 8000
# /ready is 503 until the bundle is loaded and warmed up; start-period covers CUDA initialisation.
HEALTHCHECK --interval=15s --timeout=5s --start-period=60s --retries=3 \
    CMD ["python", "/app/healthcheck.py"]
# The README's command. SIGTERM (docker stop) makes it stop accepting and drain in-flight batches.
CMD ["disan", "serve"]
