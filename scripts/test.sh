#!/usr/bin/env bash
# The project's test command (README "Quick start", second command; CI runs it via .ci/run).
# Sets up a virtual environment in .venv (or $VENV), installs the package with its test extras
# and the simulated NVML driver (nvmlsim/, its own distribution), then runs, in order:
#   1. generated code is fresh; lint: ruff (lint everywhere, format on both packages), mypy on
#      both packages and on tests/, import-linter (the layers of docs/architecture.md), buf lint on proto/;
#   2. the Python suites (everything not marked e2e) and the simulator's own tests;
#   2b. the same NVML-facing suites (the simulator's, tests/nvml) against the OLDEST supported
#      nvidia-ml-py; the simulator's in a small venv of their own without gpumetrics, which
#      also proves it stands alone (stage 2 ran them against the newest);
#   3. the Go receiver: collector/scripts/test.sh (gofmt, hadolint, go vet, go test); then the
#      relabel test vectors computed by Prometheus' own model/relabel (tests/relabeloracle);
#   4. static validation of docker-compose.yaml, the Dockerfiles and collector-config/
#      (scripts/validate-compose.sh), and of the Helm chart and deploy/manifests/ (helm lint,
#      manifests fresh, strict decode into the Kubernetes API types: scripts/check-kubernetes.sh);
#   5. the end-to-end tests (pytest -m e2e): builds the otelcol-gpumetrics distribution with the
#      Collector Builder (collector/scripts/build-otelcol.sh, cached by hash) and Prometheus
#      (scripts/prometheus.sh, compose's version, cached), then runs the real Collector against
#      the real sidecar, and the dashboard's PromQL in the real Prometheus (docs/e2e.md);
#   6. the live eBPF profiler (pytest -m live_profiler): builds the OpenTelemetry eBPF profiler
#      at a pinned version (scripts/ebpf-profiler/build.sh, cached by hash) and joins its live
#      profiles with the sidecar's GPU resources through the real Collector. Where it cannot
#      load its eBPF programs (not root, no tracefs, the kernel refuses them) the stage is shown
#      as skipped, with the reason, not as passed.
#   GPUMETRICS_SKIP_E2E=1   skip stages 5 and 6 (the first Collector build takes minutes)
# Every stage runs even when an earlier one failed; a summary line per stage and the total come
# last, and the exit status is 1 when any stage failed. Stage 0 (scripts/check-tracked-files.sh)
# refuses tracked build outputs: binaries, and files over 4 MiB not in scripts/large-files.allow.
set -euo pipefail
cd "$(dirname "$0")/.."
# First run (no virtual environment or no cached Collector yet): say what is downloaded and how long.
if [ ! -x "${VENV:-.venv}/bin/python" ] || ! compgen -G "${XDG_CACHE_HOME:-$HOME/.cache}/gpumetrics/otelcol-*" >/dev/null; then
  cat >&2 <<'NOTICE'
== first run: downloads about 300 MB of Python packages into .venv (PyPI; a second small venv
   for the oldest supported nvidia-ml-py) and buf (npm), Go modules for the receiver's tests, the
   relabel oracle (Prometheus) and the Kubernetes checks (client-go, k8s.io/api, Helm built with
   go install) from the Go module proxy and, for the end-to-end stage, the Collector Builder and
   grpcurl and the OpenTelemetry eBPF profiler's module, then builds otelcol-gpumetrics, the
   profiler and Prometheus (compose's version, for the Grafana dashboard's PromQL; ~10 min):
   several GB in ~/go and ~/.cache. Measured pieces on
   2 cores: Helm ~6 min, the Kubernetes modules ~2 min, the Collector build a few; expect 15-20
   minutes in all. Later runs download nothing and reuse the cached binaries.
   GPUMETRICS_SKIP_E2E=1 skips the Collector build and the end-to-end stage.
