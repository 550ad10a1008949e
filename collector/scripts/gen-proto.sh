#!/usr/bin/env bash
# Regenerates the Go code for proto/gpumetrics/v1/*.proto into collector/internal/gpumetricsv1/.
#
# Deterministic: the compiler is the protoc bundled with grpcio-tools (pinned in pyproject.toml's
# `test` extra), the plugins are installed with `go install` at the versions below into a
# per-version cache directory. CI checks freshness by running this and diffing
# (collector/scripts/test.sh).
#
# Environment:
#   PYTHON   Python interpreter with grpcio-tools installed (default: the repository's .venv,
#            else `python3` on PATH).
set -euo pipefail

PROTOC_GEN_GO_VERSION=v1.36.12       # keep equal to google.golang.org/protobuf in collector/go.mod
PROTOC_GEN_GO_GRPC_VERSION=v1.6.2

here=$(cd "$(dirname "$0")/.." && pwd)   # collector/
repo=$(cd "$here/.." && pwd)

if [ -z "${PYTHON:-}" ]; then
  if [ -x "$repo/.venv/bin/python" ]; then PYTHON="$repo/.venv/bin/python"; else PYTHON=python3; fi
fi
if ! "$PYTHON" -c 'import grpc_tools.protoc' 2>/dev/null; then
  echo "gen-proto.sh: $PYTHON has no grpcio-tools; install the project's test extra (pip install -e '.[test]') or set PYTHON" >&2
  exit 1
fi

tools="${XDG_CACHE_HOME:-$HOME/.cache}/gpumetrics/go-tools/protoc-gen-go-$PROTOC_GEN_GO_VERSION-grpc-$PROTOC_GEN_GO_GRPC_VERSION"
if [ ! -x "$tools/protoc-gen-go" ] || [ ! -x "$tools/protoc-gen-go-grpc" ]; then
  mkdir -p "$tools"
  GOBIN="$tools" go install "google.golang.org/protobuf/cmd/protoc-gen-go@$PROTOC_GEN_GO_VERSION"
  GOBIN="$tools" go install "google.golang.org/grpc/cmd/protoc-gen-go-grpc@$PROTOC_GEN_GO_GRPC_VERSION"
fi

out="$here/internal/gpumetricsv1"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
cd "$repo/proto"
"$PYTHON" -m grpc_tools.protoc -I. \
  --plugin=protoc-gen-go="$tools/protoc-gen-go" \
  --plugin=protoc-gen-go-grpc="$tools/protoc-gen-go-grpc" \
  --go_out="$tmp" --go_opt=module=github.com/gpumetrics/gpumetrics/collector \
  --go-grpc_out="$tmp" --go-grpc_opt=module=github.com/gpumetrics/gpumetrics/collector \
  gpumetrics/v1/*.proto
rm -rf "$out"
mkdir -p "$(dirname "$out")"
mv "$tmp/internal/gpumetricsv1" "$out"
