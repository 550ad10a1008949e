#!/usr/bin/env bash
# Prints the path of a Prometheus binary (builds it first if needed): $PROMETHEUS if set, else
# Prometheus built from the Go module proxy at the version tests/e2e/prometheus/go.mod pins
# (the one docker-compose.yaml runs), cached in the user cache by a hash of that go.mod and
# go.sum. It is built with the remove_all_sd tag (only static, file and HTTP service discovery:
# the compose configuration scrapes static targets), which leaves out the cloud SDKs. A cold
# build downloads about 500 MB of modules and compiles for several minutes on 2 cores (10.5
# minutes measured on a loaded machine); later calls return at once. Progress goes to stderr;
# the path is the only line on stdout. Used by tests/e2e/test_compose.py (docs/e2e.md).
set -euo pipefail
if [ -n "${PROMETHEUS:-}" ]; then
  echo "$PROMETHEUS"
  exit 0
fi
here=$(cd "$(dirname "$0")/.." && pwd)
module="$here/tests/e2e/prometheus"
command -v go >/dev/null || { echo "prometheus.sh: no Go toolchain (go) to build Prometheus with" >&2; exit 1; }
version=$(cd "$module" && go list -m -f '{{.Version}}' github.com/prometheus/prometheus)
# Prometheus 3.x is tagged v0.3MM.P as a Go module: v0.316.0 is Prometheus 3.16.0.
release=$(printf '%s' "$version" | sed -E 's/^v0\.3([0-9][0-9])\.([0-9]+)$/3.\1.\2/; s/^3\.0([0-9])/3.\1/')
digest=$(cat "$module/go.mod" "$module/go.sum" | sha256sum | cut -c1-16)
tools="${XDG_CACHE_HOME:-$HOME/.cache}/gpumetrics/go-tools/prometheus-$release-$digest"
if [ ! -x "$tools/prometheus" ]; then
  mkdir -p "$tools"
  echo "prometheus.sh: building Prometheus $release ($version) from the Go module proxy (cached in $tools)" >&2
  # -ldflags: what `prometheus --version` reports (Prometheus' .promu.yml sets the same variable)
  (cd "$module" && go build -trimpath -tags remove_all_sd \
    -ldflags "-X github.com/prometheus/common/version.Version=$release" \
    -o "$tools/prometheus.partial" github.com/prometheus/prometheus/cmd/prometheus) >&2
  mv "$tools/prometheus.partial" "$tools/prometheus"
fi
echo "$tools/prometheus"
