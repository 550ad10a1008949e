"""Collection cost per cycle on the simulated driver (a benchmark, not a test).

For 1 and 8 simulated H100s with 0, 64 and 512 processes *per GPU*, runs the real collector
(worker threads, gate, readers, producer) on the simulated driver with a manual clock and
reports, per steady-state cycle:

- ``cpu ms``: process CPU time (all threads) of ``Collector.collect_once``;
- ``sim ms``: the part of it spent inside the simulated driver's C functions (CPU time the
  simulator accumulates, ``cpu_in_driver_s``; on hardware this is libnvidia-ml's own cost);
- ``ours ms``: cpu - sim, the collector's own cost;
- ``encode ms``: CPU of the batcher turning that cycle into OTLP and storing it
  (``Batcher.run_once()``: the producer's encoding and ``BatchStore.append``);
- ``calls``: NVML C calls per cycle (sizing and data calls counted separately, as the driver
  sees them), against ``min``, the calls the metric set needs (see :func:`minimum_calls`).

PCIe's built-in 20 ms window is turned off (it would only advance simulated time); on
hardware each PCIe read costs ~40 ms of wall time per GPU on its worker, every
``pcie_interval_s``.

``--scale`` runs the scale series instead (issue 18): 8 GPUs of the ``h100-8x-training``
profile with 64, 256, 512 and 2048 processes *per GPU*, each process declared by a profiler
(the realistic declarations of :mod:`benchmarks.workload`, so per-process identity goes through
the real ``ProcessResourcer``), and per 1 s cycle the collector's CPU plus a tenth of one
``Batcher.run_once()`` (the 10 s batch's identity, OTLP encoding and ``BatchStore`` append, as
the sidecar's batcher runs it):
``cpu ms`` = collect + batch / 10; ``sim ms`` the simulator's CPU
(``SimDriver.cpu_in_driver_s``, both parts), ``ours`` the rest.

``--kernels python`` encodes with the pure-Python kernels of the bulk encoder, ``compiled``
with ``_wire.c`` (default ``auto``: the compiled ones where they were built); the result says
which (``kernels``). ``--resource-cache-mib`` sets the resourcer's
``identity.resource_limits.cache_max_bytes`` for ``--scale`` (default 16 MiB, which holds
about 14 600 of these processes' resources, 1.1 kB each by the cache's estimate; at 2048 per
GPU, 16 384 processes, each batch then resolves every process again: least recently used out
first, in pid order, leaves no hit).

Run: ``python benchmarks/collection_bench.py [--cycles 30] [--scale] [--kernels auto]
[--resource-cache-mib N]``.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

if __package__ in (None, ""):  # run as a file: make the `benchmarks` package importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import threading  # noqa: E402

from gpumetrics.metrics.producer import Producer  # noqa: E402
from gpumetrics.nvml.collector import Collector  # noqa: E402
from gpumetrics.nvml.settings import CollectionSettings  # noqa: E402
from gpumetrics.runtime.batcher import Batcher  # noqa: E402
from gpumetrics.selftelemetry import Telemetry  # noqa: E402
from gpumetrics.store import BatchStore  # noqa: E402

import nvmlsim as sim  # noqa: E402
from benchmarks.harness import (  # noqa: E402
    KERNEL_CHOICES,
    emit,
    machine,
    node_scenario,
    select_kernels,
)
from benchmarks.nvml_minimum import device_facts, minimum_calls  # noqa: E402
from benchmarks.workload import sizing_node  # noqa: E402

SCALE = (64, 256, 512, 2048)
"""Processes per GPU of the scale series (8 GPUs)."""


def scenario(gpus: int, processes: int) -> sim.Scenario:
    """``gpus`` H100s (the h100-sxm profile's device) with ``processes`` processes each."""
    return sim.scenario_from_data(node_scenario(gpus, processes))


def _batcher(producer: Producer) -> Batcher:
    """The sidecar's batcher on a store with default limits, run by hand (``run_once``)."""
    return Batcher(producer, BatchStore(), 3600.0, threading.Event())


def measure(gpus: int, processes: int, cycles: int) -> dict[str, float]:
    """Run ``cycles`` steady-state cycles and return per-cycle figures."""
    settings = CollectionSettings(pid_max=4_194_304)
    scn = scenario(gpus, processes)
    facts = device_facts(scn.devices[0].model_dump(mode="json", exclude_unset=True))
    drv = sim.install(scn, latency="off")
    try:
        clock = drv.clock
        tel = Telemetry(clock_ns=lambda: clock.now_us() * 1000)
        prod = Producer(self_telemetry=tel)
        col = Collector(
            prod,
            settings,
            tel,
            clock_ns=lambda: clock.now_us() * 1000,
            monotonic_ns=lambda: clock.now_us() * 1000,
        )
        batcher = _batcher(prod)
        for _ in range(3):  # warm-up: init, discovery, capability probing, first-read windows
            col.collect_once()
            batcher.run_once()
            drv.next_cycle()
        start = drv.stats()
        cpu = encode = 0.0
        points = 0
        for _ in range(cycles):
            t0 = time.process_time()
            report = col.collect_once()
            t1 = time.process_time()
            batcher.run_once()
            t2 = time.process_time()
            cpu += t1 - t0
            encode += t2 - t1
            points += report.points
            drv.next_cycle()
        end = drv.stats()
        col.stop(5.0)
    finally:
        sim.uninstall()
    sim_s = end["cpu_in_driver_s"] - start["cpu_in_driver_s"]
    return {
        "cpu_ms": 1000 * cpu / cycles,
        "sim_ms": 1000 * sim_s / cycles,
        "ours_ms": 1000 * (cpu - sim_s) / cycles,
        "encode_ms": 1000 * encode / cycles,
        "calls": (end["calls"] - start["calls"]) / cycles,
        "min": minimum_calls(gpus, processes, settings, facts),
        "points": points / cycles,
    }


def measure_scale(
    processes: int, batches: int, gpus: int = 8, resource_cache_max_bytes: int | None = None
) -> dict[str, float]:
    """Per 1 s cycle: collection plus a tenth of the batch, with identity (module docstring)."""
    drv, col, prod = sizing_node(gpus, processes, resource_cache_max_bytes=resource_cache_max_bytes)
    batcher = _batcher(prod)
    try:
        for _ in range(3):  # warm-up: init, discovery, capability probing, first-read windows
            col.collect_once()
            drv.next_cycle()
        batcher.run_once()
        start = drv.stats()
        collect = batch = 0.0
        points = cycles = 0
        for _ in range(batches):
            for _ in range(10):
                t0 = time.process_time()
                points += col.collect_once().points
                collect += time.process_time() - t0
                cycles += 1
                drv.next_cycle()
            t0 = time.process_time()
            batcher.run_once()
            batch += time.process_time() - t0
        end = drv.stats()
        col.stop(5.0)
    finally:
        sim.uninstall()
    sim_s = end["cpu_in_driver_s"] - start["cpu_in_driver_s"]
    cpu = collect + batch
    return {
        "cpu_ms": 1000 * cpu / cycles,
        "sim_ms": 1000 * sim_s / cycles,
        "ours_ms": 1000 * (cpu - sim_s) / cycles,
        "collect_ms": 1000 * collect / cycles,
        "batch_ms_per_cycle": 1000 * batch / cycles,
        "calls": (end["calls"] - start["calls"]) / cycles,
        "points": points / cycles,
        "us_per_process": 1e6 * cpu / cycles / (gpus * processes),
    }


def scale(
    batches: int,
    sizes: tuple[int, ...] = SCALE,
    kernels: str = "auto",
    resource_cache_max_bytes: int | None = None,
) -> None:
    """Print the scale series (and its JSON result line)."""
    print(f"kernels: {kernels}; resource cache: {resource_cache_max_bytes or 'default'} bytes")
    print(
        f"{'gpus':>4} {'procs/gpu':>9} {'procs':>6} {'cpu ms':>8} {'sim ms':>8} {'ours ms':>8} "
        f"{'collect':>8} {'batch/10':>8} {'points':>7} {'us/proc':>7}"
    )
    rows = []
    for processes in sizes:
        r = measure_scale(processes, batches, resource_cache_max_bytes=resource_cache_max_bytes)
        print(
            f"{8:>4} {processes:>9} {8 * processes:>6} {r['cpu_ms']:>8.2f} {r['sim_ms']:>8.2f} "
            f"{r['ours_ms']:>8.2f} {r['collect_ms']:>8.2f} {r['batch_ms_per_cycle']:>8.2f} "
            f"{r['points']:>7.0f} {r['us_per_process']:>7.2f}",
            flush=True,
        )
        rows.append({"gpus": 8, "processes_per_gpu": processes, **r})
    emit(
        "collection_scale",
        {
            "machine": machine(),
            "batches": batches,
            "kernels": kernels,
            "resource_cache_max_bytes": resource_cache_max_bytes,
            "rows": rows,
        },
    )


def main() -> None:
    """Print the table (and the JSON result line for ``run_all.py``)."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cycles", type=int, default=30)
    parser.add_argument("--scale", action="store_true", help="the scale series (docstring)")
    parser.add_argument("--batches", type=int, default=3, help="10 s batches per --scale row")
    parser.add_argument(
        "--sizes",
        type=lambda text: tuple(int(n) for n in text.split(",")),
        default=SCALE,
        metavar="N,M",
        help="processes per GPU of the --scale rows (default 64,256,512,2048)",
    )
    parser.add_argument("--kernels", choices=KERNEL_CHOICES, default="auto")
    parser.add_argument(
        "--resource-cache-mib",
        type=int,
        default=None,
        help="--scale: identity.resource_limits.cache_max_bytes in MiB (default: its default)",
    )
    args = parser.parse_args()
    kernels = select_kernels(args.kernels)
    if args.scale:
        cache = None if args.resource_cache_mib is None else args.resource_cache_mib << 20
        scale(args.batches, args.sizes, kernels, cache)
        return
    rows = []
    print(f"kernels: {kernels}")
    print(
        f"{'gpus':>4} {'procs/gpu':>9} {'cpu ms':>8} {'sim ms':>8} {'ours ms':>8} "
        f"{'encode ms':>9} {'calls':>7} {'min':>7} {'points':>7}"
    )
    for gpus in (1, 8):
        for processes in (0, 64, 512):
            r = measure(gpus, processes, args.cycles)
            print(
                f"{gpus:>4} {processes:>9} {r['cpu_ms']:>8.2f} {r['sim_ms']:>8.2f} "
                f"{r['ours_ms']:>8.2f} {r['encode_ms']:>9.2f} {r['calls']:>7.1f} "
                f"{r['min']:>7.1f} {r['points']:>7.0f}"
            )
            rows.append({"gpus": gpus, "processes_per_gpu": processes, **r})
    emit(
        "collection",
        {"machine": machine(), "cycles": args.cycles, "kernels": kernels, "rows": rows},
    )


if __name__ == "__main__":
    main()
