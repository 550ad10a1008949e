#!/usr/bin/env bash
# The project's test command (README "Quick start", second command; CI runs it via .ci/run).
# Sets up a virtual environment in .venv (or $VENV), installs the package with its test extras,
# then runs, in order:
#   1. generated code is fresh; lint: ruff (lint everywhere, format on the package), mypy on the
#      package, buf lint on proto/;
#   2. the Python suites (everything not marked e2e);
#   3. the Go receiver: collector/scripts/test.sh (gofmt, hadolint, go vet, go test);
#   4. static validation of docker-compose.yaml, the Dockerfiles and collector-config/
#      (scripts/validate-compose.sh);
#   5. the end-to-end tests (pytest -m e2e): builds the otelcol-gpumetrics distribution with the
#      Collector Builder (collector/scripts/build-otelcol.sh, cached by hash), then runs the real
#      Collector against the real sidecar (docs/e2e.md).
#   GPUMETRICS_SKIP_E2E=1   skip stage 5 (the first Collector build takes minutes)
# Every stage runs even when an earlier one failed; a summary line per stage and the total come
# last, and the exit status is 1 when any stage failed.
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

# Every stage runs, whatever the earlier ones did, so one failure never hides another stage's
# result; the summary at the end has one line per stage and the total, and the exit status is
# non-zero when any stage failed. A stage is a shell function; its output streams as it runs.
declare -a SUMMARY=()
FAILED=0
t0=$SECONDS

# pytest exits 5 when it collected no test: that is a failure here, not a pass.
run_pytest() {
  python -m pytest -q -p no:cacheprovider "$@"
}

stage() {
  local name=$1
  shift
  echo "== $name (at $((SECONDS - t0)) s)"
  local began=$SECONDS rc
  # Not `( ... ) || rc=$?`: bash ignores errexit inside a tested subshell, so a stage's failing
  # first command would not stop the stage.
  set +e
  ( set -euo pipefail; "$@" )
  rc=$?
  set -e
  local took=$((SECONDS - began))
  if [ "$rc" -eq 0 ]; then
    SUMMARY+=("$(printf 'ok      %-36s %5d s' "$name" "$took")")
  else
    SUMMARY+=("$(printf 'FAILED  %-36s %5d s  (exit %d)' "$name" "$took" "$rc")")
    FAILED=$((FAILED + 1))
  fi
}

skip() {
  SUMMARY+=("$(printf 'skipped %-36s          (%s)' "$1" "$2")")
}

lint() {
  ruff check .
  ruff format --check receiver
  mypy receiver/gpumetrics
  ./scripts/lint-proto.sh
}

go_receiver() {
  PYTHON="$VENV/bin/python" HADOLINT="$VENV/bin/hadolint" ./collector/scripts/test.sh
}

build_otelcol() {
  local bin
  bin=$(./collector/scripts/build-otelcol.sh | tail -n1)
  "$bin" --version
  printf '%s\n' "$bin" > "$OTELCOL_PATH_FILE"
}

OTELCOL_PATH_FILE=$(mktemp)
trap 'rm -f "$OTELCOL_PATH_FILE"' EXIT

e2e() {
  OTELCOL_GPUMETRICS=$(cat "$OTELCOL_PATH_FILE")
  [ -n "$OTELCOL_GPUMETRICS" ] || { echo "no Collector binary: the build stage failed"; return 1; }
  export OTELCOL_GPUMETRICS
  run_pytest -m e2e
}

stage "generated code is fresh" ./scripts/check-generated.sh
stage "lint" lint
stage "python tests" run_pytest -m "not e2e"
stage "go receiver" go_receiver
stage "compose and configuration (static)" ./scripts/validate-compose.sh
if [ -n "${GPUMETRICS_SKIP_E2E:-}" ]; then
  skip "build otelcol-gpumetrics" "GPUMETRICS_SKIP_E2E is set"
  skip "end-to-end tests" "GPUMETRICS_SKIP_E2E is set"
else
  stage "build otelcol-gpumetrics" build_otelcol
  stage "end-to-end tests" e2e
fi

echo
echo "== summary"
printf '%s\n' "${SUMMARY[@]}"
if [ "$FAILED" -eq 0 ]; then
  printf 'ok      %-36s %5d s\n' "all stages" "$((SECONDS - t0))"
else
  printf 'FAILED  %-36s %5d s  (%d stage(s) failed)\n' "all stages" "$((SECONDS - t0))" "$FAILED"
  exit 1
fi
