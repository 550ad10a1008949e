"""Snapshot readings of a physical GPU: performance state, BAR1 memory, encoder sessions.

One call each per tick (NVML API reference):

- ``nvidia.gpu.performance_state``: ``nvmlDeviceGetPerformanceState``, P0 (maximum
  performance) to P15; ``NVML_PSTATE_UNKNOWN`` (32) gives no point.
- ``nvidia.gpu.bar1.memory.usage`` / ``.limit``: one ``nvmlDeviceGetBAR1MemoryInfo``
  (``bar1Used``, ``bar1Total``, bytes) feeds both, as UpDownCounters starting at the device's
  discovery; ``used > total`` drops the usage.
- ``nvidia.gpu.encoder.sessions`` / ``.fps`` / ``.latency``: one ``nvmlDeviceGetEncoderStats``
  (session count, average FPS, average latency in µs). The averages are over the active
  sessions, so they are emitted only while there is one: with none, the driver's 0 is not an
  average of anything. NOT_SUPPORTED (MIG enabled, GPUs without NVENC on some drivers) gives
  nothing.

On a MIG-enabled GPU these are read on the parent only.
"""

from __future__ import annotations

import pynvml

from gpumetrics.metrics import names
from gpumetrics.nvml import convert
from gpumetrics.nvml.context import Tick
from gpumetrics.nvml.device import Device

PSTATE = "nvmlDeviceGetPerformanceState"
BAR1 = "nvmlDeviceGetBAR1MemoryInfo"
ENCODER = "nvmlDeviceGetEncoderStats"
MAX_PSTATE = 15
"""P-states are 0..15; NVML_PSTATE_UNKNOWN is 32."""


def collect_pstate(dev: Device, tick: Tick) -> None:
    """Add the ``nvidia.gpu.performance_state`` point."""
    if not tick.wants(names.MetricGPUPerformanceState):
        return
    value = dev.calls.get(PSTATE, PSTATE, pynvml.nvmlDeviceGetPerformanceState, dev.handle)
    if value is None:
        return
    if not 0 <= int(value) <= MAX_PSTATE:
        dev.calls.drop(PSTATE, convert.SENTINEL, detail=str(value))
        return
    tick.points.add(names.MetricGPUPerformanceState, int(value), tick.now_ns, dev.attrs)


def collect_bar1(dev: Device, tick: Tick) -> None:
    """Add BAR1 usage and size from one read."""
    want_used = tick.wants(names.MetricGPUBAR1MemoryUsage)
    want_total = tick.wants(names.MetricGPUBAR1MemoryLimit)
    if not (want_used or want_total):
        return
    info = dev.calls.get(BAR1, BAR1, pynvml.nvmlDeviceGetBAR1MemoryInfo, dev.handle)
    if info is None:
        return
    total, why_total = convert.bytes_value(int(info.bar1Total))
    used, why_used = convert.bytes_value(int(info.bar1Used))
    if total is None:
        dev.calls.drop(BAR1, why_total or convert.SENTINEL, detail="total")
    if used is None:
        dev.calls.drop(BAR1, why_used or convert.SENTINEL, detail="used")
    elif total is not None and used > total:
        dev.calls.drop(BAR1, convert.OUT_OF_RANGE, detail=f"used {used} > total {total}")
        used = None
    now, start = tick.now_ns, dev.start_ns
    if total is not None and want_total:
        tick.points.add(names.MetricGPUBAR1MemoryLimit, int(total), now, dev.attrs, start)
    if used is not None and want_used:
        tick.points.add(names.MetricGPUBAR1MemoryUsage, int(used), now, dev.attrs, start)


def collect_encoder_stats(dev: Device, tick: Tick) -> None:
    """Add encoder sessions, and their average FPS and latency while there is a session."""
    if not tick.wants(
        names.MetricGPUEncoderSessions, names.MetricGPUEncoderFPS, names.MetricGPUEncoderLatency
    ):
        return
    stats = dev.calls.get(ENCODER, ENCODER, pynvml.nvmlDeviceGetEncoderStats, dev.handle)
    if stats is None:
        return
    sessions, fps, latency_us = (int(v) for v in stats)
    now = tick.now_ns
    if sessions >= convert.U32_NA:
        dev.calls.drop(ENCODER, convert.SENTINEL, detail="sessionCount")
        return
    if tick.wants(names.MetricGPUEncoderSessions):
        tick.points.add(names.MetricGPUEncoderSessions, sessions, now, dev.attrs, dev.start_ns)
    if sessions == 0:
        return
    if tick.wants(names.MetricGPUEncoderFPS) and fps < convert.U32_NA:
        tick.points.add(names.MetricGPUEncoderFPS, float(fps), now, dev.attrs)
    seconds, reason = convert.us_to_s(latency_us)
    if seconds is None:
        dev.calls.drop(ENCODER, reason or convert.SENTINEL, detail="averageLatency")
    elif tick.wants(names.MetricGPUEncoderLatency):
        tick.points.add(names.MetricGPUEncoderLatency, seconds, now, dev.attrs)
