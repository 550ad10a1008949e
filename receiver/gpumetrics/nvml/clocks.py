"""Clock speeds (``nvidia.gpu.clock.speed``, Hz) and clock-event reasons of a physical GPU.

- ``nvmlDeviceGetClockInfo(handle, type)`` for graphics (0), SM (1), memory (2) and video (3),
  in MHz → Hz. Each domain is its own capability: a domain the device cannot report (memory on
  GB10, F17) is disabled alone and the others continue.
- Clock-event reasons (``nvidia.gpu.clock.event_reason``):
  ``nvmlDeviceGetCurrentClocksEventReasons`` where the driver has it (R535+), else the
  deprecated ``…ClocksThrottleReasons`` (same bitmask, F06), chosen from the symbols probed at
  init; NOT_SUPPORTED from the new call disables both (F30). Every known reason is emitted
  each tick, 1 when its bit is set and 0 otherwise, like ``hw.status``; a set bit the binding
  does not know is passed through as ``bit_<n>`` (value 1) rather than dropped.
"""

from __future__ import annotations

import pynvml

from gpumetrics.metrics import names
from gpumetrics.nvml import convert
from gpumetrics.nvml.context import Tick
from gpumetrics.nvml.device import Device
from gpumetrics.nvml.query import ErrorKind

CLOCK_DOMAINS: tuple[tuple[int, str], ...] = (
    (pynvml.NVML_CLOCK_GRAPHICS, "graphics"),
    (pynvml.NVML_CLOCK_SM, "sm"),
    (pynvml.NVML_CLOCK_MEM, "memory"),
    (pynvml.NVML_CLOCK_VIDEO, "video"),
)
"""``NVML_CLOCK_*`` value → ``nvidia.gpu.clock.domain`` attribute value."""

EVENT_REASONS: tuple[tuple[int, str], ...] = (
    (0x1, "gpu_idle"),
    (0x2, "applications_clocks_setting"),
    (0x4, "sw_power_cap"),
    (0x8, "hw_slowdown"),
    (0x10, "sync_boost"),
    (0x20, "sw_thermal_slowdown"),
    (0x40, "hw_thermal_slowdown"),
    (0x80, "hw_power_brake_slowdown"),
    (0x100, "display_clock_setting"),
)
"""Bits of the clock-event reason mask: ``nvmlClocksEventReason*`` in ``nvml.h``."""

EVENTS = "nvmlDeviceGetCurrentClocksEventReasons"
THROTTLE = "nvmlDeviceGetCurrentClocksThrottleReasons"


def collect_clocks(dev: Device, tick: Tick) -> None:
    """Add one ``nvidia.gpu.clock.speed`` point per readable clock domain."""
    if not tick.wants(names.MetricGPUClockSpeed):
        return
    fn = "nvmlDeviceGetClockInfo"
    for clock, domain in CLOCK_DOMAINS:
        mhz = dev.calls.get(f"{fn}:{clock}", fn, pynvml.nvmlDeviceGetClockInfo, dev.handle, clock)
        if mhz is None:
            continue
        hz, reason = convert.mhz_to_hz(int(mhz))
        if hz is None:
            dev.calls.drop(fn, reason or convert.SENTINEL, detail=domain)
            continue
        attrs = dev.attrs + ((names.AttrClockDomain, domain),)
        tick.points.add(names.MetricGPUClockSpeed, hz, tick.now_ns, attrs)


def event_reason_values(mask: int) -> list[tuple[str, int]]:
    """``(reason, 0|1)`` for every known reason, then ``(bit_<n>, 1)`` for unknown set bits."""
    out = [(name, int(bool(mask & bit))) for bit, name in EVENT_REASONS]
    known = 0
    for bit, _ in EVENT_REASONS:
        known |= bit
    rest = mask & ~known
    n = 0
    while rest:
        if rest & 1:
            out.append((f"bit_{n}", 1))
        rest >>= 1
        n += 1
    return out


def collect_event_reasons(dev: Device, tick: Tick) -> None:
    """Add the clock-event reason points (new call, or the deprecated one when it is missing)."""
    if not tick.wants(names.MetricGPUClockEventReason):
        return
    c = dev.calls
    if c.enabled(EVENTS):
        function, fn = EVENTS, getattr(pynvml, EVENTS, None)
    else:
        function, fn = THROTTLE, getattr(pynvml, THROTTLE, None)
    if fn is None or not c.enabled(function):
        return
    if function == THROTTLE and not dev.state.get("throttle_noted"):
        dev.state["throttle_noted"] = True
        tick.ctx.log.debug("GPU %s: %s missing; using %s", dev.uuid, EVENTS, THROTTLE)
    mask = c.get(function, function, fn, dev.handle)
    if mask is None:
        if function == EVENTS and c.disabled().get(EVENTS) is ErrorKind.UNSUPPORTED:
            c.disable(THROTTLE, ErrorKind.UNSUPPORTED)  # the same bitmask: it would say the same
        return
    for reason, value in event_reason_values(int(mask)):
        attrs = dev.attrs + ((names.AttrClockEventReason, reason),)
        tick.points.add(names.MetricGPUClockEventReason, value, tick.now_ns, attrs)
