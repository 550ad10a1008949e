"""Cost of the energy and accounting sources (issue 26): 8 GPUs × 64 processes, with and without.

The node: ``gpus`` H100s (the ``h100-sxm`` profile's device) with accounting mode on, each with
``processes`` long-running processes (sm 20 %, as :func:`benchmarks.harness.node_scenario`) and,
every cycle, ``churn`` short-lived processes that start and end between two collections (so
each cycle the accounting reader reads that many final records per GPU). Both runs use the same
scenario; "without" turns the four new metrics off (``disabled_metrics``), so no accounting call
and no energy split is made.

Per steady-state 1 s cycle (the real collector on the simulated driver, manual clock, as
:mod:`benchmarks.collection_bench` measures it): ``cpu ms`` = process CPU of
``Collector.collect_once`` plus a tenth of a ``Batcher.run_once`` (the sidecar's defaults: 1 s
ticks, a 10 s batch: OTLP encoding and the store append); ``sim ms`` the simulated driver's own
CPU (``cpu_in_driver_s``; on hardware, libnvidia-ml's), ``ours`` = cpu − sim; ``calls`` NVML C
calls. Runs alternate (without, with, ...) ``--rounds`` times; medians and minima are reported,
so load on a shared machine hits both alike.

CPU time on a shared machine moves with the other work on it; ``--callgrind`` counts
instructions instead (Valgrind callgrind, as :mod:`benchmarks.callgrind_cycle`: ours with the
simulated driver's callbacks left out, ``--toggle-collect=_CallPythonObject``, and the driver's
alone), for ``--cycles`` and 3 × ``--cycles`` cycles; the difference per cycle is one steady
cycle without the start-up both share.

Run: ``python benchmarks/energy_bench.py [--cycles 30] [--rounds 5] [--callgrind]``.
"""

from __future__ import annotations

import argparse
import re
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

if __package__ in (None, ""):  # run as a file: make the `benchmarks` package importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from gpumetrics.metrics import names  # noqa: E402
from gpumetrics.metrics.producer import Producer  # noqa: E402
from gpumetrics.nvml.collector import Collector  # noqa: E402
from gpumetrics.nvml.settings import CollectionSettings  # noqa: E402
from gpumetrics.runtime.batcher import Batcher  # noqa: E402
from gpumetrics.selftelemetry import Telemetry  # noqa: E402
from gpumetrics.store import BatchStore  # noqa: E402

import nvmlsim as sim  # noqa: E402
from benchmarks.harness import emit, machine, node_scenario  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]

NEW_METRICS = frozenset(
    {
        names.MetricProcessEnergy,
        names.MetricGPUEnergyUnattributed,
        names.MetricProcessTime,
        names.MetricProcessMemoryMax,
    }
)
WARMUP = 3


def scenario(gpus: int, processes: int, churn: int, cycles: int) -> sim.Scenario:
    """The node of the module docstring, with short-lived processes for every cycle."""
    data = node_scenario(gpus, processes)
    for i, dev in enumerate(data["devices"]):
        dev["accounting"] = {"mode": "enabled", "buffer_size": 4000}
        short = []
        for c in range(WARMUP + cycles + 1):
            for k in range(churn):
                short.append(
                    {
                        "pid": 900_000 + i * 10_000 + c * churn + k,
                        "name": "short-{c}-{k}",
                        "used_memory_bytes": 1 << 20,
                        "from_s": c + 0.2,
                        "until_s": c + 0.6,
                    }
                )
        dev["processes"] = short
    return sim.scenario_from_data(data)


def measure(scn: sim.Scenario, cycles: int, with_new: bool) -> dict[str, float]:
    """Per-cycle CPU (collect + batch), simulator CPU and calls, over ``cycles`` cycles."""
    settings = CollectionSettings(
        pid_max=4_194_304,
        disabled_metrics=frozenset() if with_new else NEW_METRICS,
        # real-time deadlines that neither a loaded machine nor valgrind reaches: a tick that
        # ran out of time would drop its readings and change what is measured
        call_timeout_s=600.0,
        cycle_timeout_s=600.0,
    )
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
        batcher = Batcher(prod, BatchStore(), 3600.0, threading.Event())
        for _ in range(WARMUP):
            col.collect_once()
            batcher.run_once()
            drv.next_cycle()
        start = drv.stats()
        cpu = 0.0
        points = 0
        for i in range(cycles):
            t0 = time.process_time()
            points += col.collect_once().points
            if i % 10 == 9:
                batcher.run_once()
            cpu += time.process_time() - t0
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
        "calls": (end["calls"] - start["calls"]) / cycles,
        "points": points / cycles,
    }


