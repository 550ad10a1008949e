#!/usr/bin/env bash
# Renders the Helm chart (deploy/helm/gpumetrics) into plain manifests for clusters without Helm:
#   deploy/manifests/gpumetrics.yaml             the chart's defaults (sidecar topology, Prometheus)
#   deploy/manifests/gpumetrics-subprocess.yaml  ci/subprocess-values.yaml
#   deploy/manifests/gpumetrics-gateway.yaml     ci/gateway-values.yaml (OTLP to a gateway Deployment)
# all for release "gpumetrics" in namespace "gpumetrics" (deploy/manifests/README.md).
#   OUT=DIR   write there instead (scripts/check-kubernetes.sh compares the two)
set -euo pipefail
cd "$(dirname "$0")/.."
helm=$(./scripts/helm.sh)
chart=deploy/helm/gpumetrics
out=${OUT:-deploy/manifests}
mkdir -p "$out"
render() {
  local file=$1
  shift
  {
    echo "# Rendered from deploy/helm/gpumetrics by scripts/render-manifests.sh: do not edit."
    echo "# helm template gpumetrics deploy/helm/gpumetrics --namespace gpumetrics $*"
    "$helm" template gpumetrics "$chart" --namespace gpumetrics "$@"
  } >"$out/$file"
}
render gpumetrics.yaml
render gpumetrics-subprocess.yaml -f "$chart/ci/subprocess-values.yaml"
render gpumetrics-gateway.yaml -f "$chart/ci/gateway-values.yaml"