NOTICE
fi
VENV=${VENV:-.venv}
if [ ! -x "$VENV/bin/python" ]; then
  python3 -m venv "$VENV"
fi
. "$VENV/bin/activate"
VENV=$(cd "$VENV" && pwd)   # absolute: later stages run from other directories
python -m pip install -q --upgrade pip
python -m pip install -q -e ./nvmlsim -e '.[test]'

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
  : > "$SKIP_REASON_FILE"
  # Not `( ... ) || rc=$?`: bash ignores errexit inside a tested subshell, so a stage's failing
  # first command would not stop the stage.
  set +e
  ( set -euo pipefail; "$@" )
  rc=$?
  set -e
  local took=$((SECONDS - began))
  if [ "$rc" -eq 0 ]; then
    SUMMARY+=("$(printf 'ok      %-42s %5d s' "$name" "$took")")
  elif [ "$rc" -eq 77 ] && [ -s "$SKIP_REASON_FILE" ]; then
    # 77: the stage's tests were skipped (automake's convention); not a pass, not a failure
    SUMMARY+=("$(printf 'skipped %-42s %5d s  (%s)' "$name" "$took" "$(cat "$SKIP_REASON_FILE")")")
  else
    SUMMARY+=("$(printf 'FAILED  %-42s %5d s  (exit %d)' "$name" "$took" "$rc")")
    FAILED=$((FAILED + 1))
  fi
}

skip() {
  SUMMARY+=("$(printf 'skipped %-42s          (%s)' "$1" "$2")")
}

lint() {
  ruff check .
  ruff format --check receiver nvmlsim/src
  mypy receiver/gpumetrics
  mypy --explicit-package-bases tests   # bodies everywhere; annotations in conformance, service
  (cd nvmlsim && mypy)
  lint-imports
  (cd nvmlsim && lint-imports)
  ./scripts/lint-proto.sh
}

python_tests() {
  run_pytest -m "not e2e"
  (cd nvmlsim && run_pytest)
}

# The oldest nvidia-ml-py the range in pyproject.toml and nvmlsim/pyproject.toml allows; the
# newest is what the python stage ran with. Keep equal to the lower bounds there.
NVML_OLDEST=12.570.86
oldest_nvml() {
  local simvenv="$VENV-nvmlsim"
  if [ ! -x "$simvenv/bin/python" ]; then python3 -m venv "$simvenv"; fi
  "$simvenv/bin/python" -m pip install -q --disable-pip-version-check \
    "nvidia-ml-py==$NVML_OLDEST" -e './nvmlsim[test]'
  "$simvenv/bin/python" -c 'import importlib.util as u, sys; sys.exit(u.find_spec("gpumetrics") is not None)'
  (cd nvmlsim && "$simvenv/bin/python" -m pytest -q -p no:cacheprovider)
  local oldest="$VENV/nvidia-ml-py-$NVML_OLDEST"   # just the binding, ahead of the venv's on sys.path
  [ -f "$oldest/pynvml.py" ] || python -m pip install -q --no-deps --target "$oldest" "nvidia-ml-py==$NVML_OLDEST"
  PYTHONPATH="$oldest" python -c "import importlib.metadata as m; assert m.version('nvidia-ml-py') == '$NVML_OLDEST'"
  PYTHONPATH="$oldest" run_pytest tests/nvml
}

go_receiver() {
  PYTHON="$VENV/bin/python" HADOLINT="$VENV/bin/hadolint" ./collector/scripts/test.sh
}

relabel_oracle() {
  local unformatted
  unformatted=$(gofmt -l tests/relabeloracle)
  [ -z "$unformatted" ] || { echo "gofmt: $unformatted" >&2; return 1; }
  (cd tests/relabeloracle && go vet ./... && go test -count=1 ./...)
}

build_otelcol() {
  local bin
  bin=$(./collector/scripts/build-otelcol.sh | tail -n1)
  "$bin" --version
  printf '%s\n' "$bin" > "$OTELCOL_PATH_FILE"
}

