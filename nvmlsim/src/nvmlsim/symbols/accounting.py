"""Per-process accounting: mode, buffer size, pids and statistics.

What the NVML API reference ("Accounting Statistics",
https://docs.nvidia.com/deploy/nvml-api/group__nvmlAccountingStats.html) says, and this
module answers:

- ``nvmlDeviceGetAccountingMode(device, *mode)``: ENABLED (1) or DISABLED (0); NOT_SUPPORTED
  on a device without the feature. Nothing here lets a caller change it (the sidecar never
  calls ``nvmlDeviceSetAccountingMode``, which needs root).
- ``nvmlDeviceGetAccountingBufferSize(device, *size)``: how many processes the circular buffer
  holds; ``nvmlDeviceGetAccountingPids(device, *count, *pids)``: the processes that can be
  queried, running or terminated (INSUFFICIENT_SIZE with the needed count when ``*count`` is
  too small); both NOT_SUPPORTED while accounting mode is off.
- ``nvmlDeviceGetAccountingStats(device, pid, *stats)`` fills ``nvmlAccountingStats_t``:
  ``gpuUtilization`` and ``memoryUtilization`` (% over the process's lifetime), ``maxMemoryUsage``
  (bytes, NOT_AVAILABLE where process memory is not reported), ``time`` (ms the compute context
  was active: **0 while the process runs**, its run time after it ended), ``startTime`` (µs since
  the epoch), ``isRunning``. NOT_FOUND for a pid not in the buffer. "In case of pid collision
  stats of only the latest process will be reported": only the newest process of a pid is
  listed and answered.

The buffer is the device's processes that have started by now (their windows), newest
``buffer_size`` by start time. Lifetime utilisation is the process's scenario utilisation at
the time of the call (or of its end); its maximum memory is the upper bound of its memory
reading (or the reading at that time, for an unbounded ramp). A MIG-enabled GPU and MIG
handles answer NOT_SUPPORTED (accounting is among the calls the NVML reference lists as
unsupported with MIG).
"""

from __future__ import annotations

import math
import struct
from typing import TYPE_CHECKING

from nvmlsim import codes
from nvmlsim.memio import NOT_AVAILABLE_U64, get_u32, put_u32, view
from nvmlsim.model.values import bounds, evaluate
from nvmlsim.symbols.base import U32, Call, P, Symbol
from nvmlsim.world import DeviceState, ProcState

if TYPE_CHECKING:
    from nvmlsim.driver import SimDriver

__all__ = ["SYMBOLS", "ACCOUNTING_STATS"]

# nvmlAccountingStats_t: gpuUtilization, memoryUtilization u32; maxMemoryUsage, time, startTime
# u64; isRunning u32; reserved[5] u32 (56 bytes).
ACCOUNTING_STATS = struct.Struct("<IIQQQI20x")
_ENABLED, _DISABLED = 1, 0


def _mode(dev: DeviceState) -> str:
    spec = dev.spec.accounting
    if spec is None or dev.mig_enabled:
        return "unsupported"
    return spec.mode


def _buffer(drv: SimDriver, dev: DeviceState, now_us: int) -> dict[int, ProcState]:
    """Return the newest process of each pid among the newest ``buffer_size`` started by now."""
    version = drv.world.version
    hit = dev.accounting_cache  # one build per device, instant and world version
    if hit is not None and hit[0] == version and hit[1] == now_us:
        return hit[2]
    spec = dev.spec.accounting
    assert spec is not None
    started = sorted((p for p in dev.processes if p.start_us <= now_us), key=_started_us)
    newest: dict[int, ProcState] = {}
    for p in started[-spec.buffer_size :]:
        newest[p.pid] = p  # later starts replace earlier ones: pid collision
    dev.accounting_cache = (version, now_us, newest)
    return newest


def _started_us(p: ProcState) -> int:
    return round(p.start_time_unix * 1_000_000)


def _get_mode(drv: SimDriver, call: Call, target: DeviceState, h: int, out: int) -> int:
    if not out:
        return codes.INVALID_ARGUMENT
    mode = _mode(target)
    if mode == "unsupported":
        return codes.NOT_SUPPORTED
    put_u32(out, _ENABLED if mode == "enabled" else _DISABLED)
    return codes.SUCCESS


def _buffer_size(drv: SimDriver, call: Call, target: DeviceState, h: int, out: int) -> int:
    if not out:
        return codes.INVALID_ARGUMENT
    if _mode(target) != "enabled":
        return codes.NOT_SUPPORTED
    spec = target.spec.accounting
    assert spec is not None
    put_u32(out, spec.buffer_size)
    return codes.SUCCESS


def _pids(drv: SimDriver, call: Call, target: DeviceState, h: int, p_count: int, buf: int) -> int:
    if not p_count:
        return codes.INVALID_ARGUMENT
    if _mode(target) != "enabled":
        return codes.NOT_SUPPORTED
    procs = list(_buffer(drv, target, call.now_us).values())
    n = len(procs)
    if n > get_u32(p_count) or (n and not buf):
        put_u32(p_count, n)
        return codes.INSUFFICIENT_SIZE
    if n:
        memory = view(buf, 4 * n)
        struct.pack_into(f"<{n}I", memory, 0, *(p.pid for p in procs))
    put_u32(p_count, n)
    return codes.SUCCESS


def _stats(drv: SimDriver, call: Call, target: DeviceState, h: int, pid: int, out: int) -> int:
    if not out:
        return codes.INVALID_ARGUMENT
    if _mode(target) != "enabled":
        return codes.NOT_SUPPORTED
    p = _buffer(drv, target, call.now_us).get(pid)
    if p is None:
        return codes.NOT_FOUND
    running = p.alive(call.now_us)
    at_us = call.now_us if running else p.end_us
    t, cycle = drv.world.timeline.seconds(at_us), drv.world.timeline.cycle(at_us)
    sm = mem = 0
    if p.utilization is not None:
        sm = min(100, max(0, round(evaluate(p.utilization.sm, t, cycle))))
        mem = min(100, max(0, round(evaluate(p.utilization.mem, t, cycle))))
    if p.used_memory is None:
        max_memory = NOT_AVAILABLE_U64
    else:
        high = bounds(p.used_memory)[1]
        max_memory = round(high if math.isfinite(high) else evaluate(p.used_memory, t, cycle))
    start = _started_us(p)
    run_ms = 0 if running else max(0, (p.end_us - start) // 1000)
    ACCOUNTING_STATS.pack_into(
        view(out, ACCOUNTING_STATS.size), 0, sm, mem, max_memory, run_ms, start, int(running)
    )
    return codes.SUCCESS


SYMBOLS = [
    Symbol("nvmlDeviceGetAccountingMode", (P, P), _get_mode),
    Symbol("nvmlDeviceGetAccountingBufferSize", (P, P), _buffer_size),
    Symbol("nvmlDeviceGetAccountingPids", (P, P, P), _pids),
    Symbol("nvmlDeviceGetAccountingStats", (P, U32, P), _stats, arg=1),
]
