#!/usr/bin/env bash
# Regenerate every generated Kubernetes file after a change to the chart, the config schema or a
# config in config/: the chart's values.schema.json, default config and README.md, then each
# overlay's base (and, for local, the kind cluster config and trust-domain pins).
set -euo pipefail
cd "$(dirname "$0")/.."
lensemble render chart-files
for env in local staging sovereign-prod; do
  lensemble render k8s --config "config/$env.yaml" --env "$env" --update-base >/dev/null
done
