# syntax=docker/dockerfile:1
# Training / export image: CUDA PyTorch + the `train` extra (plus onnxruntime CPU for export
# verification and `disan eval`). Runs `disan train`, `disan export`, `disan eval` against a
# mounted data directory; see the `train` service in docker-compose.yml.
#
#   docker build -f docker/train.Dockerfile -t disan-train .
#   docker run --gpus all -v "$PWD/../shared/data:/data:ro" -v "$PWD/runs:/runs" disan-train \
#       train --help
#
# The official PyTorch image brings CUDA 12.6 + cuDNN 9 and torch 2.13.0 (inside the `train`
# extra's range), so pip keeps that torch instead of pulling another build.
ARG TORCH_IMAGE=pytorch/pytorch:2.13.0-cuda12.6-cudnn9-runtime
FROM ${TORCH_IMAGE}
LABEL org.opencontainers.image.title="disan-train" \
      org.opencontainers.image.description="Train, export and evaluate DiSAN models (PyTorch, CUDA)" \
      org.opencontainers.image.licenses="Apache-2.0"
ENV PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PYTHONUNBUFFERED=1 \
    PYTHONDONTWRITEBYTECODE=1
WORKDIR /src
# Only what the package needs (see .dockerignore too): data and checkpoints are mounted, never copied.
COPY pyproject.toml README.md ./
COPY disan/ disan/
COPY model_export/ model_export/
COPY service/ service/
# The constraint pins torch to the base image's CUDA build so the install cannot swap it out.
RUN python -c "import torch; print(f'torch=={torch.__version__}')" > /tmp/torch-constraint.txt \
    && pip install --no-cache-dir -c /tmp/torch-constraint.txt "./[train,serve-cpu]" \
    && rm /tmp/torch-constraint.txt \
    && groupadd --system --gid 10001 disan \
    && useradd --system --uid 10001 --gid 10001 --no-create-home --shell /usr/sbin/nologin disan \
    && mkdir -p /data /runs /out \
    && chown 10001:10001 /runs /out
# /data: datasets (mount read-only); /runs: checkpoints, metrics, curves; /out: exported bundles.
# Named volumes inherit the ownership above; with bind mounts compose runs as the host user instead.
# (No VOLUME instruction: it would leave an anonymous volume behind on every `docker run`.)
WORKDIR /runs
# DISAN_DATA: default --data of `disan train` (the mounted data set). HOME=/runs: the container
# may run as any uid (compose passes the host user's), so caches (~/.cache/disan for derived word
# vectors, matplotlib's config) go to the writable, persistent /runs instead of a missing home.
ENV DISAN_DATA=/data \
    HOME=/runs
# Numeric, so Kubernetes' runAsNonRoot can check it without reading /etc/passwd.
USER 10001:10001
# A batch job, not a server: nothing to probe.
HEALTHCHECK NONE
ENTRYPOINT ["disan"]
CMD ["train", "--help"]
