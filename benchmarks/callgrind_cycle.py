"""Instructions per collection cycle, ours and the simulated driver's apart (Valgrind callgrind).

CPU time on a shared 2-core machine moves with the other work on it; instruction counts do
not. This runs the scale benchmark's node (``benchmarks.workload.sizing_node``: the real
collector, producer, resourcer and batcher on the simulated driver, manual clock) under
``valgrind --tool=callgrind`` twice per cycle count, once counting everything but the
simulated driver's callbacks and once only those (``--toggle-collect=_CallPythonObject``:
ctypes' call into a Python callback, which is how nvidia-ml-py reaches the simulator), for two
cycle counts; the difference between the counts, divided by the cycles between them, is one
1 s cycle with a tenth of its 10 s batch, without the start-up both runs share.

``--kernels`` picks the bulk encoder's inner loops as in ``collection_bench``.

Run: ``python -m benchmarks.callgrind_cycle [--gpus 8] [--processes-per-gpu 8]
[--cycles 10,30] [--kernels auto]`` (about 1-2 minutes per run at 8 x 8 under valgrind).
Prints and emits ``instructions per cycle``: ``ours``, ``driver``, their ratio.
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.harness import KERNEL_CHOICES, emit, machine, select_kernels  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
_TOTAL = re.compile(r"^summary:\s+(\d+)", re.M)


def workload(gpus: int, processes: int, cycles: int) -> None:
    """Warm up (3 cycles and a batch), then ``cycles`` cycles with a batch every 10."""
    import nvmlsim as sim
    from benchmarks.collection_bench import _batcher
    from benchmarks.workload import sizing_node

    drv, col, prod = sizing_node(gpus, processes)
    batcher = _batcher(prod)
    try:
        for _ in range(3):
            col.collect_once()
            drv.next_cycle()
        batcher.run_once()
        for i in range(cycles):
            col.collect_once()
            drv.next_cycle()
            if i % 10 == 9:
                batcher.run_once()
        col.stop(5.0)
    finally:
        sim.uninstall()


def instructions(gpus: int, processes: int, cycles: int, driver: bool, kernels: str) -> int:
    """Instructions callgrind counts for one run: ours (``driver`` False) or the driver's."""
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "callgrind.out"
        cmd = [
            "valgrind", "--tool=callgrind", f"--callgrind-out-file={out}",
            "--toggle-collect=_CallPythonObject",
            f"--collect-atstart={'no' if driver else 'yes'}",
            sys.executable, "-m", "benchmarks.callgrind_cycle", "--child",
            f"{gpus},{processes},{cycles}", "--kernels", kernels,
        ]  # fmt: skip
        subprocess.run(cmd, cwd=ROOT, check=True, capture_output=True, timeout=3600,
                       env=os.environ)  # fmt: skip
        text = out.read_text()
    m = _TOTAL.search(text)
    if m is None:
        raise RuntimeError("callgrind wrote no summary")
    return int(m.group(1))


def main() -> int:
    """Run the measurement (or, with --child, the workload under valgrind)."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--gpus", type=int, default=8)
    ap.add_argument("--processes-per-gpu", type=int, default=8)
    ap.add_argument("--cycles", default="10,30", help="two cycle counts (their difference counts)")
    ap.add_argument("--kernels", choices=KERNEL_CHOICES, default="auto")
    ap.add_argument("--child", help=argparse.SUPPRESS)
    args = ap.parse_args()
    kernels = select_kernels(args.kernels)
    if args.child:
        gpus, processes, cycles = (int(v) for v in args.child.split(","))
        workload(gpus, processes, cycles)
        return 0
    low, high = (int(v) for v in args.cycles.split(","))
    g, p = args.gpus, args.processes_per_gpu
    ours = [instructions(g, p, n, False, args.kernels) for n in (low, high)]
    drv = [instructions(g, p, n, True, args.kernels) for n in (low, high)]
    per = high - low
    ours_pc, drv_pc = (ours[1] - ours[0]) / per, (drv[1] - drv[0]) / per
    print(
        f"{g} GPUs x {p} processes: {ours_pc / 1e6:.2f} M instructions per cycle ours, "
        f"{drv_pc / 1e6:.2f} M inside the simulated driver: ours/driver {ours_pc / drv_pc:.2f} "
        f"(kernels: {kernels})"
    )
    emit(
        "callgrind_cycle",
        {
            "machine": machine(),
            "gpus": g,
            "processes_per_gpu": p,
            "cycles": [low, high],
            "ours_per_cycle": ours_pc,
            "driver_per_cycle": drv_pc,
            "ratio": ours_pc / drv_pc,
            "kernels": kernels,
        },
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
