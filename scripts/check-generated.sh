#!/usr/bin/env bash
# Fails when the checked-in generated code differs from what the .proto files produce.
set -euo pipefail
cd "$(dirname "$0")/.."
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
generated=(receiver/gpumetrics/v1 receiver/gpumetrics/processcontext receiver/gpumetrics/kubernetes/podresources/v1)
for dir in "${generated[@]}"; do
  mkdir -p "$tmp/before/$dir"
  cp -r "$dir/." "$tmp/before/$dir"
done
./scripts/gen-proto.sh
stale=0
for dir in "${generated[@]}"; do
  if ! diff -r "$tmp/before/$dir" "$dir" >/dev/null; then
    echo "generated Python code in $dir is stale: run scripts/gen-proto.sh and commit" >&2
    diff -r "$tmp/before/$dir" "$dir" >&2 || true
    stale=1
  fi
done
[ "$stale" -eq 0 ] || exit 1
echo "generated code is fresh"
