#!/usr/bin/env bash
# Builds the otelcol-gpumetrics distribution (collector/builder-config.yaml) with the OpenTelemetry
# Collector Builder, from upstream modules through the Go module proxy, and caches the binary.
#
# The cache key is a SHA-256 over the manifest, this script, the builder version, the Go version
# and every non-test Go source, go.mod and go.sum of the collector/ module, so a rerun with
# nothing changed returns at once. The path of the binary is printed on the last stdout line;
# everything else goes to stderr.
#
# Environment:
#   XDG_CACHE_HOME / HOME   the cache lives in ${XDG_CACHE_HOME:-$HOME/.cache}/gpumetrics/
#   GPUMETRICS_OTELCOL_REBUILD=1   ignore a cached binary
set -euo pipefail

BUILDER_VERSION=v0.161.0   # keep equal to the Collector release pinned in builder-config.yaml

here=$(cd "$(dirname "$0")/.." && pwd)   # collector/
cache="${XDG_CACHE_HOME:-$HOME/.cache}/gpumetrics"
mkdir -p "$cache"
cd "$here"

key=$(
  {
    echo "builder $BUILDER_VERSION"
    go version
    sha256sum builder-config.yaml scripts/build-otelcol.sh go.mod go.sum
    find . -name '*.go' ! -name '*_test.go' ! -path './_build/*' ! -path '*/testdata/*' -print0 \
      | LC_ALL=C sort -z | xargs -0 sha256sum
  } | sha256sum | cut -c1-16
)
bin="$cache/otelcol-$key"

# One build at a time per cache (CI stages or developers may run this concurrently).
exec 9>"$cache/otelcol.lock"
flock 9

if [ -x "$bin" ] && [ -z "${GPUMETRICS_OTELCOL_REBUILD:-}" ]; then
  echo "build-otelcol.sh: cached $bin" >&2
  echo "$bin"
  exit 0
fi

builder="$cache/go-tools/builder-$BUILDER_VERSION/builder"
if [ ! -x "$builder" ]; then
  echo "build-otelcol.sh: installing the Collector Builder $BUILDER_VERSION" >&2
  GOBIN="$(dirname "$builder")" go install "go.opentelemetry.io/collector/cmd/builder@$BUILDER_VERSION" >&2
fi

echo "build-otelcol.sh: building otelcol-gpumetrics (cache key $key)" >&2
# _build sits inside the repository's work tree: no VCS stamping (it needs a usable git there).
export GOFLAGS="${GOFLAGS:+$GOFLAGS }-buildvcs=false"
start=$(date +%s)
rm -rf _build
"$builder" --config=builder-config.yaml >&2
echo "build-otelcol.sh: built in $(( $(date +%s) - start )) s" >&2

tmp=$(mktemp "$cache/.otelcol-XXXXXX")
cp _build/otelcol-gpumetrics "$tmp"
chmod 0755 "$tmp"
mv -f "$tmp" "$bin"
# Drop binaries built from other sources more than a day ago. Younger ones stay: other work
# trees of the same repository (or a CI stage still running) may be using them.
find "$cache" -maxdepth 1 -name 'otelcol-*' -type f ! -name "otelcol-$key" ! -name 'otelcol.lock' -mmin +1440 -delete
echo "$bin"
