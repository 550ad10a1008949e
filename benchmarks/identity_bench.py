"""Benchmark of gpumetrics.identity at scale (not a test): lookups/s and memory per process.

Run: ``python benchmarks/identity_bench.py [--processes 100000] [--seconds 2]
[--mode profiler|enriched]`` (the resourcer's ``identity.mode``; default ``profiler``)

Measures, with N declared processes carrying realistic payloads (a 7-key SDK process context
as the C publisher writes it, OTEL_SERVICE_NAME + OTEL_RESOURCE_ATTRIBUTES, and a 5-key profiler
resource):

* declarations/s through ``DeclaredStore.declare`` (validation and protobuf decoding included);
* memory per declared process (tracemalloc, and the RSS delta);
* ``DeclaredStore.lookup`` per second, with an in-memory start-time reader (store cost only);
* ``lookup`` per second with the real procfs reader on a live pid (adds one ``stat`` read);
* ``ProcessResourcer.put_resource`` per second for all N processes, first cycle (every
  resource computed) and later cycles (cache hits), with procfs answered from memory, plus
  the resourcer cache's memory per process;
* ``put_resource`` per second for one live process through the real /proc (cache hit).
"""

from __future__ import annotations

import argparse
import gc
import os
import random
import time
import tracemalloc
from collections.abc import Callable

from gpumetrics.identity.attrs import to_key_values
from gpumetrics.identity.cgroup import container_id
from gpumetrics.identity.ctxproto import encode_process_context
from gpumetrics.identity.declared import DeclaredStore
from gpumetrics.identity.procfs import ProcessInfo, ProcfsReader
from gpumetrics.identity.resourcer import new_process_resourcer
from opentelemetry.proto.resource.v1 import resource_pb2


