"""Realistic store batches: what the sidecar appends for a simulated node, built by the real parts.

:func:`node_batches` runs the real collector on the simulated driver (manual clock, one cycle per
simulated second) into the real ``Producer``, with a ``ProcessResourcer`` whose declared store
holds each process's realistic declaration (``identity_bench.payloads``: a 7-key process context,
OTEL_* environment, a 5-key Kubernetes/container profiler resource), and cuts one
``ExportMetricsServiceRequest`` per ``cycles_per_batch`` cycles, as the batcher does every
``runtime.batch_interval_s`` (10 s at a 1 s cadence by default).
"""

from __future__ import annotations

from typing import Any

from gpumetrics.identity.declared import DeclaredStore
from gpumetrics.identity.resourcer import new_process_resourcer
from gpumetrics.metrics.producer import Producer
from gpumetrics.nvml.collector import Collector
from gpumetrics.nvml.settings import CollectionSettings
from gpumetrics.selftelemetry import Telemetry

import nvmlsim as sim
from benchmarks.harness import node_scenario
from benchmarks.identity_bench import MemoryProcfs, payloads

PID_START = 100_000
PID_STRIDE = 10_000


def sizing_node(
    gpus: int = 8,
    processes_per_gpu: int = 8,
    profile: str = "h100-8x-training",
    resource_cache_max_bytes: int | None = None,
) -> tuple[Any, Collector, Producer]:
    """The simulated node of :func:`node_batches`, installed: ``(driver, collector, producer)``.

    ``resource_cache_max_bytes`` is the resourcer's ``cache_max_bytes``
    (``identity.resource_limits.cache_max_bytes``; None: its default, 16 MiB).

    The caller runs ``collector.collect_once()`` / ``driver.next_cycle()`` per simulated second
    and ``producer.collect()`` per batch, then ``collector.stop()`` and ``nvmlsim.uninstall()``.
    """
    data = node_scenario(
        gpus, processes_per_gpu, profile=profile, pid_start=PID_START, pid_stride=PID_STRIDE
    )
    pids = [PID_START + g * PID_STRIDE + k for g in range(gpus) for k in range(processes_per_gpu)]
    starts = {pid: 1000 + pid for pid in pids}
    declared = DeclaredStore(max_processes=max(len(pids), 1), start_time_reader=starts.get)
    for pid in pids:
        ctx, env, res = payloads(pid)
        declared.declare(pid, starts[pid], ctx, env, res, declarer="bench")
    settings = CollectionSettings(pid_max=4_194_304)
    drv = sim.install(sim.scenario_from_data(data), latency="off")
    clock = drv.clock
    now_ns = lambda: clock.now_us() * 1000  # noqa: E731
    tel = Telemetry(clock_ns=now_ns)
    producer = Producer(
        host_attributes={"host.name": "gpu-node-7"}, telemetry=tel, self_telemetry=tel
    )
    options: dict[str, Any] = {}
    if resource_cache_max_bytes is not None:
        options["cache_max_bytes"] = resource_cache_max_bytes
    producer.set_process_resourcer(
        new_process_resourcer(
            None,
            declared,
            "gpu-node-7",
            True,
            procfs=MemoryProcfs(starts),
            read_process_context=False,
            **options,
        )
    )
    col = Collector(producer, settings, tel, clock_ns=now_ns, monotonic_ns=now_ns)
    return drv, col, producer


def node_batches(
    gpus: int = 8,
    processes_per_gpu: int = 8,
    cycles_per_batch: int = 10,
    batches: int = 6,
    profile: str = "h100-8x-training",
) -> list[Any]:
    """``batches`` store batches of ``cycles_per_batch`` 1 s cycles each (see module docstring).

    The default is the store's sizing node: 8 GPUs with 64 processes (8 per GPU, each on one
    GPU), 10 s batches of 1 s samples; 6 batches are a 60 s backlog.
    """
    drv, col, producer = sizing_node(gpus, processes_per_gpu, profile)
    out = []
    try:
        col.collect_once()  # warm-up: init, discovery, first-read windows
        drv.next_cycle()
        producer.collect()
        for _ in range(batches):
            for _ in range(cycles_per_batch):
                col.collect_once()
                drv.next_cycle()
            out.append(producer.collect())
        col.stop(5.0)
    finally:
        sim.uninstall()
    return out


def main() -> int:
    """``python -m benchmarks.workload --out FILE [--batches N]``: write batches to FILE.

    Lets a benchmark build its batches in a child process, so the memory the build used does
    not stay in its own heap.
    """
    import argparse
    from pathlib import Path

    from benchmarks.server_fixture import write_batches

    ap = argparse.ArgumentParser(description=main.__doc__.splitlines()[0] if main.__doc__ else "")
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--batches", type=int, default=6)
    args = ap.parse_args()
    write_batches(node_batches(batches=args.batches), args.out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
