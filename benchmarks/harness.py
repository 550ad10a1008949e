"""Shared helpers of the benchmarks (not a test; nothing here asserts a number).

* :func:`node_scenario`: an N-GPU simulated node built from a built-in profile, with K
  processes per GPU (``process_sets``), optionally written to a YAML file for other processes;
* :func:`proc_cpu_s`, :func:`proc_rss_bytes`, :func:`self_rss_bytes`: CPU seconds (utime +
  stime from ``/proc/<pid>/stat``, all threads) and resident memory of a process;
* :func:`machine`: what a figure was measured on (nproc, CPU model, RAM, Python, package
  versions, date), recorded with every result;
* :func:`emit`: print a benchmark's JSON result on the last line of stdout, which
  ``benchmarks/run_all.py`` collects.
"""

from __future__ import annotations

import copy
import datetime as dt
import json
import os
import platform
import sys
from collections.abc import Mapping
from importlib import metadata
from pathlib import Path
from typing import Any

import yaml

RESULT_PREFIX = "BENCHMARK-RESULT "
"""Prefix of the one stdout line that carries a benchmark's JSON result."""

PACKAGES = (
    "gpumetrics",
    "nvidia-ml-py",
    "grpcio",
    "protobuf",
    "opentelemetry-proto",
    "pydantic",
    "psutil",
)
"""Distributions whose versions are recorded with the results."""

CLK_TCK = os.sysconf("SC_CLK_TCK")
PAGE = os.sysconf("SC_PAGE_SIZE")