def main() -> None:
    """Print both rows, the overhead, and the JSON result line."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--gpus", type=int, default=8)
    parser.add_argument("--processes", type=int, default=64)
    parser.add_argument(
        "--churn", type=int, default=4, help="short-lived processes per GPU per cycle"
    )
    parser.add_argument("--cycles", type=int, default=30)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--callgrind", action="store_true", help="count instructions (docstring)")
    parser.add_argument("--child", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:  # the workload under valgrind
        with_new, cycles, scenario_cycles = args.child.split(",")
        scn = scenario(args.gpus, args.processes, args.churn, int(scenario_cycles))
        measure(scn, int(cycles), with_new=with_new == "with")
        return
    if args.callgrind:
        callgrind(args)
        return
    scn = scenario(args.gpus, args.processes, args.churn, args.cycles)
    runs: dict[str, list[dict[str, float]]] = {"without": [], "with": []}
    for _ in range(args.rounds):
        runs["without"].append(measure(scn, args.cycles, with_new=False))
        runs["with"].append(measure(scn, args.cycles, with_new=True))
    medians: dict[str, dict[str, Any]] = {
        label: {key: statistics.median(r[key] for r in rows) for key in rows[0]}
        for label, rows in runs.items()
    }
    minima: dict[str, dict[str, Any]] = {
        label: {key: min(r[key] for r in rows) for key in rows[0]} for label, rows in runs.items()
    }
    print(
        f"{args.gpus} GPUs x {args.processes} processes, {args.churn} short-lived per GPU per "
        f"cycle; medians of {args.rounds} rounds of {args.cycles} cycles"
    )
    print(f"{'':>8} {'cpu ms':>8} {'sim ms':>8} {'ours ms':>8} {'calls':>7} {'points':>7}")
    for label, r in medians.items():
        print(
            f"{label:>8} {r['cpu_ms']:>8.2f} {r['sim_ms']:>8.2f} {r['ours_ms']:>8.2f} "
            f"{r['calls']:>7.1f} {r['points']:>7.0f}"
        )
    cpu_pct = 100 * (medians["with"]["cpu_ms"] / medians["without"]["cpu_ms"] - 1)
    ours_pct = 100 * (medians["with"]["ours_ms"] / medians["without"]["ours_ms"] - 1)
    min_pct = 100 * (minima["with"]["cpu_ms"] / minima["without"]["cpu_ms"] - 1)
    print(f"added (medians): cpu {cpu_pct:+.1f} %, ours (without the simulator) {ours_pct:+.1f} %")
    print(
        f"minima: cpu without {minima['without']['cpu_ms']:.2f} ms, with "
        f"{minima['with']['cpu_ms']:.2f} ms: {min_pct:+.1f} %"
    )
    emit(
        "energy",
        {
            "machine": machine(),
            "args": vars(args),
            "medians": medians,
            "minima": minima,
            "added_cpu_pct": cpu_pct,
            "added_ours_pct": ours_pct,
            "rounds": runs,
        },
    )


def _instructions(
    args: argparse.Namespace, with_new: bool, cycles: int, driver: bool, scenario_cycles: int
) -> int:
    """Instructions callgrind counts for one run: ours (``driver`` False) or the driver's."""
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "callgrind.out"
        cmd = [
            "valgrind", "--tool=callgrind", f"--callgrind-out-file={out}",
            "--toggle-collect=_CallPythonObject",
            f"--collect-atstart={'no' if driver else 'yes'}",
            sys.executable, "-m", "benchmarks.energy_bench",
            "--gpus", str(args.gpus), "--processes", str(args.processes),
            "--churn", str(args.churn),
            "--child", f"{'with' if with_new else 'without'},{cycles},{scenario_cycles}",
        ]  # fmt: skip
        subprocess.run(cmd, cwd=ROOT, check=True, capture_output=True, timeout=3600)
        text = out.read_text()
    m = re.search(r"^summary:\s+(\d+)", text, re.M)
    if m is None:
        raise RuntimeError("callgrind wrote no summary")
    return int(m.group(1))


def callgrind(args: argparse.Namespace) -> None:
    """Instructions per steady cycle, with and without the new sources (module docstring)."""
    low, high = args.cycles, 3 * args.cycles
    result: dict[str, dict[str, float]] = {}
    for label, with_new in (("without", False), ("with", True)):
        row = {}
        for part, driver in (("ours", False), ("driver", True)):
            # one scenario for both lengths (its size would count otherwise)
            a, b = (_instructions(args, with_new, n, driver, high) for n in (low, high))
            row[part] = (b - a) / (high - low)
        result[label] = row
        print(
            f"{label:>8}: {row['ours'] / 1e6:8.2f} M instructions per cycle ours, "
            f"{row['driver'] / 1e6:8.2f} M in the simulated driver",
            flush=True,
        )
    ours_pct = 100 * (result["with"]["ours"] / result["without"]["ours"] - 1)
    all_pct = 100 * (
        (result["with"]["ours"] + result["with"]["driver"])
        / (result["without"]["ours"] + result["without"]["driver"])
        - 1
    )
    print(f"added: ours {ours_pct:+.2f} %, ours + driver {all_pct:+.2f} %")
    emit(
        "energy_callgrind",
        {
            "machine": machine(),
            "args": vars(args),
            "cycles": [low, high],
            "per_cycle": result,
            "added_ours_pct": ours_pct,
            "added_all_pct": all_pct,
        },
    )


if __name__ == "__main__":
    main()
