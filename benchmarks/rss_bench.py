"""What the sidecar's resident memory is, next to nvitop-exporter's, and what is the simulator's.

Three parts, each in fresh processes:

1. **Import ladders**: a fresh interpreter imports one module after another and reads
   ``/proc/self/smaps_rollup`` after each: RSS and its anonymous part (file-backed pages,
   the rest, are shared libraries' code, shared with other processes using them). Ours: the
   sidecar's dependencies in the order a real node loads them (nvidia-ml-py, PyYAML, pydantic,
   protobuf + opentelemetry-proto, grpcio + health + reflection, google-re2), then the
   sidecar's own packages, then the simulator last (its own share, beyond the dependencies it
   has in common with us). The peer's, in its virtualenv: nvidia-ml-py, prometheus-client,
   psutil, nvitop, nvitop-exporter, then the simulator's dependencies and the simulator.
2. **The running sidecar's Python heap by package**: ``gpumetrics serve`` on the side-by-side's
   node (``peer_bench``) under ``benchmarks.simexec`` with ``PYTHONTRACEMALLOC=1``, pulled every
   10 s; after the warm-up, ``tracemalloc`` by the package of the allocating file and
   ``smaps_rollup``. Tracing costs memory of its own, so RSS figures come from the side-by-side
   (untraced), not from here.
3. **The simulator alone** (``benchmarks/sim_idle.py``), traced the same way: its heap.

Run: ``python -m benchmarks.rss_bench [--warmup 35]``.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from benchmarks.harness import emit, machine, proc_rss_bytes
from benchmarks.peer_bench import (
    PEER_VENV,
    Exporter,
    Scraper,
    free_port,
    sidecar,
    sidecar_config,
    training_node,
)
from benchmarks.pullclient import PullConsumer, channel

ROOT = Path(__file__).resolve().parents[1]

OURS = (
    "pynvml",
    "yaml",
    "pydantic",
    "google.protobuf",
    "opentelemetry.proto.collector.metrics.v1.metrics_service_pb2",
    "grpc",
    "grpc_health.v1.health",
    "grpc_reflection.v1alpha.reflection",
    "re2",
    "gpumetrics.config",
    "gpumetrics.nvml.collector",
    "gpumetrics.cli",
    "nvmlsim",
)
PEER = ("pynvml", "prometheus_client", "psutil", "nvitop", "nvitop_exporter", "yaml",
        "pydantic", "nvmlsim")  # fmt: skip

_LADDER = """
import gc, importlib, json, sys
def roll():
    out = {}
    for line in open('/proc/self/smaps_rollup'):
        p = line.split()
        if len(p) == 3 and p[2] == 'kB':
            out[p[0].rstrip(':')] = int(p[1])
    return out
rows = [['(interpreter)', roll()]]
for name in sys.argv[1:]:
    importlib.import_module(name)
    gc.collect()
    rows.append([name, roll()])
print(json.dumps(rows))
"""


def ladder(python: str, modules: tuple[str, ...]) -> list[dict[str, Any]]:
    """Import ``modules`` in order in a fresh ``python``; RSS and anonymous kB after each."""
    res = subprocess.run(
        [python, "-c", _LADDER, *modules], capture_output=True, text=True, timeout=120, cwd=ROOT
    )
    if res.returncode:
        return [{"error": res.stderr[-500:]}]
    rows = json.loads(res.stdout)
    out, prev = [], None
    for name, roll in rows:
        row = {"module": name, "rss_kb": roll["Rss"], "anonymous_kb": roll["Anonymous"]}
        if prev is not None:
            row["rss_added_kb"] = roll["Rss"] - prev["Rss"]
            row["anonymous_added_kb"] = roll["Anonymous"] - prev["Anonymous"]
        out.append(row)
        prev = roll
    return out


def traced(warmup_s: float) -> dict[str, Any]:
    """The traced sidecar and the traced simulator alone (module docstring, parts 2 and 3)."""
    out = Path(tempfile.mkdtemp(prefix="rss-bench-"))
    scenario = training_node(8, 8, out / "scenario.yaml")
    config = sidecar_config(out / "gpumetrics.yaml")
    port = free_port()
    trace = {"PYTHONTRACEMALLOC": "1"}
    ours = sidecar(scenario, config, f"127.0.0.1:{port}", out, env=trace)
    alone = Exporter("simulator-alone", sys.executable, scenario, ["benchmarks.sim_idle"], out,
                     env=trace)  # fmt: skip
    ch = channel(f"127.0.0.1:{port}")
    consumer = PullConsumer(ch, "bench")
    puller = Scraper("pull-ours", 10.0, lambda: consumer.drain().size_bytes)
    result: dict[str, Any] = {}
    try:
        end = time.monotonic() + 90
        while True:
            try:
                if consumer.drain().pulls > 0:
                    break
            except Exception:  # noqa: BLE001 - not serving yet
                pass
            if time.monotonic() > end or ours.proc.poll() is not None:
                raise RuntimeError(f"sidecar not serving; see {out}")
            time.sleep(0.5)
        puller.start()
        time.sleep(warmup_s)
        for e in (ours, alone):
            stats = e.dump_stats()
            result[e.name] = {
                "rss_bytes_traced": proc_rss_bytes(e.proc.pid)[0],
                "smaps_rollup_kb": stats.get("smaps_rollup_kb", {}),
                "tracemalloc": stats.get("tracemalloc", {}),
            }
    finally:
        puller.stop_event.set()
        puller.join(15)
        ch.close()
        for e in (ours, alone):
            e.stop()
    return result


def main() -> int:
    """Run the three parts, print a summary and emit the result."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--warmup", type=float, default=35.0)
    ap.add_argument("--peer-venv", type=Path, default=PEER_VENV)
    args = ap.parse_args()
    result: dict[str, Any] = {"machine": machine(), "ladder_ours": ladder(sys.executable, OURS)}
    peer_python = args.peer_venv / "bin" / "python"
    if peer_python.exists():
        result["ladder_peer"] = ladder(str(peer_python), PEER)
    result["traced"] = traced(args.warmup)
    for key in ("ladder_ours", "ladder_peer"):
        print(key)
        for row in result.get(key, []):
            if "error" in row:
                print("  error:", row["error"])
                continue
            print(
                f"  {row['module']:62} RSS {row['rss_kb'] / 1024:6.1f} MiB "
                f"(+{row.get('rss_added_kb', 0) / 1024:5.1f}, anonymous "
                f"+{row.get('anonymous_added_kb', 0) / 1024:5.1f})"
            )
    for name, t in result["traced"].items():
        heap = t["tracemalloc"]
        print(f"{name}: traced heap {heap.get('total_bytes', 0) / 2**20:.1f} MiB by package:")
        for pkg, size in list(heap.get("by_package", {}).items())[:14]:
            print(f"  {pkg:32} {size / 2**20:6.2f} MiB")
    emit("rss", result)
    return 0


if __name__ == "__main__":
    sys.exit(main())
