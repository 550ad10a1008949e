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

Each dump also holds the process's ``/proc/self/smaps_rollup`` (kB) and, when the target runs
with ``tracemalloc`` tracing (``PYTHONTRACEMALLOC=1``), the Python heap by package
(:func:`heap_by_package`): what a memory breakdown needs from inside the process.
"""

from __future__ import annotations

import argparse
import json
import signal
import sys
import threading
import time
import tracemalloc
from pathlib import Path
from typing import Any

import nvmlsim as sim
from nvmlsim import launcher


def smaps_rollup() -> dict[str, int]:
    """``/proc/self/smaps_rollup`` as ``{field: kB}`` (Rss, Pss, Anonymous, Shared_Clean...)."""
    out: dict[str, int] = {}
    try:
        text = Path("/proc/self/smaps_rollup").read_text(encoding="ascii")
    except OSError:
        return out
    for line in text.splitlines():
        parts = line.split()
        if len(parts) == 3 and parts[2] == "kB":
            out[parts[0].rstrip(":")] = int(parts[1])
    return out


def package_of(filename: str) -> str:
    """The package an allocation's file belongs to: ``grpc``, ``gpumetrics.nvml``, ``stdlib``..."""
    if filename.startswith("<"):
        return "import system"  # <frozen importlib._bootstrap...>
    parts = Path(filename).parts
    if "site-packages" in parts:
        return parts[parts.index("site-packages") + 1].removesuffix(".py")
    if "gpumetrics" in parts:
        i = parts.index("gpumetrics")
        sub = parts[i + 1] if len(parts) > i + 2 else ""
        return f"gpumetrics.{sub}" if sub else "gpumetrics"
    if "nvmlsim" in parts:
        return "nvmlsim"
    if "benchmarks" in parts:
        return "benchmarks"
    return "stdlib"


def heap_by_package() -> dict[str, Any]:
    """Python heap held now, by package of the allocating file (``tracemalloc``), in bytes."""
    if not tracemalloc.is_tracing():
        return {}
    snapshot = tracemalloc.take_snapshot()
    by: dict[str, int] = {}
    files: dict[str, int] = {}
    for stat in snapshot.statistics("filename"):
        name = stat.traceback[0].filename
        by[package_of(name)] = by.get(package_of(name), 0) + stat.size
        files[name] = stat.size
    top = sorted(files.items(), key=lambda kv: -kv[1])[:25]
    return {
        "total_bytes": sum(by.values()),
        "by_package": dict(sorted(by.items(), key=lambda kv: -kv[1])),
        "top_files": dict(top),
        "traced_peak_bytes": tracemalloc.get_traced_memory()[1],
    }


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
        stats["smaps_rollup_kb"] = smaps_rollup()
        heap = heap_by_package()
        if heap:
            stats["tracemalloc"] = heap
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
