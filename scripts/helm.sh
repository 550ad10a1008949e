#!/usr/bin/env bash
# Prints the path of a Helm binary (installs it first if needed): $HELM if set, else Helm
# HELM_VERSION built with `go install` from the Go module proxy into the user cache (a cold
# build downloads about 300 MB of modules and compiles for a few minutes; later calls return at
# once). Progress goes to stderr; the path is the only line on stdout.
set -euo pipefail
HELM_VERSION=v4.3.2
if [ -n "${HELM:-}" ]; then
  echo "$HELM"
  exit 0
fi
tools="${XDG_CACHE_HOME:-$HOME/.cache}/gpumetrics/go-tools/helm-$HELM_VERSION"
if [ ! -x "$tools/helm" ]; then
  mkdir -p "$tools"
  echo "helm.sh: building Helm $HELM_VERSION with go install (cached in $tools)" >&2
  # -ldflags: the version `helm version` reports (the Makefile sets it the same way)
  GOBIN="$tools" go install -ldflags "-X helm.sh/helm/v4/internal/version.version=$HELM_VERSION" \
    "helm.sh/helm/v4/cmd/helm@$HELM_VERSION" >&2
fi
echo "$tools/helm"
