"""Helper of ``scripts/gpu-check.sh``: the read-only NVML measurements of a real-GPU check.

Subcommands (each writes JSON into ``--out``; none changes any GPU setting; the comparison with
nvidia-smi and the summary are in ``scripts/gpu_report.py``):

``probe``
    Times every NVML call the collectors make (``--repeat`` times each, PCIe twice) on every
    GPU, each call on a worker thread with a deadline (``--call-timeout``; a call that passes it
    is recorded as ``hung`` and nothing more is called on that GPU); classifies failures with
    ``gpumetrics.nvml.query.classify`` (unsupported, no_permission, function_missing, ...); and
    compares the newest ``nvmlDeviceGetSamples`` / per-process sample timestamps with
    ``time.time()``, ``CLOCK_BOOTTIME`` and ``CLOCK_MONOTONIC`` read right after. ``probe.json``;
    exit 3 when NVML cannot be initialised (its error is in ``probe.json``), 4 after a hung call.
``cycles``
    Runs the real ``Collector`` (default ``CollectionSettings``) for ``--cycles`` cycles one
    interval apart and records each cycle's wall and process-CPU time. ``cycles.json``.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import sys
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from concurrent.futures import TimeoutError as FutureTimeout
from pathlib import Path
from typing import Any


def _write(out: Path, name: str, data: Any) -> None:
    out.mkdir(parents=True, exist_ok=True)
    (out / name).write_text(json.dumps(data, indent=2, default=str) + "\n", encoding="utf-8")


# ---------------------------------------------------------------------------------------- probe


def _calls(pynvml: Any, h: Any) -> list[tuple[str, str, Callable[[], Any], int]]:
    """List the collectors' NVML calls: (function, argument label, call, repeat factor).

    A factor of 0 means "measure twice only" (PCIe blocks ~20 ms per call on hardware).
    """
    p = pynvml
    c: list[tuple[str, str, Callable[[], Any], int]] = [
        ("nvmlDeviceGetUUID", "", lambda: p.nvmlDeviceGetUUID(h), 1),
        ("nvmlDeviceGetName", "", lambda: p.nvmlDeviceGetName(h), 1),
        ("nvmlDeviceGetSerial", "", lambda: p.nvmlDeviceGetSerial(h), 1),
        ("nvmlDeviceGetVbiosVersion", "", lambda: p.nvmlDeviceGetVbiosVersion(h), 1),
        ("nvmlDeviceGetIndex", "", lambda: p.nvmlDeviceGetIndex(h), 1),
        ("nvmlDeviceGetMigMode", "", lambda: p.nvmlDeviceGetMigMode(h), 1),
        ("nvmlDeviceGetMaxMigDeviceCount", "", lambda: p.nvmlDeviceGetMaxMigDeviceCount(h), 1),
        ("nvmlDeviceGetMemoryInfo", "v2",
         lambda: p.nvmlDeviceGetMemoryInfo(h, version=p.nvmlMemory_v2), 1),
        ("nvmlDeviceGetMemoryInfo", "v1", lambda: p.nvmlDeviceGetMemoryInfo(h), 1),
        ("nvmlDeviceGetPowerUsage", "", lambda: p.nvmlDeviceGetPowerUsage(h), 1),
        ("nvmlDeviceGetEnforcedPowerLimit", "", lambda: p.nvmlDeviceGetEnforcedPowerLimit(h), 1),
        ("nvmlDeviceGetTotalEnergyConsumption", "",
         lambda: p.nvmlDeviceGetTotalEnergyConsumption(h), 1),
        ("nvmlDeviceGetTemperatureV", "GPU", lambda: p.nvmlDeviceGetTemperatureV(h, 0), 1),
        ("nvmlDeviceGetTemperature", "GPU", lambda: p.nvmlDeviceGetTemperature(h, 0), 1),
        ("nvmlDeviceGetCurrentClocksEventReasons", "",
         lambda: p.nvmlDeviceGetCurrentClocksEventReasons(h), 1),
        ("nvmlDeviceGetUtilizationRates", "", lambda: p.nvmlDeviceGetUtilizationRates(h), 1),
        ("nvmlDeviceGetEncoderUtilization", "", lambda: p.nvmlDeviceGetEncoderUtilization(h), 1),
        ("nvmlDeviceGetDecoderUtilization", "", lambda: p.nvmlDeviceGetDecoderUtilization(h), 1),
        ("nvmlDeviceGetComputeRunningProcesses", "",
         lambda: p.nvmlDeviceGetComputeRunningProcesses(h), 1),
        ("nvmlDeviceGetGraphicsRunningProcesses", "",
         lambda: p.nvmlDeviceGetGraphicsRunningProcesses(h), 1),
        ("nvmlDeviceGetMPSComputeRunningProcesses", "",
         lambda: p.nvmlDeviceGetMPSComputeRunningProcesses(h), 1),
        ("nvmlDeviceGetProcessUtilization", "last_seen=0",
         lambda: p.nvmlDeviceGetProcessUtilization(h, 0), 1),
        ("nvmlDeviceGetProcessesUtilizationInfo", "last_seen=0",
         lambda: p.nvmlDeviceGetProcessesUtilizationInfo(h, 0), 1),
        ("nvmlDeviceGetTotalEccErrors", "corrected",
         lambda: p.nvmlDeviceGetTotalEccErrors(h, 0, 0), 1),
        ("nvmlDeviceGetTotalEccErrors", "uncorrected",
         lambda: p.nvmlDeviceGetTotalEccErrors(h, 1, 0), 1),
    ]  # fmt: skip
    for domain, clk in (("graphics", 0), ("sm", 1), ("memory", 2), ("video", 3)):
        c.append(("nvmlDeviceGetClockInfo", domain, _bind(p.nvmlDeviceGetClockInfo, h, clk), 1))
    for name, st in (("GPU_UTILIZATION", 1), ("MEMORY_UTILIZATION", 2), ("TOTAL_POWER", 0)):
        c.append(("nvmlDeviceGetSamples", name, _bind(p.nvmlDeviceGetSamples, h, st, 0), 1))
    for name, ctr in (("TX", 0), ("RX", 1)):
        # ~20 ms each on hardware: measured twice only
        c.append(
            ("nvmlDeviceGetPcieThroughput", name, _bind(p.nvmlDeviceGetPcieThroughput, h, ctr), 0)
        )
    return c


def _bind(fn: Callable[..., Any], *args: Any) -> Callable[[], Any]:
    return lambda: fn(*args)


def _clock_now_us() -> dict[str, int]:
    return {
        "wall": time.time_ns() // 1000,
        "boottime": time.clock_gettime_ns(time.CLOCK_BOOTTIME) // 1000,
        "monotonic": time.clock_gettime_ns(time.CLOCK_MONOTONIC) // 1000,
    }


def clock_domain(timestamp_us: int, now: dict[str, int], window_s: float = 30.0) -> dict[str, Any]:
    """How far ``timestamp_us`` lies behind each clock read at ``now`` (µs), and the verdict.

    The verdict is the clock the timestamp is closest to, if within ``window_s`` (a sample
    buffer's newest sample is at most a few sample periods old); else ``unknown``. Also says
    what the collectors' rule (``>= 1e15`` µs is Unix-epoch µs) decides.
    """
    lag = {k: v - timestamp_us for k, v in now.items()}
    best = min(lag, key=lambda k: abs(lag[k]))
    return {
        "timestamp_us": timestamp_us,
        "lag_us": lag,
        "verdict": best if abs(lag[best]) <= window_s * 1e6 else "unknown",
        "collector_rule": "epoch" if timestamp_us >= 10**15 else "boot",
    }


def _probe_device(pynvml: Any, index: int, repeat: int, timeout_s: float) -> dict[str, Any]:
    from gpumetrics.nvml.query import classify

    pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix=f"probe-gpu{index}")
    dev: dict[str, Any] = {"index": index, "calls": [], "clock_domain": {}}

    def call(fn: Callable[[], Any]) -> tuple[Any, int]:
        t0 = time.perf_counter_ns()
        value = fn()
        return value, time.perf_counter_ns() - t0

    try:
        h, _ = pool.submit(call, lambda: pynvml.nvmlDeviceGetHandleByIndex(index)).result(timeout_s)
    except FutureTimeout:
        dev["hung"] = "nvmlDeviceGetHandleByIndex"
        return dev
    except Exception as exc:  # noqa: BLE001 - recorded
        dev["handle_error"] = str(classify("nvmlDeviceGetHandleByIndex", exc))
        return dev
    for function, arg, fn, factor in _calls(pynvml, h):
        entry: dict[str, Any] = {"function": function, "arg": arg, "us": []}
        for _ in range(repeat if factor else 2):
            try:
                value, ns = pool.submit(call, fn).result(timeout_s)
            except FutureTimeout:
                entry["hung"] = True
                dev["hung"] = f"{function}({arg})"
                break
            except (AttributeError, TypeError) as exc:  # binding lacks the wrapper
                entry.update(kind="binding_missing", error=repr(exc)[:200])
                break
            except Exception as exc:  # noqa: BLE001 - NVML failure, classified
                err = classify(function, exc)
                entry.update(kind=err.kind.value, code=err.code_name)
                break
            entry["us"].append(ns / 1000)
            entry.setdefault("value", repr(value)[:300])
            now = _clock_now_us()
            if function == "nvmlDeviceGetSamples" and value[1]:
                newest = max(int(s.timeStamp) for s in value[1])
                dev["clock_domain"][f"samples:{arg}"] = clock_domain(newest, now)
            elif function.endswith("ProcessUtilization") and value:
                newest = max(int(s.timeStamp) for s in value)
                dev["clock_domain"]["process_utilization"] = clock_domain(newest, now)
        if entry["us"]:
            entry["median_us"] = statistics.median(entry["us"])
            entry["max_us"] = max(entry["us"])
        entry["ok"] = "kind" not in entry and not entry.get("hung")
        dev["calls"].append(entry)
        if entry.get("hung"):
            break  # the worker is stuck inside NVML: nothing more on this GPU
    pool.shutdown(wait=False, cancel_futures=True)
    return dev


def cmd_probe(ns: argparse.Namespace) -> int:
    """Probe every GPU (see the module docstring); write probe.json."""
    import pynvml
    from gpumetrics.nvml.query import classify

    t0 = time.perf_counter()
    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError as exc:  # no driver, no library, version mismatch...
        _write(ns.out, "probe.json", {"init_error": str(classify("nvmlInit", exc))})
        return 3
    out: dict[str, Any] = {"init_ms": 1000 * (time.perf_counter() - t0), "system": {}}
    for name in ("nvmlSystemGetDriverVersion", "nvmlSystemGetNVMLVersion",
                 "nvmlSystemGetCudaDriverVersion", "nvmlDeviceGetCount"):  # fmt: skip
        try:
            out["system"][name] = getattr(pynvml, name)()
        except Exception as exc:  # noqa: BLE001 - recorded
            out["system"][name] = f"error: {exc}"
    count = out["system"].get("nvmlDeviceGetCount")
    out["devices"] = []
    for i in range(count if isinstance(count, int) else 0):
        out["devices"].append(_probe_device(pynvml, i, ns.repeat, ns.call_timeout))
        _write(ns.out, "probe.json", out)  # incremental: a later hang keeps what was measured
    hung = any(d.get("hung") for d in out["devices"])
    if not hung:
        pynvml.nvmlShutdown()
    _write(ns.out, "probe.json", out)
    if hung:  # a worker is stuck inside NVML: do not wait for it at exit
        sys.stdout.flush()
        os._exit(4)
    return 0


# --------------------------------------------------------------------------------------- cycles


def cmd_cycles(ns: argparse.Namespace) -> int:
    """Run the real collector for ``--cycles`` cycles; write cycles.json."""
    from gpumetrics.metrics.producer import Producer
    from gpumetrics.nvml.collector import Collector
    from gpumetrics.nvml.settings import CollectionSettings
    from gpumetrics.selftelemetry import Telemetry

    settings = CollectionSettings()
    tel = Telemetry()
    producer = Producer(telemetry=tel, self_telemetry=tel)
    col = Collector(producer, settings, tel)
    rows: list[dict[str, Any]] = []
    done = threading.Event()
    try:
        for i in range(ns.cycles):
            started = time.monotonic()
            cpu0 = resource.getrusage(resource.RUSAGE_SELF)
            t0 = time.perf_counter()
            report = col.collect_once()
            wall = time.perf_counter() - t0
            cpu1 = resource.getrusage(resource.RUSAGE_SELF)
            cpu = (cpu1.ru_utime - cpu0.ru_utime) + (cpu1.ru_stime - cpu0.ru_stime)
            rows.append({"cycle": i, "wall_ms": 1000 * wall, "cpu_ms": 1000 * cpu,
                         "points": getattr(report, "points", None)})  # fmt: skip
            producer.collect()
            done.wait(max(0.0, settings.interval_s - (time.monotonic() - started)))
    finally:
        col.stop(10.0)
    steady = rows[1:] or rows
    _write(ns.out, "cycles.json", {
        "interval_s": settings.interval_s,
        "pcie_interval_s": settings.pcie_interval_s,
        "cycles": rows,
        "steady_wall_ms_median": statistics.median(r["wall_ms"] for r in steady),
        "steady_cpu_ms_median": statistics.median(r["cpu_ms"] for r in steady),
        "wall_ms_max": max(r["wall_ms"] for r in rows),
    })  # fmt: skip
    return 0


def main(argv: list[str] | None = None) -> int:
    """Parse the subcommand and run it."""
    ap = argparse.ArgumentParser(prog="gpu_check.py", description=__doc__.splitlines()[0])
    sub = ap.add_subparsers(dest="command", required=True)
    probe = sub.add_parser("probe", help="time every NVML call the collectors make")
    probe.add_argument("--repeat", type=int, default=20)
    probe.add_argument("--call-timeout", type=float, default=5.0, help="seconds per call")
    cycles = sub.add_parser("cycles", help="run the real collector for some cycles")
    cycles.add_argument("--cycles", type=int, default=15)
    for p in (probe, cycles):
        p.add_argument("--out", type=Path, required=True)
    ns = ap.parse_args(argv)
    return cmd_probe(ns) if ns.command == "probe" else cmd_cycles(ns)


if __name__ == "__main__":
    sys.exit(main())
