# One image for every Lensemble role: the container runs `lensemble serve`, and LENSEMBLE_ROLE
# (coordinator | participant) picks the role at run time (contract: docs/architecture.md).
#
# Needs BuildKit (RUN --mount). The easiest way is `lensemble image build`
# (docs/how-to/container-image.md), which picks a BuildKit-capable client, stages a minimal
# build context and passes the options below. By hand, from the repository root:
#   DOCKER_BUILDKIT=1 docker build -t lensemble:0.1.0-cpu .                  # CPU (default)
#   DOCKER_BUILDKIT=1 docker build --build-arg TORCH_CUDA=cu126 -t lensemble:0.1.0-cu126 .
#   DOCKER_BUILDKIT=1 docker build --build-arg TORCH_CUDA=cu128 -t lensemble:0.1.0-cu128 .
# plus the immutable tag sha-<7 hex> of the commit and, for the OCI labels,
#   --build-arg VERSION=0.1.0 --build-arg REVISION=$(git rev-parse HEAD)
#
# Build options (all optional; none of them ends up in a layer of the final image):
#   --build-arg BASE_IMAGE=...   the base: a registry image (default below), or a Debian base
#                                imported without a registry (`lensemble image base`)
#   wheelhouse/ in the context   wheels pip may take before the index (a local torch wheel)
#   --secret id=ca-bundle,src=F  extra CA certificates pip trusts (a TLS-intercepting proxy)
#   --build-arg PIP_INDEX_URL=.. a Python package index mirror (no credentials in the URL)
#   --build-arg TORCH_INDEX_URL= the torch index of the CUDA line, when no wheelhouse has torch

# Pinned by version. Release builds pin the digest too:
#   --build-arg BASE_IMAGE=python:3.11.13-slim-bookworm@sha256:<digest>
# Python 3.11 is the interpreter constraints.txt is resolved for, so image and CI install the
# same versions; the Debian bookworm base of `lensemble image base` has Python 3.11 too.
ARG BASE_IMAGE=python:3.11.13-slim-bookworm

# ------------------------------------------------------------------------ optional wheelhouse
# `wheelhouse*` matches nothing when the context has no wheelhouse/ folder; the stage then holds
# only constraints.txt. Its files are bind-mounted into the install steps, never copied into the
# final image.
FROM scratch AS wheelhouse
COPY constraints.txt wheelhouse* /wheelhouse/

# ------------------------------------------------------------------------------ build stage
FROM ${BASE_IMAGE} AS build

# The CUDA line of torch: cpu, cu126, cu128, ... (one index per line on download.pytorch.org).
ARG TORCH_CUDA=cpu
# The torch requirement; the default is the version constraints.txt pins.
ARG TORCH_SPEC=torch==2.13.0
ARG TORCH_INDEX_URL=https://download.pytorch.org/whl/${TORCH_CUDA}
# Empty: pip's default index.
ARG PIP_INDEX_URL=

ENV PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PIP_ROOT_USER_ACTION=ignore \
    PYTHONDONTWRITEBYTECODE=1

RUN python3 -m venv /opt/lensemble
# pip's trust and index for every install below: image/pip wraps the venv's pip (the
# base's CA store plus the optional ca-bundle secret, combined on a tmpfs, so that neither is
# written to any layer). It stays in this stage.
COPY image/pip /usr/local/lib/lensemble-build/pip
ENV PATH=/usr/local/lib/lensemble-build:/opt/lensemble/bin:$PATH

# torch first, in its own layer: it is by far the largest download, and it changes only with
# TORCH_SPEC or TORCH_CUDA. From the wheelhouse when it holds a torch wheel (the pinned +cpu
# build of constraints.txt), else from the index of the chosen line: --index-url (not
# --extra-index-url) keeps pip there, so PyPI's default build (a newer CUDA than many drivers
# support) never wins. TORCH_SPEC is the pin, which hadolint cannot see through the ARG.
# hadolint ignore=DL3013,SC2086
RUN --mount=type=bind,from=wheelhouse,source=/wheelhouse,target=/wheelhouse \
    --mount=type=secret,id=ca-bundle \
    --mount=type=tmpfs,target=/run/pip-ca \
    set -eu; \
    if ls /wheelhouse/torch-*.whl >/dev/null 2>&1; then \
      pip install --find-links /wheelhouse -c /wheelhouse/constraints.txt "${TORCH_SPEC}"; \
    else \
      pip install --index-url "${TORCH_INDEX_URL}" "${TORCH_SPEC}"; \
    fi; \
    # What only builds and tests need: C++ headers, test binaries, the bundled protoc.
    site=$(python3 -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])'); \
    rm -rf "$site/torch/include" "$site/torch/test" "$site/torch/share/cmake"; \
    find "$site/torch/bin" -type f ! -name torch_shm_manager -delete

WORKDIR /src
COPY pyproject.toml README.md constraints.txt ./
COPY runtime ./runtime

# The README's pinned install command. constraints.txt pins the CPU wheel (torch==<v>+cpu, what
# CI tests); for a CUDA line that pin would conflict with the torch installed above, so it is
# dropped and the torch layer's build stays. Every other dependency keeps its pin.
# hadolint ignore=SC2086
RUN --mount=type=bind,from=wheelhouse,source=/wheelhouse,target=/wheelhouse \
    --mount=type=secret,id=ca-bundle \
    --mount=type=tmpfs,target=/run/pip-ca \
    set -eu; \
    if [ "${TORCH_CUDA}" != "cpu" ]; then sed -i '/^torch==/d' constraints.txt; fi; \
    pip install -c constraints.txt '.[train,kms,dp]' --find-links /wheelhouse; \
    pip check

# ---------------------------------------------------------------------------- runtime stage
FROM ${BASE_IMAGE} AS runtime

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
# write (matplotlib, torch) go to /tmp, since the root filesystem may be read-only. Huge pages
# for model-sized buffers (torch's allocator and malloc; lensemble/machinery/hugepages.py says why).
ENV PATH=/opt/lensemble/bin:$PATH \
    PYTHONUNBUFFERED=1 \
    THP_MEM_ALLOC_ENABLE=1 \
    GLIBC_TUNABLES=glibc.malloc.hugetlb=1 \
    PYTHONDONTWRITEBYTECODE=1 \
    HOME=/var/lib/lensemble \
    XDG_CACHE_HOME=/tmp/.cache \
    MPLCONFIGDIR=/tmp/matplotlib \
    TORCH_HOME=/tmp/torch \
    LENSEMBLE_CONFIG=/etc/lensemble/config.yaml

WORKDIR /var/lib/lensemble
USER 10001:10001

# gRPC and model download (coordinator), gRPC health (every process), Prometheus metrics.
EXPOSE 50051 50053 50052 9090

# Liveness through the standard gRPC health service on network.health_port (contract).
HEALTHCHECK --interval=10s --timeout=10s --start-period=60s --retries=3 \
    CMD ["lensemble", "health", "--port", "50052"]

# Graceful shutdown: the coordinator finishes or aborts the open round and checkpoints.
STOPSIGNAL SIGTERM

# Open files: an image cannot set ulimits. The entrypoint (every lensemble process) raises its
# soft nofile limit to the hard one at start and logs both (event file_limit); Compose sets
# both to 8192 (ulimits), Kubernetes takes the container runtime's (docs/operations.md).

ENTRYPOINT ["lensemble"]
CMD ["serve"]
