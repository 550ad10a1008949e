#!/usr/bin/env bash
# Real-GPU check of the gpumetrics sidecar (read-only; installs nothing from the network).
#
# On a machine with an NVIDIA GPU and driver, from a checkout of this repository:
#
#   scripts/gpu-check.sh [--out DIR] [--python PY | --venv DIR | --wheels DIR]
#                        [--duration S] [--repeat N] [--cycles N] [--simulate PROFILE]
#
# Python: --python PY, or --venv DIR (its bin/python), or --wheels DIR (a new virtualenv in
# DIR_OUT/venv, filled with `pip install --no-index --find-links DIR gpumetrics`: offline), or
# the checkout's .venv, or python3. It must import gpumetrics and pynvml (see docs/real-gpu.md
# for how to prepare one). --simulate PROFILE is the dry run: every step against the simulated
# driver (nvidia-smi's answers emulated from pynvml).
#
# It records into --out (default ./gpu-check-<UTC time>): per-call NVML latency and error kinds
# (probe.json), sample-timestamp clock domains (probe.json), the simulator's unverified corners
# (corners.json), collection cycle times (cycles.json), a short sidecar run with two pulls
# (pull-*.json, sidecar.json, logs/), nvidia-smi -q and --query-gpu before and after,
# our readings next to nvidia-smi (compare.json) and <out>/summary.md. Every step has a timeout; a
# failed step is recorded in steps.tsv and the next one runs. Nothing changes GPU settings:
# only queries are made, and the GPU state before and after is compared (state-diff.txt).
set -u -o pipefail

usage() { sed -n '2,21p' "$0" | sed 's/^# \{0,1\}//'; exit "${1:-0}"; }

REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
OUT="./gpu-check-$(date -u +%Y%m%dT%H%M%SZ)"
PY="" VENV="" WHEELS="" SIMULATE="" DURATION=30 REPEAT=20 CYCLES=15
while [ $# -gt 0 ]; do
  case "$1" in
    --out) OUT=$2; shift 2 ;;
    --python) PY=$2; shift 2 ;;
    --venv) VENV=$2; shift 2 ;;
    --wheels) WHEELS=$2; shift 2 ;;
    --duration) DURATION=$2; shift 2 ;;
    --repeat) REPEAT=$2; shift 2 ;;
    --cycles) CYCLES=$2; shift 2 ;;
    --simulate) SIMULATE=$2; shift 2 ;;
    -h|--help) usage 0 ;;
    *) echo "gpu-check: unknown argument $1" >&2; usage 2 ;;
  esac
done
for n in "$DURATION" "$REPEAT" "$CYCLES"; do
  case "$n" in ''|*[!0-9]*) echo "gpu-check: --duration/--repeat/--cycles take whole numbers" >&2; exit 2 ;; esac
done
mkdir -p "$OUT/logs" || exit 1
OUT=$(cd "$OUT" && pwd)
printf 'step\tstatus\tseconds\n' > "$OUT/steps.tsv"

# step NAME LIMIT_S CMD...: run CMD under a timeout, stdout/stderr to logs/, status to steps.tsv.
step() {
  local name=$1 limit=$2 start rc
  shift 2
  start=$(date +%s)
  timeout -k 5 "$limit" "$@" > "$OUT/logs/$name.out" 2> "$OUT/logs/$name.err"
  rc=$?
  case $rc in 0) s=ok ;; 124|137) s="timed out (${limit}s)" ;; *) s="exit $rc" ;; esac
  printf '%s\t%s\t%s\n' "$name" "$s" "$(( $(date +%s) - start ))" >> "$OUT/steps.tsv"
  echo "gpu-check: $name: $s" >&2
  return $rc
}

# --- Python -----------------------------------------------------------------------------------
if [ -n "$WHEELS" ]; then
  step make-venv 300 python3 -m venv "$OUT/venv" &&
    step install-wheels 600 "$OUT/venv/bin/python" -m pip install --no-index \
      --find-links "$WHEELS" gpumetrics
  PY="$OUT/venv/bin/python"
elif [ -n "$VENV" ]; then
  PY="$VENV/bin/python"
elif [ -z "$PY" ]; then
  if [ -x "$REPO/.venv/bin/python" ]; then PY="$REPO/.venv/bin/python"; else PY=python3; fi
fi
if ! timeout 60 "$PY" -c 'import gpumetrics, pynvml' 2> "$OUT/logs/python.err"; then
  echo "gpu-check: $PY cannot import gpumetrics and pynvml (see docs/real-gpu.md)" >&2
  exit 2
fi

# With --simulate every Python step runs on the simulated driver (the simulator's launcher).
RUNPY=("$PY")
SERVE_SIM=()
if [ -n "$SIMULATE" ]; then
  RUNPY=("$PY" -m nvmlsim exec --simulate "$SIMULATE" --)
  SERVE_SIM=(--simulate "$SIMULATE")
fi
HAVE_SMI=0
if [ -z "$SIMULATE" ] && command -v nvidia-smi > /dev/null; then HAVE_SMI=1; fi

{
  echo "date: $(date -u +%Y-%m-%dT%H:%M:%SZ)"
  if [ -n "$SIMULATE" ]; then echo "mode: dry run on the simulated driver, profile $SIMULATE"
  else echo "mode: real driver"; fi
  echo "host: $(uname -n), Linux $(uname -r), $(nproc) CPUs"
  echo "cpu: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2- | sed 's/^ //')"
  echo "python: $PY ($(timeout 30 "$PY" -c 'import sys; print(sys.version.split()[0])'))"
  echo "packages: $(timeout 30 "$PY" -c 'from importlib import metadata as m; print(", ".join(p + " " + m.version(p) for p in ("gpumetrics", "nvidia-ml-py", "grpcio", "protobuf")))')"
  if [ "$HAVE_SMI" = 1 ]; then echo "nvidia-smi -L: $(timeout 30 nvidia-smi -L | tr '\n' ';')"; fi
} > "$OUT/meta.txt" 2>> "$OUT/logs/meta.err"

