#!/usr/bin/env bash
# Every check that needs a Docker host, in one script. Our CI machines have no Docker engine, so
# there the image and the Compose stack are only checked statically (tests/compose); run this on
# a machine with Docker (and its Compose plugin, or docker-compose) before a release:
#
#   . .venv/bin/activate && scripts/docker-checks.sh
#
# It builds the CPU image, checks it runs as the non-root user with a read-only root filesystem,
# that its healthcheck turns healthy, then brings the rendered Compose stack up with
# `lensemble up` (a short run), tears it down with `lensemble down`, and checks that a second
# `down` finds nothing to tear down. Exits non-zero at the first failing check.
set -euo pipefail
cd "$(dirname "$0")/.."

command -v lensemble >/dev/null || { echo "lensemble is not installed (see README)" >&2; exit 4; }
docker info >/dev/null 2>&1 || { echo "no Docker engine is reachable (docker info)" >&2; exit 4; }

VERSION=$(python3 -c 'import tomllib; print(tomllib.load(open("pyproject.toml", "rb"))["project"]["version"])')
REVISION=$(git rev-parse HEAD 2>/dev/null || echo unknown)
IMAGE="lensemble:${VERSION}-cpu"
WORK=$(mktemp -d)
HEALTH_CONTAINER="lensemble-health-check-$$"

cleanup() {
  docker rm -f "$HEALTH_CONTAINER" >/dev/null 2>&1 || true
  docker volume rm "$HEALTH_CONTAINER" >/dev/null 2>&1 || true
  lensemble down --dir "$WORK/stack" --volumes >/dev/null 2>&1 || true
  rm -rf "$WORK"
}
trap cleanup EXIT

step() { printf '\n== %s\n' "$*"; }

step "build $IMAGE (and sha-${REVISION:0:7})"
docker build --build-arg TORCH_CUDA=cpu --build-arg VERSION="$VERSION" \
  --build-arg REVISION="$REVISION" -t "$IMAGE" -t "lensemble:sha-${REVISION:0:7}" .

step "OCI labels"
label() { docker image inspect --format "{{index .Config.Labels \"org.opencontainers.image.$1\"}}" "$IMAGE"; }
test "$(label revision)" = "$REVISION"
test "$(label version)" = "$VERSION"

step "runs as UID 10001 with a read-only root filesystem"
test "$(docker run --rm --read-only --tmpfs /tmp --entrypoint id "$IMAGE" -u)" = 10001
docker run --rm --read-only --tmpfs /tmp "$IMAGE" --version
docker run --rm --read-only --tmpfs /tmp -v "$PWD/config:/cfg:ro" "$IMAGE" \
  config validate /cfg/staging.yaml
docker run --rm --read-only --tmpfs /tmp --entrypoint python "$IMAGE" \
  -c 'import torch, lensemble; print("torch", torch.__version__)'

step "the coordinator's healthcheck turns healthy"
lensemble render compose --config config/local.yaml --set federation.transport=network \
  -o "$WORK/health/compose.yaml"
lensemble certs init "$WORK/health/certs" --config "$WORK/health/lensemble.yaml"
chmod 700 "$WORK/health/certs" && chmod -R a+rX "$WORK/health/certs"/*/
docker run -d --name "$HEALTH_CONTAINER" --read-only --tmpfs /tmp --cap-drop ALL \
  -e LENSEMBLE_ROLE=coordinator \
  -v "$WORK/health/lensemble.yaml:/etc/lensemble/config.yaml:ro" \
  -v "$WORK/health/certs/coordinator:/etc/lensemble/tls:ro" \
  -v "$HEALTH_CONTAINER:/var/lib/lensemble" "$IMAGE" >/dev/null
status=starting
for _ in $(seq 1 60); do
  status=$(docker inspect --format '{{.State.Health.Status}}' "$HEALTH_CONTAINER")
  [ "$status" = healthy ] && break
  [ "$(docker inspect --format '{{.State.Running}}' "$HEALTH_CONTAINER")" = true ] || break
  sleep 3
done
if [ "$status" != healthy ]; then
  docker logs "$HEALTH_CONTAINER" | tail -20 >&2
  echo "the healthcheck did not turn healthy (status: $status)" >&2
  exit 1
fi
docker rm -f "$HEALTH_CONTAINER" >/dev/null

step "Compose v2 accepts the committed file"
if docker compose version >/dev/null 2>&1; then
  docker compose -f deploy/compose/compose.yaml config -q
else
  echo "skipped: no Compose v2 plugin (docker-compose is used instead)"
fi

step "lensemble up: the stack comes up, every ready line arrives, two rounds finish"
lensemble up --substrate compose --config config/local.yaml \
  --set federation.transport=network --set federation.rounds=2 --set federation.inner_steps=2 \
  --dir "$WORK/stack"

step "lensemble down tears down exactly once"
lensemble down --dir "$WORK/stack" --volumes
lensemble down --dir "$WORK/stack" | grep -q "nothing to tear down"

step "all Docker checks passed"
