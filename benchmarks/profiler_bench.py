"""Profiler integration: declarations per second through gRPC, and memory per tracked process.

The sidecar's real ``SidecarServer`` and ``DeclaredStore`` (default limits: 100 000 processes;
real procfs start-time reader) run in their own process (``benchmarks/server_fixture.py``);
this process is the profiler. Each declaration is realistic (``identity_bench.payloads``: a
7-key OTEP 4719 process context, OTEL_SERVICE_NAME + OTEL_RESOURCE_ATTRIBUTES, a 5-key profiler
resource; about 700 bytes on the wire) for pids 1 000 000+ (above this host's ``pid_max``, so
the start-time reader finds no live process, as for a process in another pid namespace).

1. **Batched:** 100 000 declarations in ``DeclareProcesses`` requests of ``--batch`` entries
   (default 1000, under the 4096 limit), one after another. Rate = declarations / wall time.
2. **Memory:** the server process's RSS before and after holding those 100 000 processes, per
   process (includes the allocator's and gRPC's share; ``identity_bench`` reports the store's
   own tracemalloc figure).
3. **Streamed:** the same 100 000 pids declared again over one ``StreamDeclarations`` stream
   (one event per declaration, every response read), replacing the held declarations.
4. **Streamed in batches:** the same again as a profiler's resync over one stream:
   ``ResyncBegin``, ``DeclareBatch`` events of ``--stream-batch`` declarations (default 256, what
   ``collector/pkg/declarer`` sends), ``ResyncEnd``; one response per batch.

The declared store's byte budget is raised to hold them all (the default,
``identity.declared.max_bytes`` 64 MiB, holds about 17 000 of these by its decoded-size
estimate: beyond that the rates would be those of refusals); ``accepted`` counts what each
phase had held.

Targets (issue 7): at least 20 000 declarations per second; under 2 KiB per tracked process.

Run: ``python -m benchmarks.profiler_bench [--processes 100000] [--batch 1000]``.
"""

from __future__ import annotations

import argparse
import sys
import threading
import time
from typing import Any

from gpumetrics.v1 import profiler_pb2 as pb
from gpumetrics.v1 import profiler_pb2_grpc

from benchmarks.harness import emit, machine, proc_cpu_s, proc_rss_bytes
from benchmarks.identity_bench import payloads
from benchmarks.pull_bench import start_server, stop_server
from benchmarks.pullclient import channel

PID_BASE = 1_000_000
TARGET_RATE = 20_000
TARGET_BYTES = 2048
DECODED_BYTES_BOUND = 8192
"""Above the store's decoded-size estimate of one declaration here (about 3.9 kB)."""


def declarations(n: int) -> list[pb.ProcessDeclaration]:
    """``n`` realistic declarations (pids from :data:`PID_BASE`)."""
    out = []
    for i in range(n):
        pid = PID_BASE + i
        ctx, env, res = payloads(pid)
        out.append(
            pb.ProcessDeclaration(
                pid=pid,
                start_time_ticks=1000 + i,
                process_context=ctx,
                environment=[pb.EnvironmentVariable(name=k, value=v) for k, v in env],
                profiler_resource=res,
            )
        )
    return out


