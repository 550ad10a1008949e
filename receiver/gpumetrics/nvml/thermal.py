"""GPU temperature (``hw.temperature``, Cel) of a physical GPU.

``nvmlDeviceGetTemperatureV(handle, NVML_TEMPERATURE_GPU)`` (versioned struct, signed °C) where
the driver exports it (~R570+), else the deprecated ``nvmlDeviceGetTemperature`` (unsigned °C),
chosen from the symbols probed at init with one DEBUG log (F06). NOT_SUPPORTED (vGPU guests,
F09) disables temperature for the device: the old call is not tried, since it reads the same
sensor. Readings outside −100…200 °C are dropped (an unsigned wrap-around is garbage).

``hw.temperature`` carries no ``hw.type`` (semantic conventions: it describes a sensor).
"""

from __future__ import annotations

import pynvml

from gpumetrics.metrics import names
from gpumetrics.nvml import convert
from gpumetrics.nvml.context import Tick
from gpumetrics.nvml.device import Device
from gpumetrics.nvml.query import ErrorKind

NEW = "nvmlDeviceGetTemperatureV"
OLD = "nvmlDeviceGetTemperature"


def collect_temperature(dev: Device, tick: Tick) -> None:
    """Add the ``hw.temperature`` point."""
    if not tick.wants(names.MetricTemperature):
        return
    c = dev.calls
    new_fn = getattr(pynvml, NEW, None)
    if c.enabled(NEW) and new_fn is not None:
        function, value = NEW, c.get(NEW, NEW, new_fn, dev.handle, pynvml.NVML_TEMPERATURE_GPU)
        if value is None and c.disabled().get(NEW) is ErrorKind.UNSUPPORTED:
            c.disable(OLD, ErrorKind.UNSUPPORTED)
    else:
        if not dev.state.get("temperature_noted"):
            dev.state["temperature_noted"] = True
            tick.ctx.log.debug("GPU %s: %s missing; using %s", dev.uuid, NEW, OLD)
        function = OLD
        value = c.get(
            OLD, OLD, pynvml.nvmlDeviceGetTemperature, dev.handle, pynvml.NVML_TEMPERATURE_GPU
        )
    if value is None:
        return
    celsius, reason = convert.celsius(int(value))
    if celsius is None:
        c.drop(function, reason or convert.OUT_OF_RANGE, detail=str(value))
        return
    tick.points.add(names.MetricTemperature, celsius, tick.now_ns, dev.attrs)
