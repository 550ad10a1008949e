"""The Collector side: CPU of the real Collector per scrape, and latency from NVML to its exporter.

The sidecar (``gpumetrics serve``, defaults: 1 s collection, 10 s batches) runs on the simulated
node of ``peer_bench`` (8 H100s of ``h100-8x-training``, 8 processes each, 64 in all) under
``benchmarks.simexec``, listening on a unix socket. The real ``otelcol-gpumetrics`` distribution
(``collector/scripts/build-otelcol.sh``, cached) attaches to it with the gpumetrics receiver
(``collection_interval`` 10 s, so each scrape drains one 10 s batch) and sends everything with
its ``otlp_grpc`` exporter to an OTLP ``MetricsService`` in this process, which records when
each export arrived and the data points' times.

Reported, over a window after a warm-up:

- the Collector's CPU (utime + stime of ``/proc/<pid>/stat``, all threads) per scrape, and the
  sidecar's in the same window for scale;
- latency per export: arrival at the downstream service minus the newest and the oldest data
  point's ``time_unix_nano`` (a point's time is when it was read, or the driver's sample
  timestamp for sample-buffer points), i.e. how old the freshest and the stalest reading is
  when it leaves the Collector. At a 10 s batch and a 10 s scrape, the newest point waits up to
  one batch interval plus one scrape interval.

Run: ``python -m benchmarks.receiver_bench [--window 60] [--warmup 15]``. Needs Go (or a cached
build) for the Collector; skipped without it.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import threading
import time
from concurrent import futures
from pathlib import Path
from typing import Any

import grpc
from opentelemetry.proto.collector.metrics.v1 import metrics_service_pb2, metrics_service_pb2_grpc

from benchmarks.harness import emit, machine, proc_cpu_s, proc_rss_bytes
from benchmarks.peer_bench import sidecar, sidecar_config, training_node

ROOT = Path(__file__).resolve().parents[1]
BUILD = ROOT / "collector" / "scripts" / "build-otelcol.sh"

COLLECTOR_CONFIG = """
receivers:
  gpumetrics:
    endpoint: unix://{socket}
    collection_interval: {scrape_s}s
    initial_delay: 1s
    timeout: 5s
exporters:
  otlp_grpc:
    endpoint: 127.0.0.1:{port}
    tls:
      insecure: true
service:
  telemetry:
    metrics:
      level: none
    logs:
      level: warn
  pipelines:
    metrics:
      receivers: [gpumetrics]
      exporters: [otlp_grpc]
"""


class Downstream(metrics_service_pb2_grpc.MetricsServiceServicer):
    """An OTLP metrics endpoint that records, per export: arrival, points, point time range."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.exports: list[dict[str, Any]] = []

    def Export(self, request: Any, context: Any) -> Any:  # noqa: N802 - the gRPC method name
        arrived = time.time_ns()
        times = [
            dp.time_unix_nano
            for rm in request.resource_metrics
            for sm in rm.scope_metrics
            for m in sm.metrics
            for dp in getattr(m, m.WhichOneof("data")).data_points
        ]
        with self.lock:
            self.exports.append(
                {
                    "arrived_ns": arrived,
                    "points": len(times),
                    "bytes": request.ByteSize(),
                    "newest_ns": max(times, default=0),
                    "oldest_ns": min(times, default=0),
                }
            )
        return metrics_service_pb2.ExportMetricsServiceResponse()


def otelcol() -> str | None:
    """Path of the built Collector, or None when it cannot be built here."""
    env = os.environ.get("OTELCOL_GPUMETRICS")
    if env:
        return env
    try:
        res = subprocess.run([str(BUILD)], capture_output=True, text=True, timeout=900)
    except (OSError, subprocess.TimeoutExpired):
        return None
    lines = res.stdout.strip().splitlines()
    return lines[-1] if res.returncode == 0 and lines else None


