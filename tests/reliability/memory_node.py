"""A sidecar on a simulated node with many GPU processes, in its own process, driven batch by batch.

``python -m tests.reliability.memory_node DIR PROCESSES`` (from the repository root)

Builds :class:`gpumetrics.runtime.Sidecar` as ``serve`` does (default configuration: every
limit at its default, and, first, :func:`~gpumetrics.runtime.memory.return_large_buffers_to_the_os`,
which ``serve`` calls) on the simulated driver beneath nvidia-ml-py: the default 8×H100 profile
with ``PROCESSES`` GPU processes spread over its GPUs (``process_sets``), a fake procfs that
shows them (``identity.proc_root``, so declarations of their pids survive the declared store's
sweeps) and the real NVML ``Collector``, which is not started: the parent drives it. Only the
gRPC server runs on its own, on the default listeners moved into ``DIR`` (``unix:DIR/gm.sock``;
the profiler service on ``unix:DIR/profiler.sock`` through the peer-credentials relay).

It prints ``READY``, then one JSON line of its figures with ``pids`` (the simulated GPU
processes), and reads commands, one per line:

* ``batches N``: N times, :data:`COLLECTIONS_PER_BATCH` collections (``collect_once``, the
  default cadence: 1 s collections, 10 s batches) and one batch (``Batcher.run_once``); then one
  JSON line of the stores' figures.

At the end of its input it stops and exits.
"""

from __future__ import annotations

import json
import sys
import threading
from pathlib import Path
from typing import Any

from gpumetrics.config import SidecarConfig
from gpumetrics.nvml.collector import Collector
from gpumetrics.runtime import Sidecar
from gpumetrics.runtime.memory import return_large_buffers_to_the_os

import nvmlsim as sim

from .fakeproc import FakeProc
from .memory_sidecar import listeners

COLLECTIONS_PER_BATCH = 10
"""``collection.interval_s`` (1 s) over ``runtime.batch_interval_s`` (10 s), the defaults."""

PID_START = 200_000
"""The first simulated pid; GPU ``i`` holds pids ``PID_START + i * PID_STRIDE + k``."""

PID_STRIDE = 100_000


def gpu_pids(processes: int, gpus: int = 8) -> list[int]:
    """The pids :func:`scenario` gives ``processes`` processes on ``gpus`` GPUs, in order."""
    per = [processes // gpus + (1 if i < processes % gpus else 0) for i in range(gpus)]
    return [PID_START + i * PID_STRIDE + k for i in range(gpus) for k in range(per[i])]


def scenario(processes: int) -> sim.Scenario:
    """The default profile with ``processes`` compute processes (each on one GPU, all busy)."""
    data = sim.load_scenario(sim.DEFAULT_PROFILE).model_dump(mode="json", exclude_none=True)
    devices = data["devices"]
    pids = gpu_pids(processes, len(devices))
    for i, dev in enumerate(devices):
        count = sum(1 for p in pids if (p - PID_START) // PID_STRIDE == i)
        dev["processes"] = []
        dev["process_sets"] = [
            {
                "count": count,
                "pid_start": PID_START + i * PID_STRIDE,
                "pid_step": 1,
                "name": "/usr/bin/python3",
                "used_memory_bytes": 1 << 30,
                "utilization": {"sm": 50, "mem": 20},
            }
        ]
    data.update(events=[], overrides=[], faults=[])
    return sim.scenario_from_data(data)


def figures(sidecar: Sidecar) -> dict[str, Any]:
    """What the parent checks: the stores' accounting and the declared store's budget."""
    parts = sidecar.parts
    st = parts.store.stats()
    declared = parts.declared.stats()
    return {
        "appended_batches": st.appended_batches,
        "appended_points": st.appended_points,
        "appended_bytes": st.appended_bytes,
        "released_points": st.released_points,
        "dropped_points": st.dropped_points,
        "held_points": st.held_points,
        "held_bytes": st.held_bytes,
        "max_bytes": parts.store.limits.max_bytes,
        "declared": declared.processes,
        "declared_held_bytes": declared.held_bytes,
        "declared_max_bytes": declared.max_bytes,
        "pull_budget_peak": parts.server.pull.budget.peak,
        "pull_budget_limit": parts.server.pull.budget.limit,
        "telemetry": {name: parts.telemetry.total(name) for name in COUNTERS},
    }


COUNTERS = ("gpumetrics.store.points.dropped", "gpumetrics.identity.attributes.limited")
"""Self-telemetry counters reported (summed over their series)."""


def main() -> int:
    directory, processes = Path(sys.argv[1]), int(sys.argv[2])
    return_large_buffers_to_the_os()
    drv = sim.install(scenario(processes), clock=sim.WallClock())
    scn = drv.scenario
    (directory / "proc").mkdir()
    proc = FakeProc(directory / "proc", int(scn.clock.start_unix - scn.clock.uptime_s))
    proc.sync(drv.live_processes())
    config = SidecarConfig.model_validate(
        {
            "server": listeners(directory),
            "collection": {"pid_max": 4_194_304},
            "identity": {
                "node_name": "memory-node",
                "in_kubernetes": False,
                "proc_root": str(proc.root),
                "host_pid_namespace": True,
            },
        }
    )
    made: list[Collector] = []

    def factory(producer: Any, settings: Any, telemetry: Any) -> Collector:
        made.append(Collector(producer, settings, telemetry))
        return made[0]

    stopped = threading.Event()
    sidecar = Sidecar(config, collector_factory=factory, batch_wait=stopped.wait)
    collector, batcher = made[0], sidecar.parts.batcher
    sidecar.parts.server.start()
    print("READY", flush=True)
    print(json.dumps({**figures(sidecar), "pids": gpu_pids(processes)}), flush=True)
    for line in sys.stdin:
        command, _, arg = line.strip().partition(" ")
        if command != "batches":
            print(json.dumps({"error": f"unknown command {line.strip()!r}"}), flush=True)
            continue
        for _ in range(int(arg)):
            for _ in range(COLLECTIONS_PER_BATCH):
                collector.collect_once()
            batcher.run_once()
        print(json.dumps(figures(sidecar)), flush=True)
    stopped.set()
    sidecar.parts.server.stop(1.0)
    clean = collector.stop(5.0)
    sim.uninstall()
    return 0 if clean else 1


if __name__ == "__main__":
    sys.exit(main())