# The real Prometheus (compose's version) the compose e2e test evaluates the Grafana
# dashboard's PromQL in; built from the Go module proxy by scripts/prometheus.sh, cached.
build_prometheus() {
  local bin
  bin=$(./scripts/prometheus.sh | tail -n1)
  "$bin" --version
  printf '%s\n' "$bin" > "$PROMETHEUS_PATH_FILE"
}

OTELCOL_PATH_FILE=$(mktemp)
PROMETHEUS_PATH_FILE=$(mktemp)
SKIP_REASON_FILE=$(mktemp)
LIVE_REPORT=$(mktemp)
trap 'rm -f "$OTELCOL_PATH_FILE" "$PROMETHEUS_PATH_FILE" "$SKIP_REASON_FILE" "$LIVE_REPORT"' EXIT

use_otelcol() {
  OTELCOL_GPUMETRICS=$(cat "$OTELCOL_PATH_FILE")
  [ -n "$OTELCOL_GPUMETRICS" ] || { echo "no Collector binary: the build stage failed"; return 1; }
  export OTELCOL_GPUMETRICS
}

e2e() {
  use_otelcol
  PROMETHEUS=$(cat "$PROMETHEUS_PATH_FILE")
  [ -n "$PROMETHEUS" ] || { echo "no Prometheus binary: the build stage failed"; return 1; }
  export PROMETHEUS
  run_pytest -m "e2e and not live_profiler"
}

# The test builds the profiler itself (scripts/ebpf-profiler/build.sh, cached) once it knows the
# machine can load it, so a machine that cannot skips without the build. Its measured latencies
# and any skip reason come from the JUnit report (scripts/junit_outcome.py).
live_profiler() {
  use_otelcol
  run_pytest -m live_profiler -o junit_family=legacy --junitxml="$LIVE_REPORT"
  python scripts/junit_outcome.py "$LIVE_REPORT" "$SKIP_REASON_FILE"
}

stage "no tracked build output or file over 4 MiB" ./scripts/check-tracked-files.sh
stage "generated code is fresh" ./scripts/check-generated.sh
stage "lint" lint
nvml_newest=$(python -c 'import importlib.metadata as m; print(m.version("nvidia-ml-py"))')
stage "python tests (nvidia-ml-py $nvml_newest)" python_tests
stage "oldest nvidia-ml-py ($NVML_OLDEST)" oldest_nvml
stage "go receiver" go_receiver
stage "relabel vectors vs Prometheus (Go)" relabel_oracle
stage "compose and configuration (static)" ./scripts/validate-compose.sh
stage "kubernetes (helm lint, manifests fresh, strict decode)" ./scripts/check-kubernetes.sh
if [ -n "${GPUMETRICS_SKIP_E2E:-}" ]; then
  skip "build otelcol-gpumetrics" "GPUMETRICS_SKIP_E2E is set"
  skip "build prometheus (dashboard PromQL)" "GPUMETRICS_SKIP_E2E is set"
  skip "end-to-end tests" "GPUMETRICS_SKIP_E2E is set"
  skip "live eBPF profiler (end-to-end)" "GPUMETRICS_SKIP_E2E is set"
else
  stage "build otelcol-gpumetrics" build_otelcol
  stage "build prometheus (dashboard PromQL)" build_prometheus
  stage "end-to-end tests" e2e
  stage "live eBPF profiler (end-to-end)" live_profiler
fi

echo
echo "== summary"
printf '%s\n' "${SUMMARY[@]}"
if [ "$FAILED" -eq 0 ]; then
  printf 'ok      %-42s %5d s\n' "all stages" "$((SECONDS - t0))"
else
  printf 'FAILED  %-42s %5d s  (%d stage(s) failed)\n' "all stages" "$((SECONDS - t0))" "$FAILED"
  exit 1
fi
