# The gpumetrics sidecar image.
#
#   docker build -t gpumetrics .
#   docker run --rm --gpus all --pid host -v /proc:/host/proc:ro \
#     -e GPUMETRICS_PROC_ROOT=/host/proc gpumetrics
#   docker run --rm gpumetrics serve --simulate          # no GPU: the simulated 8-GPU node
#
# The image holds the sidecar and, for `--simulate` (demos, compose's simulated profile), the
# simulated NVML driver nvmlsim (its own distribution, nvmlsim/, installed as gpumetrics[sim]).
#
# NVML comes from the host driver: run with the NVIDIA container runtime (--gpus all, or
# runtimeClassName: nvidia in Kubernetes), which mounts libnvidia-ml and the device nodes.
# docs/deployment.md covers the PID namespace, mounts, privileges and probes.

FROM python:3.11-slim-bookworm AS build
# A C compiler for the optional compiled kernels of the OTLP encoder (setup.py); only this
# stage has it: the image gets the built extension, not the compiler.
# hadolint ignore=DL3008
RUN apt-get update \
    && apt-get install -y --no-install-recommends gcc libc6-dev \
    && rm -rf /var/lib/apt/lists/*
WORKDIR /src
COPY pyproject.toml setup.py README.md ./
COPY receiver/gpumetrics ./receiver/gpumetrics
COPY nvmlsim/pyproject.toml nvmlsim/README.md ./nvmlsim/
COPY nvmlsim/src ./nvmlsim/src
RUN python -m venv /opt/gpumetrics \
    && /opt/gpumetrics/bin/pip install --no-cache-dir --disable-pip-version-check ./nvmlsim '.[sim]'

FROM python:3.11-slim-bookworm
LABEL org.opencontainers.image.title="gpumetrics" \
      org.opencontainers.image.description="NVIDIA GPU metrics from NVML as OTLP over a gRPC pull endpoint" \
      org.opencontainers.image.licenses="Apache-2.0"
COPY --from=build /opt/gpumetrics /opt/gpumetrics
COPY examples/gpumetrics.yaml /etc/gpumetrics/gpumetrics.yaml
ENV PATH=/opt/gpumetrics/bin:$PATH \
    PYTHONUNBUFFERED=1 \
    PYTHONDONTWRITEBYTECODE=1 \
    NVIDIA_VISIBLE_DEVICES=all \
    NVIDIA_DRIVER_CAPABILITIES=utility \
    GPUMETRICS_CONFIG=/etc/gpumetrics/gpumetrics.yaml \
    GPUMETRICS_HEALTH_LISTEN=0.0.0.0:4320
# The durable store's directory (store.path, docs/deployment.md; off unless set): a named volume
# mounted here gets its owner, the image's user, so it is writable with a read-only root.
RUN install -d -m 0700 -o 10001 -g 10001 /var/lib/gpumetrics
# 4319: pull + profiler (loopback unless TLS is configured); 4320: plaintext gRPC health only.
EXPOSE 4319 4320
# Non-root by default. Reading other users' /proc/<pid>/environ (the procfs identity fallback)
# needs root with CAP_SYS_PTRACE; see docs/deployment.md.
USER 10001:10001
ENTRYPOINT ["gpumetrics"]
CMD ["serve"]
