"""Fan speeds (``hw.fan.speed_ratio``), one series per fan of a GPU.

``nvmlDeviceGetNumFans`` (a board constant, read once) and ``nvmlDeviceGetFanSpeed_v2(fan)``
every tick: percent of the fan's maximum speed, which NVML says "may exceed 100%"
(NVML API reference, ``nvmlDeviceGetFanSpeed_v2``), so values up to 2.0 are kept (semantic
conventions ``hw.fan.speed_ratio``: a fraction of the maximum speed). Each fan is a component
of its GPU: ``hw.id`` = ``<GPU UUID>:fan:<n>``, ``hw.name`` = ``gpu<i>/fan<n>``, ``hw.parent``
= the GPU's UUID. Passively cooled boards (H100/A100 SXM, most data-centre GPUs) answer
NOT_SUPPORTED: no point, one call, one INFO line.
"""

from __future__ import annotations

import pynvml

from gpumetrics.metrics import names
from gpumetrics.nvml import convert
from gpumetrics.nvml.context import Tick
from gpumetrics.nvml.device import Device, component_attrs

COUNT = "nvmlDeviceGetNumFans"
SPEED = "nvmlDeviceGetFanSpeed_v2"
MAX_FANS = 32
"""A fan count above this is garbage."""


def collect_fans(dev: Device, tick: Tick) -> None:
    """Add one ``hw.fan.speed_ratio`` point per fan that answers."""
    if not tick.wants(names.MetricFanSpeedRatio):
        return
    c = dev.calls
    fans = dev.state.get("fans")
    if fans is None:
        count = c.get(COUNT, COUNT, pynvml.nvmlDeviceGetNumFans, dev.handle)
        if count is None:
            if not c.enabled(COUNT):
                dev.state["fans"] = 0
            return
        fans = dev.state["fans"] = int(count) if 0 <= int(count) <= MAX_FANS else 0
    for fan in range(fans):
        percent = c.get(SPEED, SPEED, pynvml.nvmlDeviceGetFanSpeed_v2, dev.handle, fan)
        if percent is None:
            if not c.enabled(SPEED):
                return
            continue
        ratio, reason = convert.fan_percent_to_ratio(int(percent))
        if ratio is None:
            c.drop(SPEED, reason or convert.OUT_OF_RANGE, detail=f"fan {fan}: {percent}")
            continue
        attrs = component_attrs(dev, "fan", fan)
        tick.points.add(names.MetricFanSpeedRatio, ratio, tick.now_ns, attrs)
