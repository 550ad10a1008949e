#!/usr/bin/env bash
# The project's test command (README "Quick start", second command; CI runs it via .ci/run).
# Sets up a virtual environment in .venv (or $VENV), installs the package with its test extras,
# then runs, in order:
#   1. generated code is fresh; lint: ruff (lint everywhere, format on the package), mypy on the
#      package, buf lint on proto/;
#   2. the Python suites (everything not marked e2e);
#   3. the Go receiver: collector/scripts/test.sh (gofmt, hadolint, go vet, go test);
#   4. static validation of docker-compose.yaml, the Dockerfiles and collector-config/
#      (scripts/validate-compose.sh), and of the Helm chart and deploy/manifests/ (helm lint,
#      manifests fresh, strict decode into the Kubernetes API types: scripts/check-kubernetes.sh);
#   5. the end-to-end tests (pytest -m e2e): builds the otelcol-gpumetrics distribution with the
#      Collector Builder (collector/scripts/build-otelcol.sh, cached by hash), then runs the real
#      Collector against the real sidecar (docs/e2e.md).
#   GPUMETRICS_SKIP_E2E=1   skip stage 5 (the first Collector build takes minutes)
set -euo pipefail
cd "$(dirname "$0")/.."
VENV=${VENV:-.venv}
if [ ! -x "$VENV/bin/python" ]; then
  python3 -m venv "$VENV"
fi
. "$VENV/bin/activate"
VENV=$(cd "$VENV" && pwd)   # absolute: later stages run from other directories
python -m pip install -q --upgrade pip
python -m pip install -q -e '.[test]'

# pytest exits 5 when it collected no test: that is a failure here, not a pass.
run_pytest() {
  set +e
  python -m pytest -q -p no:cacheprovider "$@"
  local rc=$?
  set -e
  [ "$rc" -eq 0 ] || exit "$rc"
}

stage_start=$SECONDS
stage() { echo "== $* (at $((SECONDS - stage_start)) s)"; }

stage "generated code is fresh"
./scripts/check-generated.sh

stage "lint"
ruff check .
ruff format --check receiver
mypy receiver/gpumetrics
./scripts/lint-proto.sh

stage "python tests"
run_pytest -m "not e2e"

stage "go receiver"
PYTHON="$VENV/bin/python" HADOLINT="$VENV/bin/hadolint" ./collector/scripts/test.sh

stage "compose and configuration (static)"
./scripts/validate-compose.sh

stage "kubernetes (helm lint, manifests fresh, strict decode)"
./scripts/check-kubernetes.sh

if [ -n "${GPUMETRICS_SKIP_E2E:-}" ]; then
  echo "== end-to-end tests skipped (GPUMETRICS_SKIP_E2E is set)"
  exit 0
fi

stage "build otelcol-gpumetrics"
OTELCOL_GPUMETRICS=$(./collector/scripts/build-otelcol.sh | tail -n1)
export OTELCOL_GPUMETRICS
"$OTELCOL_GPUMETRICS" --version

stage "end-to-end tests"
run_pytest -m e2e
stage "done"
