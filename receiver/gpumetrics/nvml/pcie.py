"""PCIe throughput (``nvidia.gpu.pcie.throughput``, By/s) of a physical GPU, on a slow cadence.

``nvmlDeviceGetPcieThroughput(handle, counter)`` with ``NVML_PCIE_UTIL_TX_BYTES`` (0, transmit)
and ``NVML_PCIE_UTIL_RX_BYTES`` (1, receive), each a u32 in KB/s measured over a 20 ms window
*inside the call* (NVML API reference, ``nvmlDeviceGetPcieThroughput``), so a read costs about
40 ms per GPU. It is read every
``pcie_interval_s`` (default 10 s), not every tick. ``NVML_PCIE_UTIL_COUNT`` (2) is the number
of counters, never queried (F25). KB is 1024 bytes (:data:`gpumetrics.nvml.convert.PCIE_KB`).

Support is a property of the device, not of a direction: when the transmit counter answers
NOT_SUPPORTED (vGPU guests, GB10), the receive counter is not tried (F09: one call in total).
"""

from __future__ import annotations

import pynvml

from gpumetrics.metrics import names
from gpumetrics.nvml import convert
from gpumetrics.nvml.context import Tick
from gpumetrics.nvml.device import Device

FUNCTION = "nvmlDeviceGetPcieThroughput"
DIRECTIONS: tuple[tuple[int, str], ...] = (
    (pynvml.NVML_PCIE_UTIL_TX_BYTES, names.DirectionTransmit),
    (pynvml.NVML_PCIE_UTIL_RX_BYTES, names.DirectionReceive),
)
"""The two counters and their ``network.io.direction`` (never ``NVML_PCIE_UTIL_COUNT``)."""


def due(dev: Device, tick: Tick) -> bool:
    """Return True when PCIe throughput is due in this tick (``pcie_interval_s`` cadence)."""
    interval = tick.ctx.settings.pcie_interval_s
    if not interval or not tick.wants(names.MetricGPUPCIeThroughput):
        return False
    last = dev.state.get("pcie_ns")
    return last is None or tick.mono_ns - last >= round(interval * 1e9)


def collect_pcie(dev: Device, tick: Tick) -> None:
    """Add transmit and receive points when due."""
    if not due(dev, tick):
        return
    dev.state["pcie_ns"] = tick.mono_ns
    for counter, direction in DIRECTIONS:
        kbps = dev.calls.get(
            FUNCTION, FUNCTION, pynvml.nvmlDeviceGetPcieThroughput, dev.handle, counter
        )
        if kbps is None:
            continue
        rate, reason = convert.pcie_kbps_to_bytes_per_s(int(kbps))
        if rate is None:
            dev.calls.drop(FUNCTION, reason or convert.SENTINEL, detail=direction)
            continue
        attrs = dev.attrs + ((names.AttrNetworkIODirection, direction),)
        tick.points.add(names.MetricGPUPCIeThroughput, rate, tick.now_ns, attrs)