def node_scenario(
    gpus: int,
    processes_per_gpu: int,
    *,
    profile: str = "h100-sxm",
    pid_start: int = 100_000,
    pid_stride: int = 10_000,
    pcie_window_ms: int | None = 0,
    process_fields: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """Scenario data: ``gpus`` copies of ``profile``'s first device, each with its processes.

    Args:
        gpus: number of GPUs (indices 0..gpus-1, distinct UUIDs and PCI bus ids).
        processes_per_gpu: processes on each GPU (one ``process_sets`` entry; 0 = none).
        profile: built-in profile whose first device (and driver, clock, samples) is copied.
        pid_start: pid of GPU 0's first process; GPU i's start at ``pid_start + i*pid_stride``.
        pid_stride: pid distance between GPUs.
        pcie_window_ms: PCIe measurement window (``None`` keeps the profile's; 0 = none, so
            a manual clock does not move while a benchmark reads PCIe).
        process_fields: ``process_sets`` fields (name, used_memory_bytes, utilization...);
            default 256 MiB and sm 20 % / mem 5 % each.

    Returns:
        Python data for :func:`nvmlsim.scenario_from_data` or a YAML file.

    """
    import nvmlsim as sim

    data = sim.load_scenario(profile).model_dump(mode="json", exclude_unset=True)
    template = copy.deepcopy(data["devices"][0])
    template.pop("processes", None)
    template.pop("process_sets", None)
    if pcie_window_ms is not None:
        data.setdefault("driver", {})["pcie_window_ms"] = pcie_window_ms
    fields = dict(
        process_fields
        if process_fields is not None
        else {"used_memory_bytes": 268_435_456, "utilization": {"sm": 20, "mem": 5}}
    )
    devices = []
    for i in range(gpus):
        dev = copy.deepcopy(template)
        dev["uuid"] = f"GPU-be0c0000-0000-4000-8000-{i:012d}"  # NVML shape (nvmlsim checks it)
        dev["index"] = i
        dev["minor_number"] = i
        dev["serial"] = f"1654123{i:06d}"
        dev["pci"] = {**dev.get("pci", {}), "bus_id": f"00000000:{0x18 + i:02X}:00.0"}
        if processes_per_gpu:
            dev["process_sets"] = [
                {
                    "count": processes_per_gpu,
                    "pid_start": pid_start + i * pid_stride,
                    **copy.deepcopy(fields),
                }
            ]
        devices.append(dev)
    data["devices"] = devices
    data["name"] = f"bench-{gpus}x-{processes_per_gpu}"
    data["description"] = f"{gpus} GPUs from {profile}, {processes_per_gpu} processes each"
    return data


def write_scenario(data: Mapping[str, Any], path: Path) -> Path:
    """Write scenario data as YAML (validated first); return ``path``."""
    import nvmlsim as sim

    sim.scenario_from_data(dict(data))  # raises ScenarioError naming the field
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(yaml.safe_dump(dict(data), sort_keys=False), encoding="utf-8")
    return path


def proc_cpu_split(pid: int) -> tuple[float, float]:
    """``(user, system)`` CPU seconds (all threads) of process ``pid`` so far.

    Fields 14 and 15 of ``/proc/<pid>/stat``, counted after the last ``)`` so a command name
    with spaces cannot shift them; in clock ticks of ``SC_CLK_TCK`` (10 ms on Linux).

    Raises:
        OSError: the process is gone.

    """
    with open(f"/proc/{pid}/stat", "rb") as fh:
        raw = fh.read()
    fields = raw[raw.rindex(b")") + 2 :].split()
    return int(fields[11]) / CLK_TCK, int(fields[12]) / CLK_TCK


def proc_cpu_s(pid: int) -> float:
    """CPU seconds (user + system, all threads) of process ``pid`` so far."""
    user, system = proc_cpu_split(pid)
    return user + system


def proc_ctx_switches(pid: int) -> tuple[int, int]:
    """``(voluntary, involuntary)`` context switches summed over ``pid``'s live threads."""
    vol = invol = 0
    for task in Path(f"/proc/{pid}/task").iterdir():
        try:
            with open(task / "status") as fh:
                for line in fh:
                    if line.startswith("voluntary_ctxt_switches:"):
                        vol += int(line.split()[1])
                    elif line.startswith("nonvoluntary_ctxt_switches:"):
                        invol += int(line.split()[1])
        except OSError:  # the thread ended meanwhile
            continue
    return vol, invol


def proc_rss_bytes(pid: int) -> tuple[int, int]:
    """``(VmRSS, VmHWM)`` of ``pid`` in bytes: resident now, and its peak."""
    out = {}
    with open(f"/proc/{pid}/status") as fh:
        for line in fh:
            key, _, rest = line.partition(":")
            if key in ("VmRSS", "VmHWM"):
                out[key] = int(rest.split()[0]) * 1024
    return out["VmRSS"], out["VmHWM"]


def self_rss_bytes() -> int:
    """Resident memory of this process now (bytes, ``/proc/self/statm``)."""
    with open("/proc/self/statm") as fh:
        return int(fh.read().split()[1]) * PAGE


def malloc_trim() -> bool:
    """Ask glibc to return free heap pages to the OS (diagnostic; False if unavailable)."""
    import ctypes

    try:
        return bool(ctypes.CDLL("libc.so.6").malloc_trim(0))
    except (OSError, AttributeError):
        return False


def _cpu_model() -> str:
    try:
        with open("/proc/cpuinfo") as fh:
            for line in fh:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def _mem_total_bytes() -> int | None:
    try:
        with open("/proc/meminfo") as fh:
            for line in fh:
                if line.startswith("MemTotal:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return None


def versions(packages: tuple[str, ...] = PACKAGES) -> dict[str, str | None]:
    """Installed versions of ``packages`` (None when not installed)."""
    out: dict[str, str | None] = {}
    for name in packages:
        try:
            out[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            out[name] = None
    return out


def machine() -> dict[str, Any]:
    """The machine and software a figure was measured on, and when (UTC)."""
    return {
        "date": dt.datetime.now(dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
        "nproc": os.cpu_count(),
        "cpu_model": _cpu_model(),
        "mem_total_bytes": _mem_total_bytes(),
        "kernel": platform.release(),
        "python": sys.version.split()[0],
        "loadavg": os.getloadavg(),
        "packages": versions(),
    }


KERNEL_CHOICES = ("auto", "compiled", "python")
"""``--kernels`` of the in-process benchmarks: the bulk encoder's inner loops."""


def select_kernels(which: str) -> str:
    """Encode with the ``compiled`` or ``python`` kernels (``auto``: as installed); return which.

    The code before the bulk encoder (issue 24; run with its ``receiver/`` first on
    ``PYTHONPATH``) reports ``per-point encoder``.

    Raises:
        SystemExit: ``which`` is not ``auto`` and this code has no bulk encoder, or
            ``compiled`` was asked and the compiled kernels were not built.

    """
    try:
        from gpumetrics.metrics import bulk
    except ImportError:
        if which != "auto":
            raise SystemExit(f"--kernels {which}: this code has no bulk encoder") from None
        return "per-point encoder"
    try:
        return str(bulk.use_kernels(which))
    except ValueError as exc:
        raise SystemExit(str(exc)) from None


def emit(name: str, result: Mapping[str, Any]) -> None:
    """Print ``result`` as this benchmark's JSON line (``RESULT_PREFIX`` + JSON)."""
    print(RESULT_PREFIX + json.dumps({"benchmark": name, **result}, sort_keys=True), flush=True)