# --- GPU state and nvidia-smi before ------------------------------------------------------------
if [ "$HAVE_SMI" = 1 ]; then
  step smi-q-before 60 nvidia-smi -q && cp "$OUT/logs/smi-q-before.out" "$OUT/smi-q-before.txt"
  step smi-before 300 "$PY" "$REPO/scripts/gpu_report.py" smi --out "$OUT" --name smi-before.json
fi

# --- NVML probes --------------------------------------------------------------------------------
step probe 600 "${RUNPY[@]}" "$REPO/scripts/gpu_check.py" probe --out "$OUT" --repeat "$REPEAT"
step corners 180 "${RUNPY[@]}" "$REPO/benchmarks/sim_hardware_probe.py" &&
  cp "$OUT/logs/corners.out" "$OUT/corners.json"
step cycles $((CYCLES * 3 + 120)) "${RUNPY[@]}" "$REPO/scripts/gpu_check.py" cycles --out "$OUT" \
  --cycles "$CYCLES"

# --- A short sidecar run --------------------------------------------------------------------------
RUN=$(mktemp -d /tmp/gpumetrics-check.XXXXXX)  # short path: unix socket names are limited
SOCK="unix:$RUN/sidecar.sock"
timeout -k 5 $((DURATION + 120)) "$PY" -m gpumetrics serve --listen "$SOCK" \
  --collection-interval 1 --batch-interval 5 --log-level debug ${SERVE_SIM[@]+"${SERVE_SIM[@]}"} \
  > "$OUT/logs/sidecar.out" 2> "$OUT/logs/sidecar.err" &
SIDECAR=$!
started=$(date +%s)
pull() {  # pull NAME: one Pull (acknowledged) as OTLP/JSON
  step "$1" 60 "$PY" -m gpumetrics pull "$SOCK" --consumer gpu-check --format json --wait 45 \
    && cp "$OUT/logs/$1.out" "$OUT/$1.json"
}
pull pull-1
sleep "$DURATION"
pull pull-2
if [ "$HAVE_SMI" = 1 ]; then
  step smi-after 300 "$PY" "$REPO/scripts/gpu_report.py" smi --out "$OUT" --name smi.json
elif [ -n "$SIMULATE" ]; then
  step smi-emulated 120 "${RUNPY[@]}" "$REPO/scripts/gpu_report.py" smi --emulate --out "$OUT"
else
  printf 'smi\tskipped: nvidia-smi not found\t0\n' >> "$OUT/steps.tsv"
fi
# $SIDECAR is timeout(1); the sidecar is its child
child=$(cat "/proc/$SIDECAR/task/$SIDECAR/children" 2> /dev/null | awk '{ print $1 }')
cpu_ticks=$(awk '{ s = $0; sub(/.*\) /, "", s); split(s, f, " "); print f[12] + f[13] }' \
  "/proc/${child:-$SIDECAR}/stat" 2> /dev/null || echo "")
ran=$(( $(date +%s) - started ))
stop_start=$(date +%s)
kill -TERM "$SIDECAR" 2> /dev/null
for _ in $(seq 1 30); do kill -0 "$SIDECAR" 2> /dev/null || break; sleep 0.5; done
if kill -0 "$SIDECAR" 2> /dev/null; then kill -KILL "$SIDECAR"; killed=true; else killed=false; fi
wait "$SIDECAR"; rc=$?
rm -rf "$RUN"
printf '{"ran_s": %s, "cpu_s": %s, "shutdown_s": %s, "exit_status": %s, "killed": %s}\n' \
  "$ran" "$(awk -v t="${cpu_ticks:-0}" -v hz="$(getconf CLK_TCK)" 'BEGIN { print t / hz }')" \
  "$(( $(date +%s) - stop_start ))" "$rc" "$killed" > "$OUT/sidecar.json"
pulls=()
for f in "$OUT/pull-1.json" "$OUT/pull-2.json"; do [ -f "$f" ] && pulls+=("$f"); done
[ ${#pulls[@]} -gt 0 ] &&
  step compare 120 "$PY" "$REPO/scripts/gpu_report.py" compare --out "$OUT" --pull "${pulls[@]}"

# --- GPU state after: nothing we did may have changed it ------------------------------------------
if [ "$HAVE_SMI" = 1 ]; then
  step smi-q-after 60 nvidia-smi -q && cp "$OUT/logs/smi-q-after.out" "$OUT/smi-q-after.txt"
  keys='Persistence Mode|Compute Mode|MIG Mode|Current  *:|Pending  *:|Power Limit|Applications Clocks|Auto Boost|Accounting Mode|ECC Mode|Driver Model'
  grep -E "$keys" "$OUT/smi-q-before.txt" > "$OUT/logs/state-before.txt" 2> /dev/null
  grep -E "$keys" "$OUT/smi-q-after.txt" > "$OUT/logs/state-after.txt" 2> /dev/null
  if diff "$OUT/logs/state-before.txt" "$OUT/logs/state-after.txt" > "$OUT/state-diff.txt"; then
    echo "GPU settings unchanged (persistence, compute, MIG, power limits, clocks, ECC)" > "$OUT/state-diff.txt"
  fi
fi

step summary 60 "$PY" "$REPO/scripts/gpu_report.py" summary --out "$OUT"
echo "gpu-check: results in $OUT (summary.md)" >&2
