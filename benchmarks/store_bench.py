"""The durable store (``store.path``, issue 25): what it costs the sidecar, and how fast it writes.

Two parts:

1. **The sidecar with and without ``store.path``**, at the same time on the same machine: two
   ``gpumetrics serve --simulate h100-8x-training`` processes (the default 8-GPU node, every
   cadence at its default: 1 s collections, 10 s batches), one with a store directory, one in
   memory only. A consumer in this process pulls each of them every 10 s as the Collector's
   receiver does (drain with the acknowledgement in the next Pull, and a ``PullLogs``), so the
   durable one commits its appends, deliveries and acknowledgements. After a warm-up, each
   process's CPU (utime + stime of ``/proc/<pid>/stat``) over the window, and VmRSS/VmHWM at its
   end. Running both at once puts them under the same machine load; the order of the two
   processes alternates between repetitions.
2. **Store write throughput**, in this process: a real ``BatchStore`` with a journal in a
   temporary directory appends the store's sizing batches (8 GPUs x 64 processes, 10 one-second
   cycles each, about 1 MiB; ``benchmarks/workload.py``), and a consumer acknowledges each one
   (so every batch is inserted, then released, one fsync per commit); the same without a
   journal. Reported: batches/s and MiB/s of appends, and the seconds per append and per
   acknowledged pull.

Run: ``python -m benchmarks.store_bench [--window 120] [--warmup 20] [--repeat 3]``.
Figures: ``docs/performance.md`` ("The durable store").
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import grpc
from gpumetrics.store import BatchStore, SqliteJournal
from gpumetrics.v1 import logs_pull_pb2, logs_pull_pb2_grpc

from benchmarks.harness import emit, machine, proc_cpu_s, proc_rss_bytes
from benchmarks.pullclient import PullConsumer, channel
from benchmarks.workload import node_batches

TARGET_CPU_RATIO = 1.10
"""Issue 25: the durable store costs at most 10 % more sidecar CPU at the default cadences."""


class Sidecar:
    """One ``gpumetrics serve`` on the default simulated node, pulled every ``period_s``."""

    def __init__(self, name: str, out: Path, store: Path | None, period_s: float) -> None:
        self.name = name
        self.sock = f"unix:{out}/{name}.sock"
        argv = [sys.executable, "-m", "gpumetrics", "serve", "--simulate", "h100-8x-training",
                "--listen", self.sock, "--log-level", "warn"]  # fmt: skip
        if store is not None:
            argv += ["--store-path", str(store)]
        self._log = open(out / f"{name}.log", "wb")  # noqa: SIM115 - closed in stop()
        self.proc = subprocess.Popen(argv, stdout=self._log, stderr=subprocess.STDOUT)
        self._ch = channel(self.sock)
        self.consumer = PullConsumer(self._ch, "collector")
        self._logs = logs_pull_pb2_grpc.LogsPullServiceStub(self._ch)  # type: ignore[no-untyped-call]
        self.period_s = period_s
        self.pulls = self.failures = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name=f"pull-{name}", daemon=True)

    def wait_ready(self, timeout_s: float = 120.0) -> None:
        """Until a Pull succeeds (the first collection is stored)."""
        end = time.monotonic() + timeout_s
        while time.monotonic() < end:
            if self.proc.poll() is not None:
                raise RuntimeError(f"{self.name} exited with {self.proc.returncode}")
            try:
                self.consumer.drain()
                self._thread.start()
                return
            except grpc.RpcError:
                time.sleep(0.25)
        raise RuntimeError(f"{self.name}: no collection stored within {timeout_s} s")

    def _run(self) -> None:
        logs_epoch, logs_ack = "", 0
        while not self._stop.wait(self.period_s):
            try:
                self.consumer.drain()
                r = self._logs.PullLogs(
                    logs_pull_pb2.PullLogsRequest(
                        consumer="collector", ack_sequence=logs_ack, ack_epoch=logs_epoch
                    ),
                    timeout=30,
                )
                logs_epoch, logs_ack = r.epoch, r.last_sequence or logs_ack
                self.pulls += 1
            except grpc.RpcError:
                self.failures += 1

    def sample(self) -> tuple[float, int, int]:
        """CPU seconds so far, VmRSS and VmHWM (bytes)."""
        return (proc_cpu_s(self.proc.pid), *proc_rss_bytes(self.proc.pid))

    def stop(self) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(60)
        self._ch.close()
        self.proc.terminate()
        try:
            self.proc.wait(30)
        finally:
            self._log.close()


def sidecars(args: argparse.Namespace, out: Path) -> dict[str, Any]:
    """Part 1: CPU and RSS of the two sidecars, ``args.repeat`` windows."""
    runs = []
    for i in range(args.repeat):
        store = out / f"store-{i}"
        names = ["durable", "memory"] if i % 2 == 0 else ["memory", "durable"]
        procs = {
            n: Sidecar(f"{n}-{i}", out, store if n == "durable" else None, args.pull_s)
            for n in names
        }
        try:
            for p in procs.values():
                p.wait_ready()
            time.sleep(args.warmup)
            before = {n: p.sample() for n, p in procs.items()}
            time.sleep(args.window)
            after = {n: p.sample() for n, p in procs.items()}
            run = {
                n: {
                    "cpu_s_per_min": (after[n][0] - before[n][0]) * 60.0 / args.window,
                    "rss_bytes": after[n][1],
                    "hwm_bytes": after[n][2],
                    "pulls": procs[n].pulls,
                    "pull_failures": procs[n].failures,
                }
                for n in procs
            }
            run["store_bytes"] = sum(f.stat().st_size for f in store.iterdir())
            run["cpu_ratio"] = run["durable"]["cpu_s_per_min"] / run["memory"]["cpu_s_per_min"]
            runs.append(run)
            print(
                f"window {i + 1}: durable {run['durable']['cpu_s_per_min']:.2f} CPU-s/min, "
                f"memory {run['memory']['cpu_s_per_min']:.2f} CPU-s/min "
                f"(ratio {run['cpu_ratio']:.3f}); RSS {run['durable']['rss_bytes'] >> 20} / "
                f"{run['memory']['rss_bytes'] >> 20} MiB; store files {run['store_bytes']} B",
                flush=True,
            )
        finally:
            for p in procs.values():
                p.stop()
    ratios = [r["cpu_ratio"] for r in runs]
    return {
        "window_s": args.window,
        "warmup_s": args.warmup,
        "pull_period_s": args.pull_s,
        "runs": runs,
        "median_cpu_ratio": statistics.median(ratios),
        "target_cpu_ratio": TARGET_CPU_RATIO,
        "within_target": statistics.median(ratios) <= TARGET_CPU_RATIO,
    }


def throughput(args: argparse.Namespace, out: Path) -> dict[str, Any]:
    """Part 2: appends and acknowledged pulls per second, with and without a journal."""
    batches = node_batches(batches=args.batches)
    parts = [[(b.SerializeToString(), 0)] for b in batches]
    size = sum(len(p[0][0]) for p in parts) / len(parts)
    result: dict[str, Any] = {"batch_bytes": size, "appends": args.appends}
    for mode in ("memory", "durable"):
        directory = out / f"throughput-{mode}"
        journal = None
        if mode == "durable":
            journal = SqliteJournal.in_directory(
                str(directory), signal="metrics", node="bench", written_by="bench"
            )
        store = BatchStore(journal=journal)
        store.pull("collector")
        append_s = pull_s = 0.0
        epoch, ack = store.epoch, 0
        for i in range(args.appends):
            t0 = time.perf_counter()
            store.append_parts(parts[i % len(parts)])
            t1 = time.perf_counter()
            r = store.pull("collector", ack, epoch)
            ack = r.last_sequence or ack
            pull_s += time.perf_counter() - t1
            append_s += t1 - t0
        store.close()
        result[mode] = {
            "append_ms": 1000 * append_s / args.appends,
            "pull_with_ack_ms": 1000 * pull_s / args.appends,
            "batches_per_s": args.appends / append_s,
            "mib_per_s": args.appends * size / append_s / 2**20,
        }
        print(
            f"{mode}: append {result[mode]['append_ms']:.2f} ms "
            f"({result[mode]['batches_per_s']:.0f} batches/s, "
            f"{result[mode]['mib_per_s']:.0f} MiB/s of {size / 2**20:.2f} MiB batches), "
            f"pull + acknowledgement {result[mode]['pull_with_ack_ms']:.2f} ms",
            flush=True,
        )
        shutil.rmtree(directory, ignore_errors=True)
    return result


def main() -> int:
    """Run both parts and print the JSON result."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--window", type=float, default=120.0, help="measured seconds per run")
    ap.add_argument("--warmup", type=float, default=20.0, help="seconds before measuring")
    ap.add_argument("--repeat", type=int, default=3, help="windows (the order alternates)")
    ap.add_argument("--pull-s", type=float, default=10.0, help="the consumer's interval")
    ap.add_argument("--batches", type=int, default=3, help="distinct sizing batches to build")
    ap.add_argument("--appends", type=int, default=60, help="appends per store (part 2)")
    ap.add_argument("--skip-sidecars", action="store_true", help="part 2 only")
    args = ap.parse_args()
    out = Path(tempfile.mkdtemp(prefix="gpumetrics-store-bench-"))
    try:
        result: dict[str, Any] = {"machine": machine()}
        result["throughput"] = throughput(args, out)
        if not args.skip_sidecars:
            result["sidecars"] = sidecars(args, out)
    finally:
        shutil.rmtree(out, ignore_errors=True)
    emit("store", result)
    return 0


if __name__ == "__main__":
    sys.exit(main())
