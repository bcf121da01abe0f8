# One image for every Lensemble role: the container runs `lensemble serve`, and LENSEMBLE_ROLE
# (coordinator | participant) picks the role at run time (contract: docs/architecture.md).
#
# One tag per CUDA line, built from this file with build arguments:
#   docker build -t lensemble:0.1.0-cpu .                                   # CPU (default)
#   docker build --build-arg TORCH_CUDA=cu126 -t lensemble:0.1.0-cu126 .    # NVIDIA driver >= 525
#   docker build --build-arg TORCH_CUDA=cu128 -t lensemble:0.1.0-cu128 .    # Blackwell, driver >= 570
# plus the immutable tag sha-<7 hex> of the commit (README, "Docker Compose"). Add
#   --build-arg VERSION=0.1.0 --build-arg REVISION=$(git rev-parse HEAD)
# for the OCI labels. scripts/docker-checks.sh builds and checks the CPU image.

# Pinned by version. Release builds pin the digest too:
#   --build-arg PYTHON_IMAGE=python:3.11.13-slim-bookworm@sha256:<digest>
# (`docker buildx imagetools inspect python:3.11.13-slim-bookworm` prints it). Python 3.11 is
# the interpreter constraints.txt is resolved for, so image and CI install the same versions.
ARG PYTHON_IMAGE=python:3.11.13-slim-bookworm

# ------------------------------------------------------------------------------ build stage
FROM ${PYTHON_IMAGE} AS build

# The CUDA line of torch: cpu, cu126, cu128, ... (one index per line on download.pytorch.org).
ARG TORCH_CUDA=cpu
# The torch requirement; the default is the version constraints.txt pins.
ARG TORCH_SPEC=torch==2.13.0

ENV PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PYTHONDONTWRITEBYTECODE=1

RUN python -m venv /opt/lensemble
ENV PATH=/opt/lensemble/bin:$PATH

# torch first, in its own layer: it is by far the largest download, and it changes only with
# TORCH_SPEC or TORCH_CUDA. --index-url (not --extra-index-url) keeps pip on the index of the
# chosen line, so PyPI's default build (a newer CUDA than many drivers support) never wins.
# TORCH_SPEC is the pin (torch==<version>), which hadolint cannot see through the ARG.
# hadolint ignore=DL3013
RUN pip install --index-url "https://download.pytorch.org/whl/${TORCH_CUDA}" "${TORCH_SPEC}"

WORKDIR /src
COPY pyproject.toml README.md constraints.txt ./
COPY runtime ./runtime

# The README's pinned install command. constraints.txt pins the CPU wheel (torch==<v>+cpu, what
# CI tests); for a CUDA line that pin would conflict with the torch installed above, so it is
# dropped and the torch layer's build stays. Every other dependency keeps its pin.
RUN if [ "${TORCH_CUDA}" != "cpu" ]; then sed -i '/^torch==/d' constraints.txt; fi \
    && pip install -c constraints.txt . \
    && pip check

# ---------------------------------------------------------------------------- runtime stage
FROM ${PYTHON_IMAGE} AS runtime

ARG VERSION=0.1.0
ARG REVISION=unknown
ARG SOURCE=https://github.com/lensemble/lensemble
ARG TORCH_CUDA=cpu

LABEL org.opencontainers.image.title="lensemble" \
      org.opencontainers.image.description="Federated world-model training across sovereign participants (DiLoCo); one image, role chosen by LENSEMBLE_ROLE." \
      org.opencontainers.image.licenses="Apache-2.0" \
      org.opencontainers.image.source="${SOURCE}" \
      org.opencontainers.image.revision="${REVISION}" \
      org.opencontainers.image.version="${VERSION}" \
      dev.lensemble.torch-cuda="${TORCH_CUDA}"

# A fixed, non-root user. Writable state lives only on mounted volumes: /var/lib/lensemble
# (run.output_dir in containers) and /tmp; the root filesystem can be read-only. A new named
# volume mounted at /var/lib/lensemble takes this folder's owner, so the user can write to it.
RUN groupadd --system --gid 10001 lensemble \
    && useradd --system --uid 10001 --gid 10001 --no-create-home \
       --home-dir /var/lib/lensemble --shell /usr/sbin/nologin lensemble \
    && install -d -o 10001 -g 10001 -m 0750 /var/lib/lensemble \
    && install -d -m 0755 /etc/lensemble /etc/lensemble/tls

COPY --from=build /opt/lensemble /opt/lensemble

# Unbuffered stdout so the ready line reaches `docker logs` at once; caches that libraries
# write (matplotlib, torch) go to /tmp, since the root filesystem may be read-only.
ENV PATH=/opt/lensemble/bin:$PATH \
    PYTHONUNBUFFERED=1 \
    PYTHONDONTWRITEBYTECODE=1 \
    HOME=/var/lib/lensemble \
    XDG_CACHE_HOME=/tmp/.cache \
    MPLCONFIGDIR=/tmp/matplotlib \
    TORCH_HOME=/tmp/torch \
    LENSEMBLE_CONFIG=/etc/lensemble/config.yaml

WORKDIR /var/lib/lensemble
USER 10001:10001

# gRPC (coordinator), gRPC health (every process), Prometheus metrics.
EXPOSE 50051 50052 9090

# Liveness through the standard gRPC health service on network.health_port (contract).
HEALTHCHECK --interval=10s --timeout=5s --start-period=60s --retries=3 \
    CMD ["lensemble", "health", "--port", "50052"]

# Graceful shutdown: the coordinator finishes or aborts the open round and checkpoints.
STOPSIGNAL SIGTERM

ENTRYPOINT ["lensemble"]
CMD ["serve"]