def _quantiles(values: list[float]) -> dict[str, float | None]:
    v = sorted(values)
    if not v:
        return {"min": None, "median": None, "max": None}
    return {"min": v[0], "median": v[len(v) // 2], "max": v[-1]}


def run(args: argparse.Namespace, collector: str) -> dict[str, Any]:
    """Start the sidecar, the downstream and the Collector; measure the window."""
    out = Path(tempfile.mkdtemp(prefix="receiver-bench-"))
    scenario = training_node(args.gpus, args.processes_per_gpu, out / "scenario.yaml")
    config = sidecar_config(out / "gpumetrics.yaml")
    sock = out / "pull.sock"
    ours = sidecar(scenario, config, f"unix:{sock}", out)
    downstream = Downstream()
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
    metrics_service_pb2_grpc.add_MetricsServiceServicer_to_server(downstream, server)
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    col_config = out / "otelcol.yaml"
    col_config.write_text(
        COLLECTOR_CONFIG.format(socket=sock, scrape_s=args.scrape_s, port=port), encoding="utf-8"
    )
    col_log = open(out / "otelcol.log", "wb")  # noqa: SIM115 - closed below
    col = None
    try:
        end = time.monotonic() + 90
        while not sock.exists():
            if time.monotonic() > end or ours.proc.poll() is not None:
                raise RuntimeError(f"sidecar not listening; see {out / 'gpumetrics.log'}")
            time.sleep(0.2)
        col = subprocess.Popen(
            [collector, "--config", str(col_config)], stdout=col_log, stderr=subprocess.STDOUT
        )
        end = time.monotonic() + 90
        while not downstream.exports:
            if time.monotonic() > end or col.poll() is not None:
                raise RuntimeError(f"no export arrived; see {out / 'otelcol.log'}")
            time.sleep(0.2)
        time.sleep(args.warmup)
        with downstream.lock:
            first = len(downstream.exports)
        load0 = os.getloadavg()
        c0, s0, t0 = proc_cpu_s(col.pid), proc_cpu_s(ours.proc.pid), time.monotonic()
        time.sleep(args.window)
        c1, s1, t1 = proc_cpu_s(col.pid), proc_cpu_s(ours.proc.pid), time.monotonic()
        load1 = os.getloadavg()
        rss = proc_rss_bytes(col.pid)[0]
        with downstream.lock:
            window = downstream.exports[first:]
    finally:
        if col is not None:
            col.terminate()
            try:
                col.wait(15)
            except subprocess.TimeoutExpired:
                col.kill()
        col_log.close()
        ours.stop()
        server.stop(0)
    scrapes = len(window)
    newest = [(e["arrived_ns"] - e["newest_ns"]) / 1e9 for e in window if e["points"]]
    oldest = [(e["arrived_ns"] - e["oldest_ns"]) / 1e9 for e in window if e["points"]]
    return {
        "machine": machine(),
        "scenario": {"gpus": args.gpus, "processes": args.gpus * args.processes_per_gpu},
        "scrape_s": args.scrape_s,
        "window_s": t1 - t0,
        "loadavg_1m": [load0[0], load1[0]],
        "exports_in_window": scrapes,
        "points_per_export": sum(e["points"] for e in window) / scrapes if scrapes else None,
        "bytes_per_export": sum(e["bytes"] for e in window) / scrapes if scrapes else None,
        "collector_cpu_s": c1 - c0,
        "collector_cpu_ms_per_scrape": 1000 * (c1 - c0) / scrapes if scrapes else None,
        "collector_rss_bytes": rss,
        "sidecar_cpu_s_per_min": (s1 - s0) * 60 / (t1 - t0),
        "latency_newest_point_s": _quantiles(newest),
        "latency_oldest_point_s": _quantiles(oldest),
    }


def main() -> int:
    """Parse arguments, run, print and emit the result."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--gpus", type=int, default=8)
    ap.add_argument("--processes-per-gpu", type=int, default=8)
    ap.add_argument("--scrape-s", type=int, default=10)
    ap.add_argument("--warmup", type=float, default=15.0)
    ap.add_argument("--window", type=float, default=60.0)
    args = ap.parse_args()
    collector = otelcol()
    if collector is None:
        emit("receiver", {"skipped": "otelcol-gpumetrics could not be built (no Go toolchain?)"})
        return 0
    r = run(args, collector)
    per = r["collector_cpu_ms_per_scrape"]
    nl, ol = r["latency_newest_point_s"], r["latency_oldest_point_s"]
    print(
        f"Collector: {r['exports_in_window']} scrapes in {r['window_s']:.0f} s, "
        f"{r['points_per_export'] or 0:.0f} points and {(r['bytes_per_export'] or 0) / 1e6:.2f} MB "
        f"each; CPU {per if per is not None else float('nan'):.1f} ms per scrape; RSS "
        f"{r['collector_rss_bytes'] / 2**20:.1f} MiB; sidecar {r['sidecar_cpu_s_per_min']:.2f} "
        f"s/min; load {r['loadavg_1m'][0]:.2f}-{r['loadavg_1m'][1]:.2f}"
    )
    print(
        f"latency NVML read -> Collector exporter: newest point {nl['min']}-{nl['max']} s "
        f"(median {nl['median']}), oldest point median {ol['median']} s"
    )
    emit("receiver", r)
    return 0


if __name__ == "__main__":
    sys.exit(main())
