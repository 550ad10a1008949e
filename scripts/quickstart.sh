#!/usr/bin/env bash
# Quick start (README, first command): install gpumetrics and its simulated NVML driver (nvmlsim,
# the `sim` extra) into .venv, run the sidecar on a simulated 8-GPU node (the h100-8x-training
# profile: 8x H100 with a running training job), and print one pull from its gRPC endpoint.
# No GPU needed.
#   FORMAT=json ./scripts/quickstart.sh   prints OTLP/JSON instead of the text summary
set -euo pipefail
cd "$(dirname "$0")/.."
VENV=${VENV:-.venv}
[ -x "$VENV/bin/python" ] || python3 -m venv "$VENV"
"$VENV/bin/python" -m pip install -q --upgrade pip
# editable, like scripts/test.sh, so both share .venv
"$VENV/bin/python" -m pip install -q -e ./nvmlsim -e '.[sim]'
dir=$(mktemp -d)
sock="$dir/gpumetrics.sock"
# the profiler service on a socket of its own in $dir too, not the machine's default one
"$VENV/bin/gpumetrics" serve --simulate h100-8x-training --listen "unix:$sock" \
  --profiler-listen "unix:$dir/profiler.sock" --batch-interval 2 2>"$dir/sidecar.log" &
pid=$!
trap 'kill "$pid" 2>/dev/null; wait "$pid" 2>/dev/null; rm -rf "$dir"' EXIT
echo "sidecar pid $pid on unix:$sock" >&2
if ! "$VENV/bin/gpumetrics" pull "unix:$sock" --wait 60 --format "${FORMAT:-text}"; then
  echo "the pull failed; the sidecar's log:" >&2
  tail -n 30 "$dir/sidecar.log" >&2
  exit 1
fi