def run(n: int, batch: int, stream_batch: int = 256) -> dict[str, Any]:
    """Declare ``n`` processes batched, then streamed; return the figures."""
    decls = declarations(n)
    wire = sum(d.ByteSize() for d in decls) / n
    # room for every declaration twice over (a resync holds the old view until ResyncEnd), so
    # each phase measures declarations held, not the store's byte limit refusing them
    proc, addr = start_server("--declared-max-bytes", str(n * 2 * DECODED_BYTES_BOUND))
    ch = channel(addr)
    stub = profiler_pb2_grpc.ProfilerIntegrationServiceStub(ch)  # type: ignore[no-untyped-call]
    try:
        time.sleep(0.5)  # let the server's threads settle before the baseline
        rss0, _ = proc_rss_bytes(proc.pid)
        cpu0 = proc_cpu_s(proc.pid)
        accepted = 0
        t0 = time.perf_counter()
        for at in range(0, n, batch):
            r = stub.DeclareProcesses(
                pb.DeclareProcessesRequest(processes=decls[at : at + batch]), timeout=60
            )
            accepted += r.accepted
        batched_s = time.perf_counter() - t0
        batched_cpu = proc_cpu_s(proc.pid) - cpu0
        rss1, _ = proc_rss_bytes(proc.pid)

        def events() -> Any:
            for d in decls:
                yield pb.StreamDeclarationsRequest(declare=d)

        stream_ok = 0
        done = threading.Event()
        cpu0 = proc_cpu_s(proc.pid)
        t0 = time.perf_counter()
        for resp in stub.StreamDeclarations(events(), timeout=600):
            stream_ok += resp.accepted
        streamed_s = time.perf_counter() - t0
        streamed_cpu = proc_cpu_s(proc.pid) - cpu0
        done.set()

        def batched_events() -> Any:
            yield pb.StreamDeclarationsRequest(resync_begin=pb.ResyncBegin())
            for at in range(0, n, stream_batch):
                batch = pb.DeclareBatch(processes=decls[at : at + stream_batch])
                yield pb.StreamDeclarationsRequest(declare_batch=batch)
            yield pb.StreamDeclarationsRequest(resync_end=pb.ResyncEnd())

        stream_batched_ok = 0
        cpu0 = proc_cpu_s(proc.pid)
        t0 = time.perf_counter()
        for resp in stub.StreamDeclarations(batched_events(), timeout=600):
            stream_batched_ok += resp.declared
        stream_batched_s = time.perf_counter() - t0
        stream_batched_cpu = proc_cpu_s(proc.pid) - cpu0
        rss2, hwm = proc_rss_bytes(proc.pid)
    finally:
        ch.close()
        held = stop_server(proc)
    return {
        "machine": machine(),
        "processes": n,
        "batch": batch,
        "wire_bytes_per_declaration": wire,
        "batched": {
            "accepted": accepted,
            "seconds": batched_s,
            "per_s": n / batched_s,
            "server_cpu_us_per_declaration": 1e6 * batched_cpu / n,
        },
        "streamed": {
            "accepted": stream_ok,
            "seconds": streamed_s,
            "per_s": n / streamed_s,
            "server_cpu_us_per_declaration": 1e6 * streamed_cpu / n,
        },
        "streamed_batches": {
            "batch": stream_batch,
            "accepted": stream_batched_ok,
            "seconds": stream_batched_s,
            "per_s": n / stream_batched_s,
            "server_cpu_us_per_declaration": 1e6 * stream_batched_cpu / n,
        },
        "memory": {
            "rss_before_bytes": rss0,
            "rss_after_batched_bytes": rss1,
            "rss_after_streamed_bytes": rss2,
            "hwm_bytes": hwm,
            "bytes_per_process": (rss1 - rss0) / n,
        },
        "server_final": held,
        "target_per_s": TARGET_RATE,
        "target_bytes_per_process": TARGET_BYTES,
    }


def main() -> int:
    """Print and emit the figures."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--processes", type=int, default=100_000)
    ap.add_argument("--batch", type=int, default=1000)
    ap.add_argument("--stream-batch", type=int, default=256, help="declarations per DeclareBatch")
    args = ap.parse_args()
    r = run(args.processes, args.batch, args.stream_batch)
    print(
        f"{r['processes']} declarations ({r['wire_bytes_per_declaration']:.0f} B each): batched "
        f"{r['batched']['per_s']:,.0f}/s, streamed {r['streamed']['per_s']:,.0f}/s, streamed "
        f"in batches of {r['streamed_batches']['batch']} "
        f"{r['streamed_batches']['per_s']:,.0f}/s; "
        f"server RSS {r['memory']['bytes_per_process']:,.0f} B per tracked process "
        f"(targets >= {TARGET_RATE:,}/s, < {TARGET_BYTES} B)"
    )
    emit("profiler", r)
    return 0


if __name__ == "__main__":
    sys.exit(main())
