#!/usr/bin/env bash
# The project's test command (README "Quick start", second command; CI runs it via .ci/run).
# Sets up a virtual environment in .venv (or $VENV), installs the package with its test extras,
# checks generated code, then runs the Python suites, the Go receiver's tests and the
# end-to-end stages.
#   GPUMETRICS_SKIP_E2E=1   skip the end-to-end stages (they build the Collector; slow first time)
set -euo pipefail
cd "$(dirname "$0")/.."
VENV=${VENV:-.venv}
if [ ! -x "$VENV/bin/python" ]; then
  python3 -m venv "$VENV"
fi
. "$VENV/bin/activate"
python -m pip install -q --upgrade pip
python -m pip install -q -e '.[test]'

echo "== generated code is fresh"
./scripts/check-generated.sh

echo "== python tests"
set +e
python -m pytest -q -p no:cacheprovider
rc=$?
set -e
# pytest exits 5 when it collected no test: that is a failure here, not a pass.
[ "$rc" -eq 0 ] || exit "$rc"
