#!/usr/bin/env bash
# Validates the Kubernetes deployment without a cluster (scripts/test.sh stage "kubernetes"):
#   1. helm lint of the chart with its defaults and with every ci/*-values.yaml
#      (values.schema.json refuses unknown or mistyped values);
#   2. deploy/manifests/ is what scripts/render-manifests.sh renders now (fails when stale);
#   3. every ci/*-values.yaml renders (helm template);
#   4. the Go tests of tests/kubernetes: every rendered object decodes strictly into the
#      upstream Kubernetes API types, cross-references hold, the gateway's k8sattributes
#      settings validate (tests/kubernetes/manifests); gofmt and go vet of that module (which
#      also builds the fake kubelet the Python tests start).
# Helm comes from scripts/helm.sh (go install from the Go module proxy, cached).
set -euo pipefail
cd "$(dirname "$0")/.."
helm=$(./scripts/helm.sh)
chart=deploy/helm/gpumetrics
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

echo "== kubernetes: helm lint"
"$helm" lint --strict "$chart" >/dev/null
for values in "$chart"/ci/*-values.yaml; do
  "$helm" lint --strict "$chart" -f "$values" >/dev/null || { echo "helm lint failed with $values" >&2; exit 1; }
done

echo "== kubernetes: deploy/manifests is fresh"
OUT="$tmp/manifests" ./scripts/render-manifests.sh
if ! diff -r -x README.md "$tmp/manifests" deploy/manifests >/dev/null; then
  echo "deploy/manifests is stale: run scripts/render-manifests.sh and commit" >&2
  diff -r -x README.md "$tmp/manifests" deploy/manifests >&2 || true
  exit 1
fi

echo "== kubernetes: helm template of every ci/*-values.yaml"
mkdir -p "$tmp/ci"
for values in "$chart"/ci/*-values.yaml; do
  "$helm" template gpumetrics "$chart" --namespace gpumetrics -f "$values" >"$tmp/ci/$(basename "$values")"
done

echo "== kubernetes: strict decode into the upstream API types (go test)"
cd tests/kubernetes
unformatted=$(gofmt -l .)
[ -z "$unformatted" ] || { echo "gofmt needed: $unformatted" >&2; exit 1; }
go vet ./...
GPUMETRICS_RENDERED_DIRS="$tmp/ci" go test -count=1 ./...
echo "kubernetes deployment is valid"
