"""Run a program on the simulated driver, dumping the driver's counters on demand.

``python -m benchmarks.simexec --stats-dir DIR -- [launcher exec options] -- TARGET [ARGS...]``

A thin wrapper around the simulator's own launcher (``python -m nvmlsim exec``,
``nvmlsim.launcher.main``): everything after the first ``--`` is handed to
``launcher exec`` unchanged. What it adds is for benchmarks that measure a window in the
middle of a run: on **SIGUSR1** it writes ``SimDriver.stats()`` (C calls per function, time
inside the simulated functions) to ``DIR/stats-<n>.json``, numbered from 1, then to
``DIR/stats-<n>.done`` so the reader knows the file is complete. The signal handler only sets an
event; a dormant thread (no CPU while waiting) writes the file, so a dump never runs inside an
NVML call of the target's main thread.
"""

from __future__ import annotations

import argparse
import json
import signal
import sys
import threading
import time
from pathlib import Path
from typing import Any

import nvmlsim as sim
from nvmlsim import launcher


def _dumper(directory: Path, wanted: threading.Event) -> None:
    n = 0
    while True:
        wanted.wait()
        wanted.clear()
        drv = sim.installed()
        if drv is None:
            continue
        n += 1
        stats: dict[str, Any] = dict(drv.stats())
        by_function: dict[str, int] = {}
        for (function, _), count in drv.calls.items():
            by_function[function] = by_function.get(function, 0) + count
        stats["by_function"] = by_function
        stats["wall_time"] = time.time()
        (directory / f"stats-{n}.json").write_text(json.dumps(stats), encoding="utf-8")
        (directory / f"stats-{n}.done").write_text("", encoding="utf-8")


def main(argv: list[str] | None = None) -> int:
    """Parse ``--stats-dir``, arm SIGUSR1, then run ``launcher exec`` with the rest."""
    argv = list(sys.argv[1:] if argv is None else argv)
    if "--" not in argv:
        print("usage: python -m benchmarks.simexec --stats-dir DIR -- EXEC-ARGS", file=sys.stderr)
        return 2
    cut = argv.index("--")
    parser = argparse.ArgumentParser(prog="python -m benchmarks.simexec")
    parser.add_argument("--stats-dir", type=Path, required=True)
    ns = parser.parse_args(argv[:cut])
    ns.stats_dir.mkdir(parents=True, exist_ok=True)
    wanted = threading.Event()
    threading.Thread(
        target=_dumper, args=(ns.stats_dir, wanted), name="simexec-stats", daemon=True
    ).start()
    signal.signal(signal.SIGUSR1, lambda _s, _f: wanted.set())
    return launcher.main(["exec", *argv[cut + 1 :]])


if __name__ == "__main__":
    sys.exit(main())
