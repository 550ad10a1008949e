"""Pull: time and bytes to deliver a 60 s backlog through the real gRPC server on loopback.

The backlog is 6 store batches of 10 one-second cycles of the store's sizing node (8 GPUs of the
``h100-8x-training`` profile with 64 processes, 8 per GPU, each with a realistic declared
identity), built by the real collector, producer and resourcer (``benchmarks/workload.py``).
They are appended to the real ``BatchStore`` inside a real ``SidecarServer``
(``benchmarks/server_fixture.py``) running in **its own process**; this process is the consumer,
as the collector's receiver would be.

Per repetition a fresh consumer (registered at the oldest batch held; a first consumer that never
acknowledges keeps the batches held) runs the protocol's client loop with the default
``max_bytes`` (4 MiB - 64 KiB): Pull, acknowledge the answer in the next Pull, until ``more`` is
false. Reported: wall time of that drain (the delivery), the extra ``ack_only`` Pull, bytes and
pulls per delivery, the server process's CPU per delivery, and the client's protobuf decode time
of the delivered bytes (what a receiver adds, not part of the delivery).

Run: ``python -m benchmarks.pull_bench [--repetitions 20]``.
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from gpumetrics.v1 import pull_pb2
from opentelemetry.proto.collector.metrics.v1 import metrics_service_pb2

from benchmarks.harness import emit, machine, proc_cpu_s, proc_rss_bytes
from benchmarks.pullclient import PullConsumer, channel
from benchmarks.server_fixture import write_batches
from benchmarks.workload import node_batches

ROOT = Path(__file__).resolve().parents[1]
TARGET_MS = 100.0


def start_server(*extra: str) -> tuple[subprocess.Popen[str], str]:
    """Start ``benchmarks.server_fixture`` with ``extra`` arguments; return it and its address."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "benchmarks.server_fixture", *extra],
        cwd=ROOT,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    assert proc.stdout is not None
    line = proc.stdout.readline().split()
    if line[:1] != ["ADDR"]:
        proc.kill()
        raise RuntimeError(f"server fixture did not start: {line}")
    return proc, line[1]


def stop_server(proc: subprocess.Popen[str]) -> str:
    """Close the fixture's stdin, wait for it, return what it printed last."""
    out, _ = proc.communicate(input="", timeout=30)
    return out.strip()


def run(repetitions: int) -> dict[str, Any]:
    """Build the backlog, serve it, drain it ``repetitions`` times; return the figures."""
    t0 = time.perf_counter()
    batches = node_batches(gpus=8, processes_per_gpu=8, cycles_per_batch=10, batches=6)
    build_s = time.perf_counter() - t0
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "batches.bin"
        write_batches(batches, path)
        proc, addr = start_server("--batches", str(path), "--max-consumers", "64")
    ch = channel(addr)
    try:
        # "pin" registers with one Pull and never acknowledges: the batches stay held
        PullConsumer(ch, "pin").stub.Pull(
            pull_pb2.PullRequest(consumer="pin", max_bytes=1), timeout=30
        )
        warm = PullConsumer(ch, "warm-up")
        warm.drain()
        warm.ack_only()
        drains, acks, cpu = [], [], []
        for i in range(repetitions):
            c = PullConsumer(ch, f"bench-{i}")
            cpu0 = proc_cpu_s(proc.pid)
            d = c.drain(keep=(i == 0))
            ack_s = c.ack_only()
            cpu.append(proc_cpu_s(proc.pid) - cpu0)
            drains.append(d)
            acks.append(ack_s)
        first = drains[0]
        t0 = time.perf_counter()
        decoded = [
            metrics_service_pb2.ExportMetricsServiceRequest.FromString(p) for p in first.payloads
        ]
        decode_s = time.perf_counter() - t0
        rss, hwm = proc_rss_bytes(proc.pid)
    finally:
        ch.close()
        stop_server(proc)
    ms = sorted(1000 * d.seconds for d in drains)
    return {
        "machine": machine(),
        "backlog": {
            "gpus": 8,
            "processes": 64,
            "batches": len(batches),
            "seconds": 60,
            "points": first.points,
            "bytes": first.size_bytes,
            "build_s": build_s,
        },
        "repetitions": repetitions,
        "pulls_per_delivery": first.pulls,
        "delivery_ms": {
            "median": statistics.median(ms),
            "min": ms[0],
            "max": ms[-1],
            "p90": ms[int(0.9 * (len(ms) - 1))],
        },
        "ack_only_ms_median": 1000 * statistics.median(acks),
        "server_cpu_ms_per_delivery": 1000 * statistics.mean(cpu),
        "client_decode_ms": 1000 * decode_s,
        "decoded_resource_metrics": sum(len(r.resource_metrics) for r in decoded),
        "server_rss_bytes": rss,
        "server_hwm_bytes": hwm,
        "target_ms": TARGET_MS,
    }


def main() -> int:
    """Print and emit the figures."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repetitions", type=int, default=20)
    args = ap.parse_args()
    r = run(args.repetitions)
    b, d = r["backlog"], r["delivery_ms"]
    print(
        f"60 s backlog, 8 GPUs x 64 processes: {b['points']} points, {b['bytes'] / 2**20:.2f} MiB "
        f"in {r['pulls_per_delivery']} pulls; delivery median {d['median']:.1f} ms "
        f"(min {d['min']:.1f}, max {d['max']:.1f}); server CPU "
        f"{r['server_cpu_ms_per_delivery']:.1f} ms; client decode {r['client_decode_ms']:.1f} ms; "
        f"target < {TARGET_MS:.0f} ms"
    )
    emit("pull", r)
    return 0


if __name__ == "__main__":
    sys.exit(main())
