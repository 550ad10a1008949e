"""Cost of the simulated NVML driver itself (a benchmark, not a test).

Two measurements, through the real nvidia-ml-py functions on a manual clock:

1. Per call: µs per ``pynvml`` call for a few representative functions (scalar reading,
   struct reading, a two-call process list of 8 entries) -- ``wall`` is the whole pynvml call,
   ``sim`` the part inside the simulated C functions (``SimDriver.time_in_driver_s``).
2. Per cycle on 8 GPUs x N processes (default 512): one "exporter-like" pass per GPU (memory v2,
   power, energy, temperature, utilisation, 4 clocks, PCIe TX/RX with the 20 ms window off,
   compute and graphics lists, process utilisation, a GPU-utilisation sample read) plus
   ``nvmlSystemGetProcessName`` for every process; reports wall ms and sim ms per cycle and
   NVML C calls per cycle.

Run: ``python benchmarks/sim_overhead_bench.py [--processes 512] [--cycles 10] [--calls 20000]``.
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pynvml

if __package__ in (None, ""):  # run as a file: make the `benchmarks` package importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import nvmlsim as sim  # noqa: E402
from benchmarks.harness import emit, machine, node_scenario  # noqa: E402


def node(gpus: int, processes: int) -> sim.Scenario:
    """``gpus`` copies of the h100-sxm device, each with ``processes`` processes."""
    return sim.scenario_from_data(
        node_scenario(
            gpus,
            processes,
            process_fields={
                "name": "/usr/bin/python3",
                "used_memory_bytes": 1 << 26,
                "utilization": {
                    "sm": {"pattern": "sine", "min": 1, "max": 60, "period_s": 30},
                    "mem": 5,
                },
            },
        )
    )


def per_call(calls: int) -> list[tuple[str, float, float]]:
    """µs per call (wall, inside the simulator) for representative functions."""
    rows = []
    with sim.install(node(1, 8)) as drv:
        pynvml.nvmlInit()
        h = pynvml.nvmlDeviceGetHandleByIndex(0)
        cases: list[tuple[str, Callable[[], Any]]] = [
            ("nvmlDeviceGetPowerUsage", lambda: pynvml.nvmlDeviceGetPowerUsage(h)),
            (
                "nvmlDeviceGetMemoryInfo v2",
                lambda: pynvml.nvmlDeviceGetMemoryInfo(h, version=pynvml.nvmlMemory_v2),
            ),
            ("nvmlDeviceGetUtilizationRates", lambda: pynvml.nvmlDeviceGetUtilizationRates(h)),
            (
                "nvmlDeviceGetComputeRunningProcesses (8)",
                lambda: pynvml.nvmlDeviceGetComputeRunningProcesses(h),
            ),
        ]
        for name, fn in cases:
            fn()
            before = drv.time_in_driver_s
            start = time.perf_counter()
            for _ in range(calls):
                fn()
            wall = (time.perf_counter() - start) / calls * 1e6
            rows.append((name, wall, (drv.time_in_driver_s - before) / calls * 1e6))
    return rows


def per_cycle(gpus: int, processes: int, cycles: int) -> dict[str, float]:
    """Wall and simulator ms per exporter-like cycle, and C calls per cycle."""
    with sim.install(node(gpus, processes)) as drv:
        pynvml.nvmlInit()
        handles = [pynvml.nvmlDeviceGetHandleByIndex(i) for i in range(gpus)]
        cursors = [0] * gpus
        sample_cursors = [0] * gpus

        def cycle() -> None:
            for i, h in enumerate(handles):
                pynvml.nvmlDeviceGetMemoryInfo(h, version=pynvml.nvmlMemory_v2)
                pynvml.nvmlDeviceGetPowerUsage(h)
                pynvml.nvmlDeviceGetTotalEnergyConsumption(h)
                pynvml.nvmlDeviceGetTemperature(h, 0)
                pynvml.nvmlDeviceGetUtilizationRates(h)
                for clock in range(4):
                    pynvml.nvmlDeviceGetClockInfo(h, clock)
                pynvml.nvmlDeviceGetPcieThroughput(h, 0)
                pynvml.nvmlDeviceGetPcieThroughput(h, 1)
                procs = pynvml.nvmlDeviceGetComputeRunningProcesses(h)
                pynvml.nvmlDeviceGetGraphicsRunningProcesses(h)
                try:
                    samples = pynvml.nvmlDeviceGetProcessUtilization(h, cursors[i])
                    cursors[i] = max(s.timeStamp for s in samples)
                except pynvml.NVMLError_NotFound:
                    pass
                _, gpu_util = pynvml.nvmlDeviceGetSamples(
                    h, pynvml.NVML_GPU_UTILIZATION_SAMPLES, sample_cursors[i]
                )
                sample_cursors[i] = gpu_util[-1].timeStamp
                for p in procs:
                    pynvml.nvmlSystemGetProcessName(p.pid)

        drv.next_cycle()
        cycle()  # warm up
        drv.next_cycle()
        drv.reset_calls()
        before = drv.time_in_driver_s
        start = time.perf_counter()
        for _ in range(cycles):
            cycle()
            drv.next_cycle()
        wall = (time.perf_counter() - start) / cycles * 1e3
        return {
            "wall_ms": wall,
            "sim_ms": (drv.time_in_driver_s - before) / cycles * 1e3,
            "calls": sum(drv.calls.values()) / cycles,
        }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--processes", type=int, default=512)
    parser.add_argument("--gpus", type=int, default=8)
    parser.add_argument("--cycles", type=int, default=10)
    parser.add_argument("--calls", type=int, default=20000)
    ns = parser.parse_args()
    print(f"{'function':44} {'wall µs/call':>12} {'sim µs/call':>12}")
    calls = per_call(ns.calls)
    for name, wall, inside in calls:
        print(f"{name:44} {wall:12.2f} {inside:12.2f}")
    print()
    cycles = []
    for procs in sorted({0, 64, ns.processes}):
        r = per_cycle(ns.gpus, procs, ns.cycles)
        cycles.append({"gpus": ns.gpus, "processes_per_gpu": procs, **r})
        print(
            f"{ns.gpus} GPUs x {procs:4d} processes: {r['wall_ms']:8.1f} ms/cycle wall, "
            f"{r['sim_ms']:8.1f} ms inside the simulator, {r['calls']:7.0f} C calls/cycle"
        )
    emit(
        "sim_overhead",
        {
            "machine": machine(),
            "per_call_us": [{"function": n, "wall_us": w, "sim_us": i} for n, w, i in calls],
            "per_cycle": cycles,
        },
    )


if __name__ == "__main__":
    main()
