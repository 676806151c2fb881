# specgate container image: the gateway (`specgate serve`), the runtime only. With
# SPECGATE_LAB=true the same recipe adds the lab tools (specgate-lab, ./lab): the GPU-free
# vLLM emulator (`specgate emulate`) that the emulated engine pairs run (compose's
# emulated profile, deploy/k8s/engines/emulated-pair), the simulator, the bench.
#
#   docker build -t specgate:0.1.0 .
#   docker build --build-arg SPECGATE_LAB=true -t specgate-lab:0.1.0 .
#   docker run --rm -p 8000:8000 -v "$PWD/my-config.yaml:/etc/specgate/config.yaml:ro" specgate:0.1.0
#
# Plain Dockerfile syntax (no BuildKit-only features), so docker's classic builder,
# BuildKit and buildah all build it. The base is a build argument: any Debian-based image
# with Python >= 3.11, `python` on PATH, pip, venv and `useradd`. The default is pinned to
# an exact Python patch release; pin by digest as well with
#   docker build --build-arg PYTHON_IMAGE=python:3.12.8-slim-bookworm@sha256:<digest> .
# Without a registry, deploy/image/build.sh makes a Debian base with mmdebstrap and builds
# this file with buildah (or docker).
ARG PYTHON_IMAGE=python:3.12.8-slim-bookworm

# ---- stage 1: build the specgate wheel and a self-contained virtual environment -------
FROM ${PYTHON_IMAGE} AS build
# true: install the lab tools as well (the image the emulated engine pairs run).
ARG SPECGATE_LAB=false
ENV PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_ROOT_USER_ACTION=ignore
WORKDIR /src
# Only what the wheels need; .dockerignore keeps tests, caches and virtualenvs out.
COPY pyproject.toml README.md ./
COPY gateway ./gateway
COPY lab ./lab
# Build the wheel, then install it (and its pinned-by-range dependencies, all of which
# ship wheels: aiohttp, uvloop, pydantic-core, ...; with the peer channel's Redis client,
# both OTLP trace exporters (http/protobuf and gRPC) and the Kubernetes client that
# discovery from EndpointSlices uses) into /opt/specgate.
# The lab's wheel (no dependency of its own) joins only when SPECGATE_LAB=true; the runtime
# image is checked to hold no lab module.
# Byte-code is compiled here because the runtime root filesystem is read-only.
RUN python -m pip wheel --no-deps --wheel-dir /dist . ./lab \
 && python -m venv /opt/specgate \
 && set -- "$(ls /dist/specgate-*.whl)[peers,otlp,k8s]" \
 && if [ "$SPECGATE_LAB" = true ]; then set -- "$@" "$(ls /dist/specgate_lab-*.whl)"; fi \
 && /opt/specgate/bin/python -m pip install --only-binary=:all: "$@" \
 && /opt/specgate/bin/python -m pip uninstall -y pip setuptools wheel \
 && /opt/specgate/bin/python -c "import uvloop, aiohttp, pydantic, brotli, redis.asyncio, kubernetes_asyncio.watch, gateway.cli" \
 && /opt/specgate/bin/python -c "import opentelemetry.exporter.otlp.proto.grpc.trace_exporter, opentelemetry.exporter.otlp.proto.http.trace_exporter" \
 && if [ "$SPECGATE_LAB" = true ]; then /opt/specgate/bin/python -c "import specgate_lab.emulator.cli_emulate"; \
    else /opt/specgate/bin/python -c "import importlib.util as u, sys; sys.exit(u.find_spec('specgate_lab') is not None)"; fi \
 && python -m compileall -q /opt/specgate

# ---- stage 2: the runtime image ------------------------------------------------------
FROM ${PYTHON_IMAGE} AS runtime
LABEL org.opencontainers.image.title="specgate" \
      org.opencontainers.image.description="OpenAI-compatible gateway routing each request to a speculative or a plain vLLM engine" \
      org.opencontainers.image.licenses="Apache-2.0"

# A fixed numeric UID/GID, so Kubernetes' runAsNonRoot can verify it without /etc/passwd.
RUN groupadd --system --gid 10001 specgate \
 && useradd --system --uid 10001 --gid 10001 --no-create-home --home-dir /nonexistent \
      --shell /usr/sbin/nologin specgate

COPY --from=build /opt/specgate /opt/specgate
# Default configuration; mount your own over it (a file, a ConfigMap, a compose bind).
# Owned by root: the gateway's user can read it, not change it.
COPY deploy/compose/gateway.yaml /etc/specgate/config.yaml

# Configuration: the file above, overridable by SPECGATE_* environment variables
# (SPECGATE_SERVER__PORT=9000, SPECGATE_API_KEYS=client-key-1,client-key-2, SPECGATE_CONFIG=/path, ...).
# In a container the gateway must listen on all interfaces, whatever a mounted file
# says. SPECGATE_HEALTH_PORT only steers the HEALTHCHECK below, e.g. when the lab image
# runs `specgate emulate` on another port.
ENV PATH=/opt/specgate/bin:$PATH \
    PYTHONUNBUFFERED=1 \
    PYTHONDONTWRITEBYTECODE=1 \
    SPECGATE_SERVER__HOST=0.0.0.0 \
    SPECGATE_HEALTH_PORT=8000

USER 10001:10001
WORKDIR /tmp
EXPOSE 8000

# No curl in a slim image: Python's standard library does the probe. urlopen raises on
# connection errors and on any non-2xx answer, which makes the probe exit non-zero.
HEALTHCHECK --interval=10s --timeout=3s --start-period=15s --retries=3 \
  CMD ["python", "-c", "import os, urllib.request as r; r.urlopen('http://127.0.0.1:%s/health' % os.environ.get('SPECGATE_HEALTH_PORT', '8000'), timeout=2)"]

STOPSIGNAL SIGTERM
ENTRYPOINT ["specgate"]
CMD ["serve", "--config", "/etc/specgate/config.yaml"]
