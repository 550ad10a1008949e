#!/usr/bin/env bash
# Fails when the checked-in generated code differs from what the .proto files produce.
set -euo pipefail
cd "$(dirname "$0")/.."
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
cp -r receiver/gpumetrics/v1 "$tmp/py-before"
./scripts/gen-proto.sh
if ! diff -r "$tmp/py-before" receiver/gpumetrics/v1 >/dev/null; then
  echo "generated Python code in receiver/gpumetrics/v1 is stale: run scripts/gen-proto.sh and commit" >&2
  diff -r "$tmp/py-before" receiver/gpumetrics/v1 >&2 || true
  exit 1
fi
echo "generated code is fresh"
