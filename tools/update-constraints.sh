#!/usr/bin/env bash
# Regenerate constraints.txt: every dependency of the base install and of every extra pinned,
# torch at the CPU wheel that .ci/run and the Dockerfile install first. CI, the Dockerfile and the
# README all install with `-c constraints.txt`, so image and tests resolve the same versions.
set -euo pipefail
cd "$(dirname "$0")/.."
pip install -q pip-tools
echo "torch==2.13.0" > .torch-pin.txt
trap 'rm -f .torch-pin.txt' EXIT
pip-compile -q --allow-unsafe --strip-extras --no-emit-index-url --no-emit-find-links \
  --extra train --extra dev --extra dp --extra infra --extra worldmodel --extra kms -c .torch-pin.txt \
  -o constraints.txt pyproject.toml
