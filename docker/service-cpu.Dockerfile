# syntax=docker/dockerfile:1
# DiSAN service on CPU only: the plain onnxruntime wheel, no CUDA, no torch. A small image for
# hosts without a GPU (and for scaling out on CPU nodes).
#
#   docker build -f docker/service-cpu.Dockerfile -t disan-serve:cpu .
#   docker run -p 8000:8000 disan-serve:cpu
ARG PYTHON_IMAGE=python:3.12-slim-bookworm

# ---------------------------------------------------------------------------------------------
# builder: a virtualenv holding the package and its `serve-cpu` and `tracing` extras; pip and build
# tools stay here.
FROM ${PYTHON_IMAGE} AS builder
ENV PIP_DISABLE_PIP_VERSION_CHECK=1
RUN python -m venv /opt/venv
ENV PATH=/opt/venv/bin:$PATH
WORKDIR /src
# Only what the package needs (see .dockerignore too): data and checkpoints never enter the image.
COPY pyproject.toml README.md ./
COPY disan/ disan/
COPY service/ service/
RUN --mount=type=cache,target=/root/.cache/pip \
    pip install "./[serve-cpu,tracing]" \
    && pip uninstall -y pip

# ---------------------------------------------------------------------------------------------
# runtime: the same slim python + the venv, running as an unprivileged user.
FROM ${PYTHON_IMAGE}
LABEL org.opencontainers.image.title="disan-serve (CPU)" \
      org.opencontainers.image.description="DiSAN sentence embeddings, NLI and sentiment over HTTP (onnxruntime, CPU)" \
      org.opencontainers.image.licenses="Apache-2.0"
RUN groupadd --system --gid 10001 disan \
    && useradd --system --uid 10001 --gid 10001 --no-create-home --shell /usr/sbin/nologin disan
COPY --from=builder /opt/venv /opt/venv
WORKDIR /app
# The shipped bundle, owned by root and read-only for the service user (compose can mount another
# bundle over it, read-only). The service verifies its sha256 hashes at start-up.
COPY models/default/ models/default/
COPY docker/healthcheck.py /app/healthcheck.py
# DISAN_* are service settings (service/settings.py); flags given to `disan serve` win over them.
ENV PATH=/opt/venv/bin:$PATH \
    PYTHONUNBUFFERED=1 \
    PYTHONDONTWRITEBYTECODE=1 \
    DISAN_BUNDLE=/app/models/default \
    DISAN_HOST=0.0.0.0 \
    DISAN_PORT=8000 \
    DISAN_PROVIDERS=cpu
# Numeric, so Kubernetes' runAsNonRoot can check it without reading /etc/passwd.
USER 10001:10001
EXPOSE 8000
# /ready is 503 until the bundle is loaded and warmed up.
HEALTHCHECK --interval=15s --timeout=5s --start-period=30s --retries=3 \
    CMD ["python", "/app/healthcheck.py"]
# The README's command. SIGTERM (docker stop) makes it stop accepting and drain in-flight batches.
CMD ["disan", "serve"]