def _rss_bytes() -> int:
    with open("/proc/self/statm") as fh:
        return int(fh.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def payloads(i: int) -> tuple[bytes, list[tuple[str, bytes]], bytes]:
    """A realistic declaration of process ``i``: (process context, environment, profiler resource).

    The context is a 7-key SDK resource as the C publisher writes it; the environment holds
    OTEL_SERVICE_NAME and OTEL_RESOURCE_ATTRIBUTES; the profiler resource has 5 keys
    (container.id, k8s namespace/pod/container/uid).
    """
    ctx = encode_process_context(
        {
            "deployment.environment.name": "production",
            "service.instance.id": f"{i:08x}-1d2e-4f5a-8b9c-0d1e2f3a4b5c",
            "service.name": f"trainer-{i % 500}",
            "service.version": "1.4.2",
            "telemetry.sdk.language": "python",
            "telemetry.sdk.version": "1.45.0",
            "telemetry.sdk.name": "opentelemetry",
        }
    )
    env = [
        ("OTEL_SERVICE_NAME", f"trainer-{i % 500}".encode()),
        ("OTEL_RESOURCE_ATTRIBUTES", b"service.namespace=ml,deployment.environment.name=prod"),
    ]
    res = resource_pb2.Resource()
    to_key_values(
        res.attributes,
        {
            "container.id": f"{i:064x}",
            "k8s.namespace.name": "ml",
            "k8s.pod.name": f"trainer-{i % 500}-{i}",
            "k8s.container.name": "main",
            "k8s.pod.uid": f"{i:08x}-0000-4000-8000-000000000000",
        },
    )
    return ctx, env, res.SerializeToString()


class MemoryProcfs(ProcfsReader):
    """A procfs answered from memory, so the benchmark measures identity code, not the disk."""

    def __init__(self, starts: dict[int, int]) -> None:
        super().__init__("/nonexistent", host_pid_namespace=True, resolve_user_names=False)
        self.starts = starts
        self._boot_ns = 1_700_000_000 * 10**9

    def start_time_ticks(self, pid: int) -> int | None:
        return self.starts.get(pid)

    def read(self, pid: int) -> ProcessInfo | None:
        start = self.starts.get(pid)
        if start is None:
            return None
        cgroup = "0::/kubepods/besteffort/pod1/" + f"{pid:064x}"
        return ProcessInfo(
            pid=pid,
            start_time_ticks=start,
            ppid=1,
            comm="python3",
            exe_target="/usr/bin/python3.11",
            cmdline=("python3", "train.py"),
            uid=1000,
            owner=None,
            environ=None,
            env_vars={"OTEL_SERVICE_NAME": b"trainer"},
            cgroup=cgroup,
            container_id=container_id(cgroup),
        )


def _rate(fn: Callable[[], int], seconds: float) -> float:
    """Call ``fn`` (which returns how many operations it did) until ``seconds`` pass."""
    done = 0
    start = time.perf_counter()
    deadline = start + seconds
    while True:
        done += fn()
        now = time.perf_counter()
        if now >= deadline:
            return done / (now - start)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--processes", type=int, default=100_000)
    ap.add_argument("--seconds", type=float, default=2.0)
    ap.add_argument("--mode", choices=["profiler", "enriched"], default="profiler")
    args = ap.parse_args()
    n, secs = args.processes, args.seconds

    starts = {pid: 1000 + pid for pid in range(1, n + 1)}
    inputs = [payloads(pid) for pid in range(1, n + 1)]
    store = DeclaredStore(max_processes=n, start_time_reader=starts.get)

    # Timing without tracemalloc (it slows allocation), then memory on a second, traced store.
    timed = DeclaredStore(max_processes=n, start_time_reader=starts.get)
    gc.collect()
    base_rss = _rss_bytes()
    t0 = time.perf_counter()
    for pid, (ctx, env, res) in zip(range(1, n + 1), inputs, strict=True):
        timed.declare(pid, starts[pid], ctx, env, res, declarer="bench")
    declare_s = time.perf_counter() - t0
    gc.collect()
    rss = _rss_bytes() - base_rss
    del timed
    gc.collect()
    tracemalloc.start()
    base_traced = tracemalloc.get_traced_memory()[0]
    for pid, (ctx, env, res) in zip(range(1, n + 1), inputs, strict=True):
        store.declare(pid, starts[pid], ctx, env, res, declarer="bench")
    gc.collect()
    traced = tracemalloc.get_traced_memory()[0] - base_traced
    tracemalloc.stop()
    assert len(store) == n

    pids = list(range(1, n + 1))
    random.Random(1).shuffle(pids)

    def lookups() -> int:
        for pid in pids:
            store.lookup(pid)
        return len(pids)

    lookup_rate = _rate(lookups, secs)

    me = os.getpid()
    procfs = ProcfsReader("/proc", host_pid_namespace=True)
    real = DeclaredStore(start_time_reader=procfs.start_time_ticks)
    ctx, env, res = inputs[0]
    real.declare(me, procfs.start_time_ticks(me) or 0, ctx, env, res)

    def real_lookups() -> int:
        for _ in range(1000):
            real.lookup(me)
        return 1000

    real_lookup_rate = _rate(real_lookups, secs)

    mem_procfs = MemoryProcfs(starts)
    resourcer = new_process_resourcer(
        None, store, "node-1", True, procfs=mem_procfs, read_process_context=False, mode=args.mode
    )
    t0 = time.perf_counter()
    for pid in pids:
        resourcer.put_resource(pid, {})
    cold_s = time.perf_counter() - t0
    # memory of the resourcer's cache: a second resourcer filled under tracemalloc
    traced_resourcer = new_process_resourcer(
        None, store, "node-1", True, procfs=mem_procfs, read_process_context=False, mode=args.mode
    )
    gc.collect()
    tracemalloc.start()
    base_traced = tracemalloc.get_traced_memory()[0]
    for pid in pids:
        traced_resourcer.put_resource(pid, {})
    gc.collect()
    cache_traced = tracemalloc.get_traced_memory()[0] - base_traced
    tracemalloc.stop()
    del traced_resourcer

    def warm_cycle() -> int:
        for pid in pids:
            resourcer.put_resource(pid, {})
        return len(pids)

    warm_rate = _rate(warm_cycle, secs)

    live = new_process_resourcer(None, real, "node-1", False, procfs=procfs, mode=args.mode)
    live.put_resource(me, {})

    def live_cycle() -> int:
        for _ in range(1000):
            live.put_resource(me, {})
        return 1000

    live_rate = _rate(live_cycle, secs)

    print(
        f"gpumetrics.identity benchmark: {n} declared processes, {os.cpu_count()} CPUs, "
        f"identity.mode {args.mode}"
    )
    print(f"  declare:                      {n / declare_s:12,.0f} declarations/s")
    print(f"  memory per declared process:  {traced / n:12,.0f} B (tracemalloc)")
    print(f"                                {rss / n:12,.0f} B (RSS delta)")
    print(f"  DeclaredStore.lookup:         {lookup_rate:12,.0f} lookups/s (in-memory start times)")
    print(f"  lookup via /proc/<pid>/stat:  {real_lookup_rate:12,.0f} lookups/s (one live pid)")
    print(f"  put_resource, first cycle:    {n / cold_s:12,.0f} processes/s (all computed)")
    print(f"  put_resource, later cycles:   {warm_rate:12,.0f} processes/s (cache hits)")
    print(f"  resourcer cache per process:  {cache_traced / n:12,.0f} B (tracemalloc)")
    print(f"  put_resource via real /proc:  {live_rate:12,.0f} calls/s (one live pid, cached)")
    print(f"  resourcer stats: {resourcer.stats()}")


if __name__ == "__main__":
    main()
