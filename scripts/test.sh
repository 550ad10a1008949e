#!/usr/bin/env bash
# The project's test command (README "Quick start", second command; CI runs it via .ci/run).
# Sets up a virtual environment in .venv (or $VENV), installs the package with its test extras
# and the simulated NVML driver (nvmlsim/, its own distribution), then runs, in order:
#   1. generated code is fresh; lint: ruff (lint everywhere, format on both packages), mypy on
#      both packages, import-linter (the layers of docs/architecture.md), buf lint on proto/;
#   2. the Python suites (everything not marked e2e) and the simulator's own tests;
#   2b. the same NVML-facing suites (the simulator's, tests/nvml) against the OLDEST supported
#      nvidia-ml-py; the simulator's in a small venv of their own without gpumetrics, which
#      also proves it stands alone (stage 2 ran them against the newest);
#   3. the Go receiver: collector/scripts/test.sh (gofmt, hadolint, go vet, go test); then the
#      relabel test vectors computed by Prometheus' own model/relabel (tests/relabeloracle);
#   4. static validation of docker-compose.yaml, the Dockerfiles and collector-config/
#      (scripts/validate-compose.sh);
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
python -m pip install -q -e ./nvmlsim -e '.[test]'

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
ruff format --check receiver nvmlsim/src
mypy receiver/gpumetrics
(cd nvmlsim && mypy)
lint-imports
(cd nvmlsim && lint-imports)
./scripts/lint-proto.sh

stage "python tests (nvidia-ml-py $(python -c 'import importlib.metadata as m; print(m.version("nvidia-ml-py"))'))"
run_pytest -m "not e2e"
(cd nvmlsim && run_pytest)

# The oldest nvidia-ml-py the range in pyproject.toml and nvmlsim/pyproject.toml allows; the
# newest is what stage 2 ran with. Keep equal to the lower bounds there.
NVML_OLDEST=12.570.86
stage "oldest nvidia-ml-py ($NVML_OLDEST): simulator (alone) and NVML collector"
simvenv="$VENV-nvmlsim"
if [ ! -x "$simvenv/bin/python" ]; then python3 -m venv "$simvenv"; fi
"$simvenv/bin/python" -m pip install -q --disable-pip-version-check \
  "nvidia-ml-py==$NVML_OLDEST" -e './nvmlsim[test]'
"$simvenv/bin/python" -c 'import importlib.util as u, sys; sys.exit(u.find_spec("gpumetrics") is not None)'
(cd nvmlsim && "$simvenv/bin/python" -m pytest -q -p no:cacheprovider)
oldest="$VENV/nvidia-ml-py-$NVML_OLDEST"   # just the binding, ahead of the venv's on sys.path
[ -f "$oldest/pynvml.py" ] || python -m pip install -q --no-deps --target "$oldest" "nvidia-ml-py==$NVML_OLDEST"
PYTHONPATH="$oldest" python -c "import importlib.metadata as m; assert m.version('nvidia-ml-py') == '$NVML_OLDEST'"
PYTHONPATH="$oldest" run_pytest tests/nvml

stage "go receiver"
PYTHON="$VENV/bin/python" HADOLINT="$VENV/bin/hadolint" ./collector/scripts/test.sh

stage "relabel vectors against Prometheus' model/relabel (tests/relabeloracle, Go)"
unformatted=$(gofmt -l tests/relabeloracle)
[ -z "$unformatted" ] || { echo "gofmt: $unformatted" >&2; exit 1; }
(cd tests/relabeloracle && go vet ./... && go test -count=1 ./...)

stage "compose and configuration (static)"
./scripts/validate-compose.sh

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
