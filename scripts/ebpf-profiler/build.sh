#!/usr/bin/env bash
# Builds the OpenTelemetry eBPF profiler agent (go.opentelemetry.io/ebpf-profiler, the module's
# main package: the standalone `ebpf-profiler` that sends OTLP/gRPC profiles to a collector) at
# a pinned version, for the live-profiler end-to-end stage (docs/e2e.md), and caches the binary.
#
# The module comes from the Go module proxy (`go mod download`); it is copied to a scratch
# directory, memlock-eperm.patch (next to this script; what it changes and why is at its top) is
# applied to the copy, and the copy is built with its own go.mod and go.sum (CGO_ENABLED=0: the
# eBPF programs are prebuilt in the module, support/ebpf/tracer.ebpf.*). The module cache is
# never modified.
#
# The cache key is a SHA-256 over the version, this script, the patch and the Go version, so a
# rerun with nothing changed returns at once. The path of the binary is printed on the last
# stdout line; everything else goes to stderr.
#
# Environment:
#   XDG_CACHE_HOME / HOME   the cache lives in ${XDG_CACHE_HOME:-$HOME/.cache}/gpumetrics/
#   GPUMETRICS_EBPF_PROFILER_REBUILD=1   ignore a cached binary
set -euo pipefail

MODULE=go.opentelemetry.io/ebpf-profiler
VERSION=v0.0.202633   # the version docs/identity.md's rules were read from; keep them together

here=$(cd "$(dirname "$0")" && pwd)
patch="$here/memlock-eperm.patch"
cache="${XDG_CACHE_HOME:-$HOME/.cache}/gpumetrics"
mkdir -p "$cache"

key=$(
  {
    echo "$MODULE@$VERSION"
    go version
    sha256sum "$here/build.sh" "$patch" | cut -d' ' -f1
  } | sha256sum | cut -c1-16
)
bin="$cache/ebpf-profiler-$VERSION-$key"

# One build at a time per cache (several checkouts may share it).
exec 9>"$cache/ebpf-profiler.lock"
flock 9

if [ -x "$bin" ] && [ -z "${GPUMETRICS_EBPF_PROFILER_REBUILD:-}" ]; then
  echo "ebpf-profiler/build.sh: cached $bin" >&2
  echo "$bin"
  exit 0
fi

echo "ebpf-profiler/build.sh: downloading $MODULE@$VERSION" >&2
dir=$(cd "$cache" && go mod download -json "$MODULE@$VERSION" | sed -n 's/^[[:space:]]*"Dir": "\(.*\)",$/\1/p')
[ -n "$dir" ] && [ -d "$dir" ] || { echo "ebpf-profiler/build.sh: go mod download gave no directory" >&2; exit 1; }

scratch=$(mktemp -d "$cache/.ebpf-profiler-src-XXXXXX")
trap 'rm -rf "$scratch"' EXIT
cp -R "$dir/." "$scratch/"
chmod -R u+w "$scratch"
# git apply works outside a repository; the ceiling keeps it from finding one above the copy.
GIT_CEILING_DIRECTORIES="$(dirname "$scratch")" git -C "$scratch" apply -p1 "$patch"

echo "ebpf-profiler/build.sh: building (cache key $key)" >&2
start=$(date +%s)
tmp=$(mktemp "$cache/.ebpf-profiler-XXXXXX")
(cd "$scratch" && CGO_ENABLED=0 GOFLAGS="-mod=readonly -buildvcs=false" go build -trimpath -o "$tmp" .)
chmod 0755 "$tmp"
mv -f "$tmp" "$bin"
echo "ebpf-profiler/build.sh: built in $(( $(date +%s) - start )) s" >&2
# Keep the newest few binaries (about 60 MB each) for checkouts sharing the cache.
KEEP=3
find "$cache" -maxdepth 1 -name 'ebpf-profiler-v*' -type f -printf '%T@ %p\n' \
  | sort -rn | tail -n +$((KEEP + 1)) | cut -d' ' -f2- | xargs -r rm -f --
echo "$bin"
