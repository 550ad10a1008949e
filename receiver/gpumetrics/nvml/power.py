"""Board power (W), enforced power limit (W) and total energy (J) of a physical GPU.

- ``hw.power{hw.type=gpu}``: every sample of the TOTAL_POWER buffer becomes its own point at its
  own time; when the buffer is empty or unsupported, one ``nvmlDeviceGetPowerUsage`` reading at
  the tick's time (mW → W).
- ``nvidia.gpu.power.limit``: ``nvmlDeviceGetEnforcedPowerLimit`` (mW → W), the limit the driver
  actually enforces (all limiters combined). Where the driver does not report it, the
  management limit set on the board (``nvmlDeviceGetPowerManagementLimit``), with one INFO line
  saying so. Neither supported (GB10, vGPU) → absent, never 0.
- ``nvidia.gpu.power.limit.constraint{nvidia.gpu.power.limit.type}``: the board's default
  management limit (``nvmlDeviceGetPowerManagementDefaultLimit``) and the range a management
  limit may be set to (``nvmlDeviceGetPowerManagementLimitConstraints``), board constants read
  once per device and emitted every tick.
- ``hw.energy{hw.type=gpu}``: ``nvmlDeviceGetTotalEnergyConsumption`` (mJ since driver load → J)
  as a cumulative monotonic Sum with reset detection (:mod:`gpumetrics.nvml.counters`, F23).
  Unsupported before Volta (F07) → absent, called once.

On a MIG-enabled GPU these are read on the parent only; MIG instances never repeat them.
"""

from __future__ import annotations

import pynvml

from gpumetrics.metrics import names
from gpumetrics.metrics.buffer import Attributes
from gpumetrics.nvml import convert
from gpumetrics.nvml.context import Tick
from gpumetrics.nvml.counters import CounterTracker
from gpumetrics.nvml.device import Device
from gpumetrics.nvml.samples import TOTAL_POWER

_GPU = ((names.AttrHwType, names.HwTypeGPU),)


def collect_power(dev: Device, tick: Tick) -> None:
    """Add ``hw.power`` points: power samples, or one ``nvmlDeviceGetPowerUsage`` reading."""
    if not tick.wants(names.MetricPower):
        return
    attrs = dev.attrs + _GPU
    samples = tick.samples(dev, TOTAL_POWER)
    if samples:
        for s in samples:
            _add_w(
                dev,
                tick,
                "nvmlDeviceGetSamples",
                names.MetricPower,
                s.value,
                s.time_unix_nano,
                attrs,
            )
        return
    mw = dev.calls.get(
        "nvmlDeviceGetPowerUsage",
        "nvmlDeviceGetPowerUsage",
        pynvml.nvmlDeviceGetPowerUsage,
        dev.handle,
    )
    if mw is not None:
        _add_w(dev, tick, "nvmlDeviceGetPowerUsage", names.MetricPower, mw, tick.now_ns, attrs)


ENFORCED = "nvmlDeviceGetEnforcedPowerLimit"
MANAGEMENT = "nvmlDeviceGetPowerManagementLimit"
DEFAULT = "nvmlDeviceGetPowerManagementDefaultLimit"
CONSTRAINTS = "nvmlDeviceGetPowerManagementLimitConstraints"


def collect_power_limit(dev: Device, tick: Tick) -> None:
    """Add the ``nvidia.gpu.power.limit`` point (enforced limit, else the management limit)."""
    if not tick.wants(names.MetricGPUPowerLimit):
        return
    c = dev.calls
    function, mw = ENFORCED, None
    if c.enabled(ENFORCED):
        mw = c.get(ENFORCED, ENFORCED, pynvml.nvmlDeviceGetEnforcedPowerLimit, dev.handle)
        if mw is None and c.enabled(ENFORCED):
            return  # a transient failure: no fallback to a different quantity
    if mw is None and c.enabled(MANAGEMENT):
        if not dev.state.get("power_limit_fallback"):
            dev.state["power_limit_fallback"] = True
            c.note(ENFORCED, f"not supported; reporting the management limit ({MANAGEMENT})")
        function = MANAGEMENT
        mw = c.get(MANAGEMENT, MANAGEMENT, pynvml.nvmlDeviceGetPowerManagementLimit, dev.handle)
    if mw is not None:
        _add_w(dev, tick, function, names.MetricGPUPowerLimit, mw, tick.now_ns, dev.attrs)


def _read_constraints(dev: Device) -> dict[str, int] | None:
    """Return the board's limit constants, or None while a transient failure keeps them unknown."""
    c = dev.calls
    known: dict[str, int] = {}
    default = c.get(DEFAULT, DEFAULT, pynvml.nvmlDeviceGetPowerManagementDefaultLimit, dev.handle)
    if default is not None:
        known["default"] = int(default)
    bounds = c.get(
        CONSTRAINTS, CONSTRAINTS, pynvml.nvmlDeviceGetPowerManagementLimitConstraints, dev.handle
    )
    if bounds is not None:
        known["min"], known["max"] = int(bounds[0]), int(bounds[1])
    settled = (default is not None or not c.enabled(DEFAULT)) and (
        bounds is not None or not c.enabled(CONSTRAINTS)
    )
    return known if settled else None


def collect_power_constraints(dev: Device, tick: Tick) -> None:
    """Add the ``nvidia.gpu.power.limit.constraint`` points (read once, emitted every tick)."""
    if not tick.wants(names.MetricGPUPowerLimitConstraint):
        return
    known = dev.state.get("power_constraints")
    if known is None:
        known = _read_constraints(dev)
        if known is None:
            return
        dev.state["power_constraints"] = known
    for label, mw in known.items():
        function = DEFAULT if label == "default" else CONSTRAINTS
        attrs = dev.attrs + ((names.AttrPowerLimitType, label),)
        _add_w(dev, tick, function, names.MetricGPUPowerLimitConstraint, mw, tick.now_ns, attrs)


def collect_energy(dev: Device, tick: Tick) -> int | None:
    """Add the ``hw.energy`` point with its series start time (reset → new start, F23).

    Returns:
        The reading (mJ since the driver was loaded), for the per-process energy split
        (:mod:`gpumetrics.nvml.energy`); None when it was not read or was the sentinel.

    """
    if not tick.wants(
        names.MetricEnergy, names.MetricProcessEnergy, names.MetricGPUEnergyUnattributed
    ):
        return None
    mj = dev.calls.get(
        "nvmlDeviceGetTotalEnergyConsumption",
        "nvmlDeviceGetTotalEnergyConsumption",
        pynvml.nvmlDeviceGetTotalEnergyConsumption,
        dev.handle,
    )
    if mj is None:
        return None
    joules, reason = convert.mj_to_j(int(mj))
    if joules is None:
        dev.calls.drop("nvmlDeviceGetTotalEnergyConsumption", reason or convert.SENTINEL)
        return None
    tracker = dev.state.get("energy")
    if tracker is None:
        tracker = dev.state["energy"] = CounterTracker(f"GPU {dev.uuid} energy", tick.ctx.log)
    start = tracker.observe(int(mj), tick.now_ns)
    if tick.wants(names.MetricEnergy):
        tick.points.add(names.MetricEnergy, joules, tick.now_ns, dev.attrs + _GPU, start)
    return int(mj)


def _add_w(
    dev: Device,
    tick: Tick,
    function: str,
    metric: str,
    mw: int | float,
    time_ns: int,
    attrs: Attributes,
) -> None:
    watts, reason = convert.mw_to_w(mw)
    if watts is None:
        dev.calls.drop(function, reason or convert.SENTINEL)
        return
    tick.points.add(metric, watts, time_ns, attrs)
