"""Framebuffer memory: usage, limit, utilisation and reserved memory from one read.

``hw.gpu.memory.usage``, ``.limit``, ``.utilization`` and ``nvidia.gpu.memory.reserved``: one
``nvmlDeviceGetMemoryInfo`` call per tick feeds all four metrics (style item 6).

- **v2 first.** ``nvmlDeviceGetMemoryInfo(handle, version=pynvml.nvmlMemory_v2)`` (the version
  word 0x02000028, never the literal 2, F03): ``used`` is allocated memory only; ``reserved`` is
  the driver/firmware share.
- **v1 fallback.** When the driver lacks ``nvmlDeviceGetMemoryInfo_v2`` (before ~R510), or the v2
  call answers FUNCTION_NOT_FOUND (bad struct version, F03 case A) or UNKNOWN (the broken WSL v2
  path, F03 case B), the device switches to v1 for good (logged once); v1 ``used`` includes the
  reserved memory, and ``reserved`` is unknown.
- **Reserved (F29).** ``nvidia.gpu.memory.reserved`` comes from v2's ``reserved`` only (the
  driver/firmware share, ~300 MiB on an idle GPU); with v1 it is absent, never 0 and never
  guessed from ``used``.
- **No framebuffer.** NOT_SUPPORTED (GB10 / DGX Spark, Jetson: UMA, F17) disables memory metrics
  for the device: they are absent, never 0 and never replaced with host RAM (F18).
- **Sanity.** The u64 not-available value is dropped; ``total == 0`` gives no limit and no
  utilisation; ``used > total`` drops usage and utilisation (``out_of_range``).

UpDownCounter points carry the device's discovery time as their start time.
MIG: read on each MIG instance handle, never on a MIG-enabled parent (double counting).
"""

from __future__ import annotations

from dataclasses import dataclass

import pynvml

from gpumetrics.metrics import names
from gpumetrics.nvml import convert
from gpumetrics.nvml.context import Tick
from gpumetrics.nvml.device import Device
from gpumetrics.nvml.query import ErrorKind, QueryError

V2 = "nvmlDeviceGetMemoryInfo_v2"
V1 = "nvmlDeviceGetMemoryInfo"
_METRICS = (
    names.MetricGPUMemoryUsage,
    names.MetricGPUMemoryLimit,
    names.MetricGPUMemoryUtilization,
    names.MetricGPUMemoryReserved,
)


@dataclass(frozen=True)
class MemoryReading:
    """One memory read, in bytes.

    Attributes:
        total_bytes: framebuffer size.
        used_bytes: allocated (v2) or allocated + reserved (v1).
        reserved_bytes: driver/firmware reservation (v2 only), else None.
        version: 2 or 1.

    """

    total_bytes: int
    used_bytes: int
    reserved_bytes: int | None
    version: int


def read_memory(dev: Device) -> MemoryReading | None:
    """Read memory info, v2 with the v1 fallback; None when unavailable.

    Raises:
        DeviceLost, LibraryDown: as from the gate.

    """
    c = dev.calls
    if c.enabled(V2):
        try:
            info = c.query(
                V2,
                V2,
                pynvml.nvmlDeviceGetMemoryInfo,
                dev.handle,
                version=pynvml.nvmlMemory_v2,
                fallback=True,
            )
            return MemoryReading(int(info.total), int(info.used), int(info.reserved), 2)
        except QueryError as err:
            if err.kind in (ErrorKind.UNSUPPORTED, ErrorKind.NO_PERMISSION):
                c.disable(V1, err.kind)  # v1 reads the same framebuffer: it would say the same
                return None
            if err.kind not in (ErrorKind.FUNCTION_MISSING, ErrorKind.UNKNOWN):
                return None
            c.disable(V2, err.kind)
            dev.calls.note(V2, f"answered {err.code_name}; using {V1} (no reserved) from now on")
    info = c.get(V1, V1, pynvml.nvmlDeviceGetMemoryInfo, dev.handle)
    if info is None:
        return None
    return MemoryReading(int(info.total), int(info.used), None, 1)


def collect_memory(dev: Device, tick: Tick) -> None:
    """Add usage, limit, utilisation and (v2) reserved points from one memory read."""
    if not tick.wants(*_METRICS):
        return
    reading = read_memory(dev)
    if reading is None:
        return
    fn = V2 if reading.version == 2 else V1
    total, why_total = convert.bytes_value(reading.total_bytes)
    used, why_used = convert.bytes_value(reading.used_bytes)
    if total is None:
        dev.calls.drop(fn, why_total or convert.SENTINEL, detail="total")
    if used is None:
        dev.calls.drop(fn, why_used or convert.SENTINEL, detail="used")
    if total is not None and used is not None and used > total:
        dev.calls.drop(fn, convert.OUT_OF_RANGE, detail=f"used {used} > total {total}")
        used = None
    if total == 0:
        total = None
    dev.memory_total_bytes = int(total) if total is not None else None
    now, start = tick.now_ns, dev.start_ns
    if total is not None and tick.wants(names.MetricGPUMemoryLimit):
        tick.points.add(names.MetricGPUMemoryLimit, int(total), now, dev.attrs, start)
    if used is not None and tick.wants(names.MetricGPUMemoryUsage):
        tick.points.add(names.MetricGPUMemoryUsage, int(used), now, dev.attrs, start)
    if used is not None and total and tick.wants(names.MetricGPUMemoryUtilization):
        tick.points.add(names.MetricGPUMemoryUtilization, used / total, now, dev.attrs)
    if reading.reserved_bytes is not None and tick.wants(names.MetricGPUMemoryReserved):
        reserved, why = convert.bytes_value(reading.reserved_bytes)
        if reserved is None or (total is not None and reserved > total):
            dev.calls.drop(
                fn, why or convert.OUT_OF_RANGE, detail=f"reserved {reading.reserved_bytes}"
            )
        else:
            tick.points.add(names.MetricGPUMemoryReserved, int(reserved), now, dev.attrs, start)
